// Paged attention is batch-invariant: a query's output has the same bits whether it is attended
// alone (decode), inside a prefill tile of any size, or with speculative drafts after it — for
// every KV format, for contexts that cross the split grid, and under a sliding window. Greedy
// outputs with and without prefix-cache hits or speculation rest on this.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "backend/cpu/paged_attention_runner.h"
#include "bie/backend/thread_pool.h"
#include "bie/kv/paged_kv_store.h"
#include "bie/planner/kv_layout_flags.h"

namespace bie {
namespace {

TEST(PagedAttentionInvariance, QueryBitsDoNotDependOnTheTile) {
  const KvGeometry geo{1, 3, 64, {}};
  const int n_head = 9;
  ThreadPool pool(2);
  attention::PagedAttentionRunner runner;
  for (const char* dtype : {"f16", "int8", "fp8_e4m3", "int4_asym", "int4_channel"}) {
    planner::KvLayoutFlags f;
    f.dtype = dtype;
    auto layout = planner::resolve_kv_layout(f);
    ASSERT_TRUE(layout.ok()) << layout.error();
    auto cfg = PagedKvStore::planned_config(geo, *layout, 1400, 1, 0);
    ASSERT_TRUE(cfg.ok()) << cfg.error();
    auto store = PagedKvStore::create(*cfg);
    ASSERT_TRUE(store.ok()) << store.error();
    PagedKvStore& st = **store;
    const int64_t n_ctx = 1300;  // crosses the 256-token grid five times
    std::vector<int32_t> toks(static_cast<size_t>(n_ctx));
    for (int64_t i = 0; i < n_ctx; ++i) toks[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    ASSERT_TRUE(st.append_tokens(0, 0, toks).ok());
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t kv_dim = geo.kv_dim();
    std::vector<float> k(static_cast<size_t>(n_ctx * kv_dim)), v(k.size());
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    // Whole blocks at a time (per-channel tiles are written whole).
    st.store(0, 0, 0, n_ctx, k.data(), v.data());
    const int64_t q_dim = static_cast<int64_t>(n_head) * geo.head_dim;
    for (const auto& [pos0, n] :
         {std::pair<int64_t, int64_t>{1290, 6}, {250, 12}, {500, 16}, {700, 33}, {3, 5}}) {
      std::vector<float> q(static_cast<size_t>(n * q_dim)), all(q.size()), one(q_dim);
      for (auto& x : q) x = nd(rng);
      // Also with a sliding window (Gemma 3's local layers), where a tile skips the blocks
      // before its first query's window.
      for (int64_t window : {0, 20, 300}) {
        runner.run_blocks(st.host_blocks(0, 0, pos0 + n), geo.n_head_kv, geo.head_dim, pos0, n,
                          q.data(), n_head, 0.125f, all.data(), pool, window);
        for (int64_t i = 0; i < n; ++i) {
          runner.run_blocks(st.host_blocks(0, 0, pos0 + i + 1), geo.n_head_kv, geo.head_dim,
                            pos0 + i, 1, q.data() + i * q_dim, n_head, 0.125f, one.data(), pool,
                            window);
          for (int64_t c = 0; c < q_dim; ++c) {
            ASSERT_EQ(one[static_cast<size_t>(c)], all[static_cast<size_t>(i * q_dim + c)])
                << dtype << " pos0=" << pos0 << " n=" << n << " i=" << i << " c=" << c
                << " window=" << window;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace bie
