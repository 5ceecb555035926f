#include "bie/engine/synthetic_kv.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace bie {

Status fill_kv_synthetic(PagedKvCache& kv, int64_t n_tokens, const SyntheticKvOptions& o) {
  if (n_tokens < 0 || o.chunk < 1) return Error{"fill_kv_synthetic: bad token count or chunk"};
  const KvGeometry& g = kv.geometry();
  const size_t kv_dim = static_cast<size_t>(g.kv_dim());
  std::mt19937_64 rng(o.seed);

  // Rows are windows of a table of standard normal samples at random offsets: Gaussian entries
  // at memcpy speed (a 64k-token fill of an 8B model writes ~4e9 values).
  constexpr size_t kTable = size_t{1} << 20;
  std::vector<float> table(kTable + kv_dim);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : table) x = normal(rng);
  std::uniform_int_distribution<size_t> offset(0, kTable - 1);

  // Per layer and KV head: which key channels are outliers and by how much.
  const auto n_out = static_cast<size_t>(std::clamp(o.outlier_channels, 0, g.head_dim));
  std::uniform_int_distribution<int> channel(0, g.head_dim - 1);
  std::uniform_real_distribution<float> factor(o.outlier_min, o.outlier_max);
  std::vector<std::pair<size_t, float>> outliers;  // [n_layer][n_head_kv][n_out] (index, scale)
  for (int il = 0; il < g.n_layer; ++il) {
    for (int h = 0; h < g.n_head_kv; ++h) {
      for (size_t c = 0; c < n_out; ++c) {
        outliers.emplace_back(static_cast<size_t>(h * g.head_dim + channel(rng)), factor(rng));
      }
    }
  }
  const size_t per_layer = static_cast<size_t>(g.n_head_kv) * n_out;

  std::vector<float> k, v;  // [chunk, kv_dim]
  int64_t done = 0;
  while (done < n_tokens) {
    const int64_t n = std::min(o.chunk, n_tokens - done);
    const int64_t pos0 = kv.n_tokens();
    if (Status s = kv.append(n); !s) {
      return Error{fmt::format("synthetic fill stopped at {} of {} tokens: {}", pos0,
                               pos0 - done + n_tokens, s.error())};
    }
    k.resize(static_cast<size_t>(n) * kv_dim);
    v.resize(k.size());
    for (int il = 0; il < g.n_layer; ++il) {
      for (int64_t t = 0; t < n; ++t) {
        float* kr = k.data() + static_cast<size_t>(t) * kv_dim;
        std::copy_n(table.data() + offset(rng), kv_dim, kr);
        std::copy_n(table.data() + offset(rng), kv_dim, v.data() + static_cast<size_t>(t) * kv_dim);
        for (size_t j = 0; j < per_layer; ++j) {
          const auto& [c, f] = outliers[static_cast<size_t>(il) * per_layer + j];
          kr[c] *= f;
        }
      }
      kv.store(il, pos0, n, k.data(), v.data());
    }
    // What attend() does after the last layer of a real forward pass.
    if (Status s = kv.migrate_window_exits(); !s) return s;
    done += n;
    if (o.progress) o.progress(done, n_tokens);
  }
  return {};
}

}  // namespace bie
