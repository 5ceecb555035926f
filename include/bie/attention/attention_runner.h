// AttentionRunner: one layer's attention for every sequence of a batch, whatever holds their K/V.
// A paged cache describes its blocks of the layer (KvCache::paged_layer: the pools, the block
// table); the runner turns consecutive sequences whose blocks lie in the same pools into one
// AttnMetadata (vLLM's attention metadata: query ranges, first positions, block tables) and calls
// the pools' backend's paged_attention once for them. Any other cache attends itself
// (KvCache::attention). How the backend splits the work (tiles, threads, workgroups) is its own.
// Not thread-safe: one runner per model (its forward pass is not re-entrant either).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "bie/backend/backend.h"
#include "bie/common/result.h"
#include "bie/kv/kv_cache.h"

namespace bie::attention {

// One sequence of the batch: its queries are rows [row0, row0 + n) of the batch's q and out, at
// positions [pos0, pos0 + n) of kv's sequence.
struct AttnSequence {
  KvCache* kv = nullptr;
  int64_t row0 = 0;
  int64_t n = 0;
  int64_t pos0 = 0;
};

class AttentionRunner {
 public:
  // Causal attention of layer il for each sequence (KvCache::attend's contract, window > 0 a
  // sliding window): q and out F32 [rows, n_head * head_dim] on `backend`. A paged cache's
  // backend that is not `backend` runs after it is synchronised.
  [[nodiscard]] Status run(std::span<const AttnSequence> seqs, int il, const Tensor& q,
                           const Tensor& out, int n_head, float scale, int64_t window,
                           Backend& backend);

 private:
  // One paged_attention call for the group of sequences collected so far.
  [[nodiscard]] Status flush(const Tensor& q, const Tensor& out, int n_head, float scale,
                             int64_t window, Backend& backend);

  // The group being collected: its first sequence's pools and layer, its rows, its metadata.
  kv::PagedKvLayer group_;
  int64_t group_row0_ = 0;
  std::vector<int32_t> query_start_;
  std::vector<int64_t> q_pos0_;
  std::vector<int32_t> table_start_;
  std::vector<KvBlockRef> table_;
};

// One sequence's attention from and to host memory (tests and tools): q and out
// [n, n_head * head_dim], staged through the buffers of a paged cache's backend; a failure
// writes NaN into out.
void attend(KvCache& kv, int il, int64_t pos0, int64_t n, const float* q, int n_head, float scale,
            float* out, Backend& backend, int64_t window = 0);

}  // namespace bie::attention
