// Depth without prefill: fills a paged KV cache to a depth with synthetic keys and values of
// realistic statistics (keys Gaussian with a few persistent outlier channels per head, 10-50x
// larger; values Gaussian), written chunk by chunk through the cache's append/store path so the
// FP16 sink/window routing and the re-quantisation of blocks leaving the window happen exactly as
// after a real prefill. For memory and speed measurements (an 8B prefill to 64k takes hours on a
// CPU); attention over such a cache is meaningless for quality. Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "bie/common/result.h"
#include "bie/kv/paged_kv_cache.h"

namespace bie {

struct SyntheticKvOptions {
  uint64_t seed = 1;
  int outlier_channels = 4;   // per KV head, the same channels for every token
  float outlier_min = 10.0f;  // outlier channels are scaled by a factor in [min, max]
  float outlier_max = 50.0f;
  int64_t chunk = 512;  // tokens appended and stored per step
  // Called after each chunk with tokens filled so far and the target.
  std::function<void(int64_t done, int64_t total)> progress;
};

// The synthetic rows: a table of standard normal samples read at random offsets (Gaussian rows
// at memcpy speed: a 64k-token fill of an 8B model writes ~4e9 values), and per layer and KV head
// the key channels that are outliers and their factors, drawn once from the seed.
class SyntheticKv {
 public:
  SyntheticKv(const KvGeometry& g, const SyntheticKvOptions& opts);
  // Stores synthetic K/V for positions [pos0, pos0 + n) of every layer of kv (positions the
  // cache has already appended; KvCache::store).
  void store(KvCache& kv, int64_t pos0, int64_t n);

 private:
  KvGeometry g_;
  std::mt19937_64 rng_;
  std::vector<float> table_;
  std::vector<std::pair<size_t, float>> outliers_;  // [n_layer][n_head_kv][n_out] (index, scale)
  size_t per_layer_ = 0;
  std::vector<float> k_, v_;  // [n, kv_dim] rows of one store
};

// Appends n_tokens positions to kv (after what it holds) with synthetic K/V in every layer.
// Errors, changing nothing more, when the cache cannot take the next chunk.
[[nodiscard]] Status fill_kv_synthetic(PagedKvCache& kv, int64_t n_tokens,
                                       const SyntheticKvOptions& opts = {});

}  // namespace bie
