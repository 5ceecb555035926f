#include "bie/kv/contiguous_kv_cache.h"

#include <fmt/format.h>

#include <algorithm>

#include "bie/attention/dense_attention.h"
#include "bie/backend/thread_pool.h"
#include "bie/planner/kv_bytes.h"
#include "bie/planner/model_geometry.h"
#include "bie/quant/fp16.h"

namespace bie {

ContiguousKvCache::ContiguousKvCache(const KvGeometry& geometry, int64_t max_tokens)
    : geo_(geometry), max_tokens_(max_tokens) {
  // Sized by the planner, the single source of KV byte accounting.
  planner::ModelGeometry g;
  g.n_layer = geo_.n_layer;
  g.layers.assign(static_cast<size_t>(geo_.n_layer),
                  planner::LayerKv{geo_.n_head_kv, geo_.head_dim, geo_.head_dim, 0});
  const uint64_t bytes =
      planner::contiguous_kv_bytes(g, planner::kKvF16, planner::kKvF16, max_tokens_, 1);
  const size_t n = static_cast<size_t>(bytes / 2 / sizeof(uint16_t));  // half K, half V
  k_.assign(n, 0);
  v_.assign(n, 0);
}

bool ContiguousKvCache::can_append(int64_t n) const {
  return n >= 0 && n_tokens_ + n <= max_tokens_;
}

Status ContiguousKvCache::append(int64_t n) {
  if (!can_append(n)) {
    return Error{
        fmt::format("context full: {} tokens held, {} more requested, capacity {} (raise "
                    "--ctx-size)",
                    n_tokens_, n, max_tokens_)};
  }
  n_tokens_ += n;
  return {};
}

void ContiguousKvCache::store(int il, int64_t pos0, int64_t n, const float* k, const float* v) {
  const int64_t kv_dim = geo_.kv_dim();
  const size_t base =
      (static_cast<size_t>(il) * static_cast<size_t>(max_tokens_) + static_cast<size_t>(pos0)) *
      static_cast<size_t>(kv_dim);
  for (int64_t i = 0; i < n * kv_dim; ++i) {
    k_[base + static_cast<size_t>(i)] = quant::fp32_to_fp16(k[i]);
    v_[base + static_cast<size_t>(i)] = quant::fp32_to_fp16(v[i]);
  }
}

void ContiguousKvCache::attend(int il, int64_t pos0, int64_t n, const float* q, int n_head,
                               float scale, float* out, Backend& backend, int64_t window) {
  ThreadPool& pool = backend.host_threads();
  const int hd = geo_.head_dim;
  const int group = n_head / geo_.n_head_kv;
  const int64_t kv_dim = geo_.kv_dim();
  const size_t layer_off =
      static_cast<size_t>(il) * static_cast<size_t>(max_tokens_) * static_cast<size_t>(kv_dim);
  const int64_t max_len = pos0 + n;
  scratch_.resize(static_cast<size_t>(pool.size()) * static_cast<size_t>(max_len));
  const int64_t q_stride = static_cast<int64_t>(n_head) * hd;
  pool.parallel_for(n * n_head, [&](int64_t begin, int64_t end, int ith) {
    float* scores = scratch_.data() + static_cast<size_t>(ith) * static_cast<size_t>(max_len);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i = task / n_head;
      const int h = static_cast<int>(task % n_head);
      attention::DenseAttnArgs a;
      a.q = q + i * q_stride;
      a.k = k_.data() + layer_off;
      a.v = v_.data() + layer_off;
      a.kv_stride = kv_dim;
      a.n_kv_tokens = pos0 + i + 1;
      a.kv_first = window > 0 ? std::max<int64_t>(0, a.n_kv_tokens - window) : 0;
      a.head = h;
      a.kv_head = h / group;
      a.head_dim = hd;
      a.scale = scale;
      a.out = out + i * q_stride + static_cast<int64_t>(h) * hd;
      a.scores = scores;
      attention::attend_one_head(a);
    }
  });
}

Status ContiguousKvCache::truncate(int64_t n) {
  if (n < n_tokens_) n_tokens_ = std::max<int64_t>(0, n);
  return {};
}

}  // namespace bie
