#include "bie/attention/paged_attention.h"

#include <algorithm>
#include <cassert>

#include "bie/attention/dense_attention.h"
#include "bie/backend/cpu_features.h"
#include "bie/quant/fp16.h"

namespace bie::attention {

void f16_dot_dense_order_avx2(int head_dim, const float* q, const uint8_t* tile, int n,
                              float* scores);

namespace {
inline float round_fp16(float x) {
  return quant::fp16_to_fp32(quant::fp32_to_fp16(x));
}
}  // namespace

void attend_paged_group(const PagedAttnArgs& a) {
  assert(a.n_kv_tokens >= 1 && a.head_dim <= 512);
  const int d = a.head_dim;
  const int B = a.block_size;
  const int64_t n = a.n_kv_tokens;
  const int64_t nb = (n + B - 1) / B;
  const bool dense_order = has_avx2() && d % 8 == 0;
  for (int g = 0; g < a.group; ++g) {
    for (int c = 0; c < d; ++c) a.qr[g * d + c] = round_fp16(a.q[g * d + c]);
  }
  // Scores: each K tile once, for all query heads of the group.
  for (int64_t b = 0; b < nb; ++b) {
    const PagedBlockView& bv = a.blocks[b];
    const int rows = static_cast<int>(std::min<int64_t>(B, n - b * B));
    const uint8_t* tile = bv.k + static_cast<size_t>(a.kv_head) * bv.k_tile_bytes;
    for (int g = 0; g < a.group; ++g) {
      const float* q = (bv.k_f16 ? a.qr : a.q) + static_cast<size_t>(g) * d;
      if (bv.k_f16 && dense_order) {
        // FP16 tiles: dense_attention's summation order (kv::f16_dot sums in two lanes).
        f16_dot_dense_order_avx2(d, q, tile, rows, a.scores + g * n + b * B);
      } else {
        bv.tk->dot(bv.gk, q, tile, 0, rows, a.scores + g * n + b * B);
      }
    }
  }
  for (int g = 0; g < a.group; ++g) {
    float* s = a.scores + g * n;
    for (int64_t j = 0; j < n; ++j) s[j] *= a.scale;
    softmax_inplace(s, n);
    std::fill(a.out + static_cast<size_t>(g) * d, a.out + static_cast<size_t>(g + 1) * d, 0.0f);
  }
  // Values: each V tile once, for all query heads of the group.
  for (int64_t b = 0; b < nb; ++b) {
    const PagedBlockView& bv = a.blocks[b];
    const int rows = static_cast<int>(std::min<int64_t>(B, n - b * B));
    const uint8_t* tile = bv.v + static_cast<size_t>(a.kv_head) * bv.v_tile_bytes;
    for (int g = 0; g < a.group; ++g) {
      const float* s = a.scores + g * n + b * B;
      const float* p = s;
      if (bv.v_f16) {
        for (int j = 0; j < rows; ++j) a.p[j] = round_fp16(s[j]);
        p = a.p;
      }
      bv.tv->axpy(bv.gv, p, tile, 0, rows, a.out + static_cast<size_t>(g) * d);
    }
  }
}

}  // namespace bie::attention
