// KvCoordinator on tiny shapes: its decisions come back as data work (exact block ids, in order),
// it never touches KV data, and its "can" and its "do" agree (a refused append changes nothing).
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "bie/kv/kv_coordinator.h"
#include "bie/planner/kv_format.h"

namespace bie::kv {
namespace {

// One layer, one KV head of 64: FP16 sink block, a 16-token FP16 window, int8 body; no memory.
KvCoordinatorConfig tiny(int64_t fp16_blocks, int64_t body_blocks) {
  KvCoordinatorConfig c;
  c.geometry = KvGeometry{1, 1, 64, {}};
  c.layout.k = planner::parse_kv_format("int8").value();
  c.layout.v = planner::parse_kv_format("int8").value();
  c.layout.block_size = 16;
  c.layout.sink_tokens = 16;
  c.layout.window_tokens = 16;
  c.fp16_blocks = fp16_blocks;
  c.body_blocks = body_blocks;
  return c;
}

std::vector<int32_t> tokens(int first, int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

TEST(KvCoordinator, WindowExitsComeBackAsQuantiseWorkWithExactBlocks) {
  auto c = KvCoordinator::create(tiny(4, 4));
  ASSERT_TRUE(c.ok()) << c.error();
  KvCoordinator& kv = **c;
  KvWork work;
  // Block 0 (the sink) and block 1 (the window) in FP16; nothing to move yet.
  ASSERT_EQ(kv.append(7, 0, tokens(0, 32), true, work).value(), 0);
  EXPECT_TRUE(work.empty());
  ASSERT_TRUE(kv.mark_computed(7, 32).ok());
  const BlockRef window_block = kv.manager().table(7)[1].block;
  ASSERT_EQ(kv.manager().table(7)[1].pool, PoolKind::kFp16);
  // 16 more tokens: block 2 becomes the window, block 1 (all 16 rows written) moves to the body.
  ASSERT_TRUE(kv.can_append(7, 32, 16));
  ASSERT_EQ(kv.append(7, 32, tokens(32, 16), true, work).value(), 0);
  ASSERT_EQ(work.size(), 1u);
  EXPECT_EQ(work[0].kind, KvWorkItem::Kind::kQuantise);
  EXPECT_EQ(work[0].group, 0);
  EXPECT_EQ(work[0].src, window_block);
  EXPECT_EQ(work[0].rows, 16);
  const BlockTableEntry moved = kv.manager().table(7)[1];
  EXPECT_EQ(moved.pool, PoolKind::kBody);
  EXPECT_EQ(work[0].dst, moved.block);
  EXPECT_EQ(moved.block.index, 1);  // the body pool's first block
  EXPECT_TRUE(kv.check_integrity().ok());
}

TEST(KvCoordinator, BlocksNotWrittenYetMoveWithoutDataWork) {
  auto c = KvCoordinator::create(tiny(4, 4));
  ASSERT_TRUE(c.ok()) << c.error();
  KvCoordinator& kv = **c;
  KvWork work;
  ASSERT_TRUE(kv.append(7, 0, tokens(0, 16), true, work).ok());
  ASSERT_TRUE(kv.mark_computed(7, 16).ok());
  // One append of 32: block 1 is past the window by its end but holds no written rows, so it
  // goes to the body pool with nothing to quantise (the pass writes it there).
  ASSERT_TRUE(kv.append(7, 16, tokens(16, 32), true, work).ok());
  EXPECT_TRUE(work.empty());
  EXPECT_EQ(kv.manager().table(7)[1].pool, PoolKind::kBody);
  EXPECT_EQ(kv.manager().table(7)[2].pool, PoolKind::kFp16);
}

TEST(KvCoordinator, CopyOnWriteOfASharedLastBlockComesBackAsCopyWork) {
  auto c = KvCoordinator::create(tiny(6, 4));
  ASSERT_TRUE(c.ok()) << c.error();
  KvCoordinator& kv = **c;
  KvWork work;
  ASSERT_TRUE(kv.append(1, 0, tokens(0, 20), true, work).ok());
  ASSERT_TRUE(kv.mark_computed(1, 20).ok());
  ASSERT_TRUE(kv.fork(1, 2).ok());
  const BlockRef shared = kv.manager().table(2)[1].block;
  ASSERT_TRUE(kv.append(2, 20, tokens(100, 1), true, work).ok());
  ASSERT_EQ(work.size(), 1u);
  EXPECT_EQ(work[0].kind, KvWorkItem::Kind::kCopy);
  EXPECT_EQ(work[0].copy.pool, PoolKind::kFp16);
  EXPECT_EQ(work[0].copy.src, shared);
  EXPECT_EQ(work[0].copy.dst, kv.manager().table(2)[1].block);
  EXPECT_NE(work[0].copy.dst, shared);
  EXPECT_EQ(kv.manager().table(1)[1].block, shared);  // the parent keeps its block
  EXPECT_TRUE(kv.check_integrity().ok());
}

TEST(KvCoordinator, ARefusedAppendChangesNothing) {
  // Two FP16 blocks and one body block: 48 tokens need the sink, the window and one body block;
  // 16 more need a second body block.
  auto c = KvCoordinator::create(tiny(2, 1));
  ASSERT_TRUE(c.ok()) << c.error();
  KvCoordinator& kv = **c;
  KvWork work;
  ASSERT_TRUE(kv.append(7, 0, tokens(0, 48), true, work).ok());
  ASSERT_TRUE(kv.mark_computed(7, 48).ok());
  const BlockTable before = kv.manager().table(7);
  work.clear();
  EXPECT_FALSE(kv.can_append(7, 48, 16));
  auto r = kv.append(7, 48, tokens(48, 16), true, work);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("out of budget"), std::string::npos) << r.error();
  EXPECT_TRUE(work.empty());
  EXPECT_EQ(kv.manager().table(7), before);
  EXPECT_EQ(kv.manager().num_tokens(7), 48);
  // Fewer tokens that stay inside the window block fit, and can_append agrees.
  EXPECT_TRUE(kv.can_append(7, 48, 0));
  EXPECT_TRUE(kv.check_integrity().ok());
}

}  // namespace
}  // namespace bie::kv
