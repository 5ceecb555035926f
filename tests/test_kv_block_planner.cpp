// One accounting: the paged pools reserve exactly what planner::kv_pool_plan predicts, on real
// geometries (SmolLM2 from its GGUF, the Llama-3-8B preset, Gemma 3's two layer groups), reserve
// only address space until blocks are used, and — on a tiny geometry — are both sufficient and
// tight: max_num_seqs sequences grown to max_model_len use exactly the planned blocks at peak.
#include <gtest/gtest.h>

#include <filesystem>

#include "bie/kv/block_manager.h"
#include "bie/planner/kv_bytes.h"
#include "bie/planner/model_geometry.h"
#include "bie/planner/presets.h"
#include "kv_block_test_util.h"
#include "support/paths.h"

namespace bie::kv {
namespace {

planner::KvFormat fmt(const char* name) {
  auto f = planner::parse_kv_format(name);
  EXPECT_TRUE(f.ok()) << name;
  return f.ok() ? f.value() : planner::kKvF16;
}

planner::KvLayout layout(const char* k, const char* v) {
  planner::KvLayout l;
  l.k = fmt(k);
  l.v = fmt(v);
  return l;
}

void expect_pools_match_plan(const planner::ModelGeometry& g, const planner::KvLayout& l,
                             int64_t max_len, int64_t seqs, uint64_t expect_total = 0) {
  const planner::KvPoolPlan plan = planner::kv_pool_plan(g, l, max_len, seqs);
  auto ms = make_block_managers(plan, l, g.name, true);
  ASSERT_TRUE(ms.ok()) << ms.error();
  ASSERT_EQ(ms->size(), plan.groups.size());
  uint64_t reserved = 0;
  for (size_t i = 0; i < ms->size(); ++i) {
    const BlockManager& m = (*ms)[i];
    const planner::KvGroupPool& gp = plan.groups[i];
    EXPECT_EQ(m.pool(PoolKind::kFp16).n_blocks(), gp.fp16_blocks);
    EXPECT_EQ(m.pool(PoolKind::kBody).n_blocks(), gp.body_blocks);
    EXPECT_EQ(m.pool(PoolKind::kFp16).block_bytes(), gp.fp16_block_bytes);
    EXPECT_EQ(m.pool(PoolKind::kBody).block_bytes(), gp.body_block_bytes);
    EXPECT_EQ(m.config().local_window, gp.group.shape.window);
    // Address space only: nothing is committed before a block is used.
    EXPECT_EQ(m.pool(PoolKind::kFp16).committed_bytes() + m.pool(PoolKind::kBody).committed_bytes(),
              0u);
    BIE_EXPECT_INTEGRITY(m);
    reserved += m.reserved_bytes();
  }
  EXPECT_EQ(reserved, plan.total_bytes())
      << g.name << " " << planner::kv_format_name(l.k) << "/" << planner::kv_format_name(l.v)
      << " len " << max_len << " seqs " << seqs;
  if (expect_total) {
    EXPECT_EQ(reserved, expect_total);
  }
}

TEST(KvBlockPlanner, PoolsReserveWhatThePlannerPredictsForSmolLM2) {
  BIE_REQUIRE_FILE(bie::test::smollm2_path());
  auto g = planner::geometry_from_gguf_path(bie::test::smollm2_path());
  ASSERT_TRUE(g.ok()) << g.error();
  // f16 at 8192 tokens: 23,040 B/token x 8192, the contiguous cache's figure (block-aligned).
  expect_pools_match_plan(*g, layout("f16", "f16"), 8192, 1, 188743680u);
  expect_pools_match_plan(*g, layout("int4_asym", "int4_asym"), 8192, 4);
  expect_pools_match_plan(*g, layout("int8", "int4_asym_g32"), 2048, 2);
  expect_pools_match_plan(*g, layout("fp8", "fp8"), 4100, 3);  // not block-aligned
  expect_pools_match_plan(*g, layout("int4_channel", "int4_asym"), 1000, 5);
}

TEST(KvBlockPlanner, PoolsReserveWhatThePlannerPredictsForLlama3_8B) {
  auto g = planner::preset_geometry("llama-3-8b");
  ASSERT_TRUE(g.ok()) << g.error();
  // f16: 2 MiB blocks, 4096 of them = 8 GiB of address space, none of it committed.
  expect_pools_match_plan(*g, layout("f16", "f16"), 65536, 1, 8ull << 30);
  expect_pools_match_plan(*g, layout("int4_asym", "int4_asym"), 65536, 1);
  expect_pools_match_plan(*g, layout("int8", "int4_asym"), 32768, 2);
  // int4_asym g64 blocks: 16 tokens x 36 KiB; FP16 blocks 16 x 128 KiB; 1 sink + 9 window.
  const planner::KvPoolPlan plan =
      planner::kv_pool_plan(*g, layout("int4_asym", "int4_asym"), 65536, 1);
  ASSERT_EQ(plan.groups.size(), 1u);
  EXPECT_EQ(plan.groups[0].fp16_blocks, 10);
  EXPECT_EQ(plan.groups[0].body_block_bytes, 16u * 36 * 1024);
}

TEST(KvBlockPlanner, SlidingWindowModelGetsOneManagerPerLayerGroup) {
  BIE_REQUIRE_FILE(bie::test::gemma3_path());
  auto g = planner::geometry_from_gguf_path(bie::test::gemma3_path());
  ASSERT_TRUE(g.ok()) << g.error();
  expect_pools_match_plan(*g, layout("f16", "f16"), 32768, 2);
  expect_pools_match_plan(*g, layout("int4_asym", "int4_asym"), 8192, 3);
}

// A 2-layer toy model with the tiny test layout: grow max_num_seqs sequences token by token to
// max_model_len (migrating as blocks leave the window) and check the planned pools are enough and
// that the peak use is exactly the plan.
TEST(KvBlockPlanner, PlannedPoolsAreSufficientAndTightForLockstepGrowth) {
  planner::ModelGeometry g;
  g.name = "toy";
  g.n_layer = 2;
  g.layers.assign(2, planner::LayerKv{1, 64, 64, 0});
  planner::KvLayout l = test::tiny_mixed_layout();
  l.k = l.v = fmt("int4_asym");
  const int64_t max_len = 41, seqs = 3;
  const planner::KvPoolPlan plan = planner::kv_pool_plan(g, l, max_len, seqs);
  auto ms = make_block_managers(plan, l, "toy", true);
  ASSERT_TRUE(ms.ok());
  BlockManager& m = (*ms)[0];
  int64_t peak[kPoolKinds] = {0, 0};
  auto note_peak = [&] {
    for (int p = 0; p < kPoolKinds; ++p) {
      peak[p] = std::max(peak[p], m.pool(PoolKind(p)).num_active());
    }
  };
  for (SeqId s = 0; s < seqs; ++s) ASSERT_TRUE(m.allocate(s, test::iota_tokens(1, 10 * s)).ok());
  for (int64_t n = 2; n <= max_len; ++n) {
    for (SeqId s = 0; s < seqs; ++s) {
      const std::vector<int32_t> tok = {static_cast<int32_t>(n)};
      ASSERT_TRUE(m.can_append(s, 1)) << "seq " << s << " at " << n;
      ASSERT_TRUE(m.append(s, tok).ok());
      note_peak();
      ASSERT_TRUE(m.mark_computed(s, n).ok());
      for (const WindowExit& x : m.blocks_leaving_window(s)) {
        auto mg = m.begin_migration(s, x.logical);
        ASSERT_TRUE(mg.ok()) << mg.error() << " seq " << s << " at " << n;
        note_peak();
        ASSERT_TRUE(m.migrate(s, x.logical, mg->dst).ok());
      }
    }
    BIE_EXPECT_INTEGRITY(m);
  }
  EXPECT_EQ(peak[0], plan.groups[0].fp16_blocks);
  EXPECT_EQ(peak[1], plan.groups[0].body_blocks);
  // Admitting whole max-length prompts at once fits too (blocks routed by their final role).
  for (SeqId s = 0; s < seqs; ++s) ASSERT_TRUE(m.free(s).ok());
  for (SeqId s = 10; s < 10 + seqs; ++s) {
    ASSERT_TRUE(m.allocate(s, test::iota_tokens(static_cast<int>(max_len), 1000 * s)).ok()) << s;
  }
  EXPECT_FALSE(m.can_allocate(test::iota_tokens(static_cast<int>(max_len), 99999)));
  BIE_EXPECT_INTEGRITY(m);
}

}  // namespace
}  // namespace bie::kv
