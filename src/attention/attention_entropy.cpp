#include "bie/attention/attention_entropy.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <vector>

#include "bie/backend/kv_format_rotate.h"

namespace bie::attention {

namespace {

// A block of the quantised body: K or V stored in a format other than f16.
bool quantised(const kv::KvBlockView& bv) {
  return bv.tk->type != planner::KvType::kF16 || bv.tv->type != planner::KvType::kF16;
}

}  // namespace

void attention_entropy(const kv::HostKvBlocks& blocks, const KvGeometry& g, int64_t pos,
                       const float* q, int n_head, float scale, int64_t window, HeadEntropy* out) {
  const int B = blocks.block_size;
  const int d = g.head_dim;
  const int group = n_head / g.n_head_kv;
  assert(n_head % g.n_head_kv == 0 && static_cast<int64_t>(blocks.blocks.size()) * B > pos);
  const int64_t first = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
  std::vector<float> qh(static_cast<size_t>(d));
  std::vector<float> s(static_cast<size_t>(pos + 1 - first));
  for (int h = 0; h < n_head; ++h) {
    std::copy(q + static_cast<int64_t>(h) * d, q + static_cast<int64_t>(h + 1) * d, qh.begin());
    if (blocks.rotate_keys) kv::hadamard_rotate(qh.data(), d);
    const int kv_head = h / group;
    for (int64_t j = first; j <= pos;) {  // one block's run of visible keys per dot call
      const kv::KvBlockView& bv = blocks.blocks[static_cast<size_t>(j / B)];
      const int t0 = static_cast<int>(j % B);
      const int n = static_cast<int>(std::min<int64_t>(B - t0, pos + 1 - j));
      const uint8_t* tile = bv.k + static_cast<size_t>(kv_head) * bv.k_tile_bytes;
      bv.tk->dot(bv.gk, qh.data(), tile, t0, n, s.data() + (j - first));
      j += n;
    }
    double m = -INFINITY;
    for (const float x : s) m = std::max(m, static_cast<double>(x) * scale);
    // Over the body keys: Z_b = sum e^(x_j), H_b = ln Z_b - sum e^(x_j) x_j / Z_b, x_j = s_j - m.
    double z = 0, zb = 0, zbx = 0;
    int64_t nb = 0;
    for (int64_t j = first; j <= pos; ++j) {
      const double x = static_cast<double>(s[static_cast<size_t>(j - first)]) * scale - m;
      const double e = std::exp(x);
      z += e;
      if (quantised(blocks.blocks[static_cast<size_t>(j / B)])) {
        zb += e;
        zbx += e * x;
        ++nb;
      }
    }
    HeadEntropy& o = out[h];
    o.body_mass = static_cast<float>(zb / z);
    o.body_entropy = 1.0f;
    if (nb > 1 && zb > 0) {
      const double hb = (std::log(zb) - zbx / zb) / std::log(static_cast<double>(nb));
      o.body_entropy = static_cast<float>(std::clamp(hb, 0.0, 1.0));
    }
  }
}

double entropy_proxy(std::span<const HeadEntropy> heads) {
  double mass = 0, weighted = 0;
  for (const HeadEntropy& h : heads) {
    mass += h.body_mass;
    weighted += static_cast<double>(h.body_mass) * h.body_entropy;
  }
  return mass > 0 ? weighted / mass : 1.0;
}

}  // namespace bie::attention
