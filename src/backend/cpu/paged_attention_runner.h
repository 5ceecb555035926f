// PagedAttentionRunner: one layer's causal attention for one sequence over paged KV blocks in host
// memory (kv::HostKvBlocks: the CPU backend's paged_attention builds them from its AttnMetadata),
// with the paged kernels (paged_attention.h). It plans (query tile x KV heads x context part)
// tasks on the backend's threads, parts on a fixed grid of absolute positions (kSplitGridTokens)
// so a query's bits do not depend on batching, and rotates the queries when the keys were stored
// rotated. Owns the scratch and partial-sum buffers (grown to the largest pass, then reused); not
// thread-safe: one runner per CpuBackend (its operations run on one caller thread).
#pragma once
#include <cstdint>
#include <vector>

#include "bie/backend/kv_block_view.h"

namespace bie {
class ThreadPool;
}  // namespace bie

namespace bie::attention {

class PagedAttentionRunner {
 public:
  // Attention of n queries at positions [pos0, pos0 + n) over the host blocks (n_head_kv KV
  // heads of head_dim values; KvCache::attend's contract), q and out [n, n_head * head_dim], on
  // `pool`'s threads.
  void run_blocks(const kv::HostKvBlocks& blocks, int n_head_kv, int head_dim, int64_t pos0,
                  int64_t n, const float* q, int n_head, float scale, float* out, ThreadPool& pool,
                  int64_t window = 0);

 private:
  std::vector<float> scratch_;   // per thread: paged_attn_scratch_floats
  std::vector<float> partials_;  // per task (decode) or per thread (prefill): partial sums
  std::vector<float> q_rot_;     // [n, n_head * head_dim] rotated queries
};

}  // namespace bie::attention
