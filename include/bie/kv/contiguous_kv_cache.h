// ContiguousKvCache: the foundation's simple cache — one sequence, FP16 K and V in contiguous
// arrays sized for max_tokens up front ([n_layer, max_tokens, kv_dim] each). Replaced by the
// paged cache for serving; kept as the reference the paged cache is tested against.
#pragma once

#include <cstdint>
#include <vector>

#include "bie/kv/kv_cache.h"

namespace bie {

class ContiguousKvCache final : public KvCache {
 public:
  ContiguousKvCache(const KvGeometry& geometry, int64_t max_tokens);

  [[nodiscard]] const KvGeometry& geometry() const override { return geo_; }
  [[nodiscard]] int64_t n_tokens() const override { return n_tokens_; }
  [[nodiscard]] int64_t capacity() const override { return max_tokens_; }
  [[nodiscard]] bool can_append(int64_t n) const override;
  [[nodiscard]] Status append(int64_t n) override;
  void store(int il, int64_t pos0, int64_t n, const float* k, const float* v) override;
  void attend(int il, int64_t pos0, int64_t n, const float* q, int n_head, float scale, float* out,
              Backend& backend, int64_t window = 0) override;
  [[nodiscard]] Status truncate(int64_t n) override;

  // What the cache holds in memory; equals planner::contiguous_kv_bytes(f16, f16, max_tokens, 1)
  // (tests/test_kv_accounting.cpp holds the two together).
  [[nodiscard]] uint64_t allocated_bytes() const {
    return (k_.size() + v_.size()) * sizeof(uint16_t);
  }

 private:
  KvGeometry geo_;
  int64_t max_tokens_;
  int64_t n_tokens_ = 0;
  std::vector<uint16_t> k_;     // [n_layer, max_tokens, kv_dim] fp16
  std::vector<uint16_t> v_;     // [n_layer, max_tokens, kv_dim] fp16
  std::vector<float> scratch_;  // per-thread score rows
};

}  // namespace bie
