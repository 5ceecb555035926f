#include "bie/engine/synthetic_kv.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace bie {

SyntheticKv::SyntheticKv(const KvGeometry& g, const SyntheticKvOptions& o) : g_(g), rng_(o.seed) {
  const size_t kv_dim = static_cast<size_t>(g.kv_dim());
  constexpr size_t kTable = size_t{1} << 20;
  table_.resize(kTable + kv_dim);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : table_) x = normal(rng_);
  const auto n_out = static_cast<size_t>(std::clamp(o.outlier_channels, 0, g.head_dim));
  std::uniform_int_distribution<int> channel(0, g.head_dim - 1);
  std::uniform_real_distribution<float> factor(o.outlier_min, o.outlier_max);
  for (int il = 0; il < g.n_layer; ++il) {
    for (int h = 0; h < g.n_head_kv; ++h) {
      for (size_t c = 0; c < n_out; ++c) {
        outliers_.emplace_back(static_cast<size_t>(h * g.head_dim + channel(rng_)), factor(rng_));
      }
    }
  }
  per_layer_ = static_cast<size_t>(g.n_head_kv) * n_out;
}

void SyntheticKv::store(KvCache& kv, int64_t pos0, int64_t n) {
  const size_t kv_dim = static_cast<size_t>(g_.kv_dim());
  std::uniform_int_distribution<size_t> offset(0, table_.size() - kv_dim - 1);
  k_.resize(static_cast<size_t>(n) * kv_dim);
  v_.resize(k_.size());
  for (int il = 0; il < g_.n_layer; ++il) {
    for (int64_t t = 0; t < n; ++t) {
      float* kr = k_.data() + static_cast<size_t>(t) * kv_dim;
      std::copy_n(table_.data() + offset(rng_), kv_dim, kr);
      std::copy_n(table_.data() + offset(rng_), kv_dim,
                  v_.data() + static_cast<size_t>(t) * kv_dim);
      for (size_t j = 0; j < per_layer_; ++j) {
        const auto& [c, f] = outliers_[static_cast<size_t>(il) * per_layer_ + j];
        kr[c] *= f;
      }
    }
    kv.store(il, pos0, n, k_.data(), v_.data());
  }
}

Status fill_kv_synthetic(PagedKvCache& kv, int64_t n_tokens, const SyntheticKvOptions& o) {
  if (n_tokens < 0 || o.chunk < 1) return Error{"fill_kv_synthetic: bad token count or chunk"};
  SyntheticKv rows(kv.geometry(), o);
  int64_t done = 0;
  while (done < n_tokens) {
    const int64_t n = std::min(o.chunk, n_tokens - done);
    const int64_t pos0 = kv.n_tokens();
    if (Status s = kv.append(n); !s) {
      return Error{fmt::format("synthetic fill stopped at {} of {} tokens: {}", pos0,
                               pos0 - done + n_tokens, s.error())};
    }
    rows.store(kv, pos0, n);
    // What attend() does after the last layer of a real forward pass.
    if (Status s = kv.migrate_window_exits(); !s) return s;
    done += n;
    if (o.progress) o.progress(done, n_tokens);
  }
  return {};
}

}  // namespace bie
