// Block state changes after a forward pass, not during it (KvCache::finish_pass): once every
// layer has stored and attended a pass's tokens, the blocks that left the FP16 window are in the
// body pool, exactly where kv::block_role puts them. Checked on the two callers that run passes:
// the engine's model runner (SequenceKv views of the scheduler's store) and Model::forward (one
// PagedKvCache). During the pass the blocks a prompt pushes out of the window must stay FP16 (the
// pass still writes them), so without finish_pass they stay FP16 until the next append.
#include <gtest/gtest.h>

#include <numeric>
#include <span>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "bie/kv/block_table.h"
#include "bie/kv/paged_kv_cache.h"
#include "bie/kv/paged_kv_store.h"
#include "bie/model/model.h"
#include "bie/planner/kv_layout_flags.h"
#include "engine/model_runner.h"
#include "support/paths.h"

namespace bie {
namespace {

constexpr int64_t kPrompt = 100;  // 7 blocks of 16: sink block 0, window blocks 4..6

// Per-channel int8 keys in 16-token blocks (a block's key tile is quantised once it is written
// whole, so a prompt's blocks stay FP16 until its pass is over) with int8 values.
planner::KvLayout mixed_int8() {
  planner::KvLayoutFlags f;
  f.dtype_k = "int8_channel_t16";
  f.dtype_v = "int8";
  f.sink_tokens = 16;
  f.window_tokens = 32;
  auto l = planner::resolve_kv_layout(f);
  EXPECT_TRUE(l.ok()) << l.error();
  return l.ok() ? *l : planner::KvLayout{};
}

std::vector<int32_t> prompt() {
  std::vector<int32_t> t(kPrompt);
  std::iota(t.begin(), t.end(), 300);
  return t;
}

// Body blocks of a table, and whether every entry is in the pool block_role names at n tokens.
int count_body(const kv::BlockTable& t) {
  int n = 0;
  for (const kv::BlockTableEntry& e : t) n += e.pool == kv::PoolKind::kBody ? 1 : 0;
  return n;
}
void expect_roles(const kv::BlockTable& t, const planner::KvLayout& l, int64_t n) {
  ASSERT_EQ(static_cast<int64_t>(t.size()), (n + l.block_size - 1) / l.block_size);
  for (size_t i = 0; i < t.size(); ++i) {
    const bool body = kv::block_role(l, 0, static_cast<int64_t>(i), n) == kv::BlockRole::kBody;
    EXPECT_EQ(t[i].pool, body ? kv::PoolKind::kBody : kv::PoolKind::kFp16) << "block " << i;
  }
}

// Two prompt chunks: 40 tokens (block 2 half written), then 60. The second chunk starts inside
// block 2 and pushes it out of the window: it can only move after the pass that completes it.
// (The scheduler cuts chunks on block boundaries so exactly planned pools never need the spare
// FP16 block this takes; the other block state change of its passes, a sliding-window group's
// drops, follows the same finish_pass.)
TEST(FinishPass, ModelRunnerMovesWindowExitsToTheBodyPoolAfterThePass) {
  BIE_REQUIRE_FILE(test::smollm2_path());
  auto m = load_model(test::smollm2_path());
  ASSERT_TRUE(m.ok()) << m.error();
  const planner::KvLayout layout = mixed_int8();
  auto cfg =
      PagedKvStore::planned_config(kv::kv_geometry((*m)->geometry()), layout, kPrompt + 8, 1, kPrompt);
  ASSERT_TRUE(cfg.ok()) << cfg.error();
  cfg->groups[0].fp16_blocks +=
      1;  // the pass completing block 2 holds it in FP16 beside the window
  auto store = PagedKvStore::create(*cfg);
  ASSERT_TRUE(store.ok()) << store.error();
  Sequence s;
  s.id = 1;
  s.tokens = prompt();
  s.n_prompt = kPrompt;
  s.store = store->get();
  CpuBackend backend(2);
  ModelRunner runner(**m, backend, kPrompt + 8);
  EngineMetrics metrics;
  const std::span<const int32_t> all(s.tokens);
  for (const int64_t chunk : {int64_t{40}, kPrompt - 40}) {
    // What the scheduler does around a step: allocate the chunk's blocks, run, mark computed.
    auto hit = (*store)->append_tokens(s.id, s.computed, all.subspan(s.computed, chunk));
    ASSERT_TRUE(hit.ok()) << hit.error();
    if (s.computed == 40) {
      EXPECT_EQ((*store)->coordinator().manager().table(s.id)[2].pool, kv::PoolKind::kFp16)
          << "block 2 moved before its pass";
    }
    SchedulerOutput out;
    out.scheduled.push_back(ScheduledSeq{&s, chunk, 0, s.computed + chunk == kPrompt});
    auto r = runner.run(out, metrics);
    ASSERT_TRUE(r.ok()) << r.error();
    s.computed += chunk;
    ASSERT_TRUE((*store)->coordinator().mark_computed(s.id, s.computed).ok());
  }
  const kv::BlockTable& t = (*store)->coordinator().manager().table(s.id);
  EXPECT_EQ(count_body(t), 3);  // blocks 1..3
  expect_roles(t, layout, kPrompt);
  EXPECT_TRUE((*store)->check_integrity().ok());
}

// The same two chunks through Model::forward on one PagedKvCache.
TEST(FinishPass, ModelForwardMovesWindowExitsToTheBodyPoolAfterThePass) {
  BIE_REQUIRE_FILE(test::smollm2_path());
  auto m = load_model(test::smollm2_path());
  ASSERT_TRUE(m.ok()) << m.error();
  PagedKvCacheConfig cfg;
  cfg.geometry = kv::kv_geometry((*m)->geometry());
  cfg.layout = mixed_int8();
  cfg.max_tokens = kPrompt + 8;
  auto c = PagedKvCache::create(cfg, 5, 3);  // one FP16 block beyond the sink and window
  ASSERT_TRUE(c.ok()) << c.error();
  CpuBackend backend(2);
  const std::vector<int32_t> p = prompt();
  const std::span<const int32_t> all(p);
  ASSERT_TRUE((*m)->forward(all.first(40), **c, backend).ok());
  auto r = (*m)->forward(all.subspan(40), **c, backend);
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(count_body((*c)->table()), 3);
  expect_roles((*c)->table(), cfg.layout, kPrompt);
  EXPECT_TRUE((*c)->check_integrity().ok());
}

}  // namespace
}  // namespace bie
