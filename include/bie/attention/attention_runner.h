// AttentionRunner: one layer's causal attention for one sequence, whatever holds its K/V.
// A cache that holds them as paged blocks in host memory (KvCache::host_blocks) is read here,
// with the paged kernels (attention/paged_attention.h): the runner plans (query tile x KV heads x
// context part) tasks on the backend's host threads, parts on a fixed grid of absolute positions
// (kSplitGridTokens) so a query's bits do not depend on batching, and rotates the queries when
// the keys were stored rotated. Any other cache (a device store, whose attention is the
// backend's paged_attention; a contiguous reference cache) runs KvCache::attention itself.
// Owns the scratch and partial-sum buffers (grown to the largest pass, then reused); not
// thread-safe: one runner per model (its forward pass is not re-entrant either).
#pragma once
#include <cstdint>
#include <vector>

#include "bie/backend/backend.h"
#include "bie/common/result.h"
#include "bie/kv/kv_block_view.h"
#include "bie/kv/kv_cache.h"

namespace bie {
class ThreadPool;
}  // namespace bie

namespace bie::attention {

class AttentionRunner {
 public:
  // Attention of q.rows queries at positions [pos0, pos0 + q.rows) of kv's sequence (KvCache::
  // attend's contract), q and out F32 [q.rows, n_head * head_dim] on `backend`.
  [[nodiscard]] Status run(KvCache& kv, int il, int64_t pos0, const Tensor& q, int n_head,
                           float scale, const Tensor& out, Backend& backend, int64_t window = 0);
  // The same on host memory: q and out [n, n_head * head_dim].
  void run(KvCache& kv, int il, int64_t pos0, int64_t n, const float* q, int n_head, float scale,
           float* out, Backend& backend, int64_t window = 0);
  // Attention over host blocks (their geometry: g's n_head_kv and head_dim) on `pool`'s threads.
  void run_blocks(const kv::HostKvBlocks& blocks, const KvGeometry& g, int64_t pos0, int64_t n,
                  const float* q, int n_head, float scale, float* out, ThreadPool& pool,
                  int64_t window = 0);

 private:
  std::vector<float> scratch_;   // per thread: paged_attn_scratch_floats
  std::vector<float> partials_;  // per task (decode) or per thread (prefill): partial sums
  std::vector<float> q_rot_;     // [n, n_head * head_dim] rotated queries
};

// One-off host attention through a runner of this thread (tests and tools).
void attend(KvCache& kv, int il, int64_t pos0, int64_t n, const float* q, int n_head, float scale,
            float* out, Backend& backend, int64_t window = 0);

}  // namespace bie::attention
