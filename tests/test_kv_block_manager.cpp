// BlockManager on tiny fake shapes: exact block ids for routing, window exits, copy-on-write,
// prefix hits (and what a hit means across the FP16 window / body boundary), eviction order,
// rollback, and failed calls that change nothing. Pools hold 4-token blocks; sink = block 0;
// the FP16 window is the last 8 tokens; the body format is int8.
#include <gtest/gtest.h>

#include "bie/kv/block_manager.h"
#include "kv_block_test_util.h"

namespace bie::kv {

struct BlockManagerTestPeer {
  static BlockTable& table(BlockManager& m, SeqId s) { return m.seqs_.at(s).table; }
};

namespace {

using test::concat;
using test::iota_tokens;
using test::make_manager;
using test::snapshot;
using test::tiny_config;

using Tok = std::vector<int32_t>;
constexpr PoolKind F = PoolKind::kFp16;
constexpr PoolKind Bd = PoolKind::kBody;

BlockTableEntry E(PoolKind p, BlockIndex b, uint32_t gen = 1) {
  return {p, BlockRef{b, gen}};
}

int64_t must(Result<int64_t> r) {
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error());
  return r.ok() ? r.value() : -1;
}

void must(const Status& s) {
  EXPECT_TRUE(s.ok()) << s.error();
}

std::vector<KvCopy> must(Result<std::vector<KvCopy>> r) {
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error());
  return r.ok() ? r.value() : std::vector<KvCopy>{};
}

// Runs every pending window exit of s: migrations (quantise) and drops.
void run_exits(BlockManager& m, SeqId s) {
  for (const WindowExit& x : m.blocks_leaving_window(s)) {
    if (x.drop) {
      ASSERT_TRUE(m.drop(s, x.logical).ok());
      continue;
    }
    auto mg = m.begin_migration(s, x.logical);
    ASSERT_TRUE(mg.ok()) << mg.error();
    ASSERT_TRUE(m.migrate(s, x.logical, mg->dst).ok());
  }
}

TEST(KvBlockManager, BlockRoleMatchesThePlannerBlockCounts) {
  // The manager routes blocks one by one; the planner counts them. Both must agree everywhere.
  for (int B : {1, 3, 4, 16}) {
    for (int sink : {0, 1, 4, 8, 17}) {
      for (int win : {0, 1, 8, 16, 128}) {
        for (int64_t local : {int64_t{0}, int64_t{5}, int64_t{16}, int64_t{64}}) {
          for (bool mixed : {true, false}) {
            planner::KvLayout l;
            l.block_size = B;
            l.sink_tokens = sink;
            l.window_tokens = win;
            if (mixed) l.k = l.v = planner::KvFormat{planner::KvType::kInt4Asym, 64};
            for (int64_t n = 1; n < 300; n += (n < 40 ? 1 : 7)) {
              planner::KvBlockCount c;
              for (int64_t i = 0; i < (n + B - 1) / B; ++i) {
                const BlockRole r = block_role(l, local, i, n);
                c.fp16 += r == BlockRole::kFp16;
                c.body += r == BlockRole::kBody;
              }
              ASSERT_EQ(c, planner::kv_block_count(l, n, local))
                  << "B " << B << " sink " << sink << " win " << win << " local " << local << " n "
                  << n << " mixed " << mixed;
            }
          }
        }
      }
    }
  }
}

TEST(KvBlockManager, AllocateRoutesSinkWindowAndBodyBlocks) {
  BlockManager m = make_manager(tiny_config(8, 8));
  ASSERT_TRUE(m.can_allocate(iota_tokens(20)));
  EXPECT_EQ(must(m.allocate(1, iota_tokens(20))), 0);
  // 20 tokens = 5 blocks: 0 holds the sinks, 3 and 4 the last 8 tokens, 1 and 2 are body.
  EXPECT_EQ(m.table(1), (BlockTable{E(F, 1), E(Bd, 1), E(Bd, 2), E(F, 2), E(F, 3)}));
  EXPECT_EQ(m.num_tokens(1), 20);
  EXPECT_EQ(m.num_computed(1), 0);
  EXPECT_TRUE(m.blocks_leaving_window(1).empty());
  EXPECT_EQ(m.pool(F).num_active(), 3);
  EXPECT_EQ(m.pool(Bd).num_active(), 2);
  BIE_EXPECT_INTEGRITY(m);
}

TEST(KvBlockManager, AppendMovesTheWindowAndMigrationFreesTheFp16Block) {
  BlockManager m = make_manager(tiny_config(8, 8));
  (void)must(m.allocate(1, iota_tokens(20)));
  must(m.mark_computed(1, 20));
  EXPECT_TRUE(m.can_append(1, 4));
  EXPECT_TRUE(must(m.append(1, iota_tokens(4, 200))).empty());
  // 24 tokens: block 3 (tokens 12..15) left the window; the new block 5 is FP16.
  EXPECT_EQ(m.table(1).back(), E(F, 4));
  EXPECT_EQ(m.blocks_leaving_window(1), (std::vector<WindowExit>{{3, false}}));
  BIE_EXPECT_INTEGRITY(m);

  auto mg = m.begin_migration(1, 3);
  ASSERT_TRUE(mg.ok()) << mg.error();
  EXPECT_EQ(mg->src, (BlockRef{2, 1}));
  EXPECT_EQ(mg->dst, (BlockRef{3, 1}));
  EXPECT_TRUE(mg->needs_quantise);
  EXPECT_TRUE(m.blocks_leaving_window(1).empty());  // in flight
  BIE_EXPECT_INTEGRITY(m);

  auto released = m.migrate(1, 3, mg->dst);
  ASSERT_TRUE(released.ok()) << released.error();
  EXPECT_EQ(released.value(), (BlockRef{2, 1}));
  EXPECT_EQ(m.table(1)[3], E(Bd, 3));
  // The FP16 block was cached (computed, full): it waits in the LRU rather than the free list.
  EXPECT_TRUE(m.pool(F).is_cached(2));
  EXPECT_TRUE(m.pool(Bd).has_key(3));
  EXPECT_TRUE(m.blocks_leaving_window(1).empty());
  BIE_EXPECT_INTEGRITY(m);
}

TEST(KvBlockManager, MigrationOfAnUncachedBlockReturnsItToTheFreeList) {
  BlockManager m = make_manager(tiny_config(8, 8, /*caching=*/false));
  (void)must(m.allocate(1, iota_tokens(20)));
  (void)must(m.append(1, iota_tokens(4, 200)));
  auto mg = m.begin_migration(1, 3);
  ASSERT_TRUE(mg.ok());
  ASSERT_TRUE(m.migrate(1, 3, mg->dst).ok());
  EXPECT_TRUE(m.pool(F).is_free(2));
  EXPECT_EQ(m.pool(F).free_order().front(), 2);
  BIE_EXPECT_INTEGRITY(m);
}

TEST(KvBlockManager, WriteIntoASharedPartlyFilledBlockCopiesItFirst) {
  BlockManager m = make_manager(tiny_config(8, 8));
  (void)must(m.allocate(1, iota_tokens(6)));  // blocks 0 (full) and 1 (2 of 4 tokens), FP16
  EXPECT_EQ(m.table(1), (BlockTable{E(F, 1), E(F, 2)}));
  must(m.fork(1, 2));
  EXPECT_EQ(m.table(2), m.table(1));
  EXPECT_EQ(m.pool(F).ref_count(1), 2);
  EXPECT_EQ(m.pool(F).ref_count(2), 2);
  BIE_EXPECT_INTEGRITY(m);

  const auto copies = must(m.append(2, Tok{7}));
  EXPECT_EQ(copies, (std::vector<KvCopy>{{F, BlockRef{2, 1}, BlockRef{3, 1}}}));
  EXPECT_EQ(m.table(2), (BlockTable{E(F, 1), E(F, 3)}));
  EXPECT_EQ(m.pool(F).ref_count(1), 2);  // the full block stays shared
  EXPECT_EQ(m.pool(F).ref_count(2), 1);
  EXPECT_TRUE(must(m.append(1, Tok{8})).empty());  // now private to 1: no copy
  BIE_EXPECT_INTEGRITY(m);

  // A shared *full* last block needs no copy: the new token opens a new block.
  (void)must(m.append(1, Tok{9}));  // 1 now has 8 tokens (2 full blocks)
  must(m.fork(1, 3));
  const auto none = must(m.append(3, Tok{11}));
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(m.table(3).size(), 3u);
  BIE_EXPECT_INTEGRITY(m);
}

TEST(KvBlockManager, PrefixHitReusesFullBlocksAndNeverTheLastTokensBlock) {
  BlockManager m = make_manager(tiny_config(8, 8));
  const auto p20 = iota_tokens(20);
  (void)must(m.allocate(1, p20));
  must(m.mark_computed(1, 20));
  must(m.free(1));
  // Freed tail first: the LRUs hold the later blocks in front.
  EXPECT_EQ(m.pool(F).lru_order(), (std::vector<BlockIndex>{3, 2, 1}));
  EXPECT_EQ(m.pool(Bd).lru_order(), (std::vector<BlockIndex>{2, 1}));
  BIE_EXPECT_INTEGRITY(m);

  // Same prompt: 4 of 5 blocks hit (block 4 holds the last token, which must be computed).
  const PrefixHit hit = m.lookup_prefix(p20);
  EXPECT_EQ(hit.cached_tokens, 16);
  EXPECT_EQ(hit.fp16_hits_needing_body, 0);
  EXPECT_EQ(must(m.allocate(2, p20)), 16);
  EXPECT_EQ(m.num_computed(2), 16);
  // A free block is taken for block 4; cached block 3 is not evicted.
  EXPECT_EQ(m.table(2), (BlockTable{E(F, 1), E(Bd, 1), E(Bd, 2), E(F, 2), E(F, 4)}));
  EXPECT_EQ(m.pool(F).lru_order(), (std::vector<BlockIndex>{3}));
  EXPECT_EQ(m.prefix_stats().hit_blocks, 4);
  EXPECT_EQ(m.prefix_stats().queried_blocks, 4 + 4);
  EXPECT_EQ(m.prefix_stats().evictions, 0);
  BIE_EXPECT_INTEGRITY(m);

  // A 16-token prompt is 4 full blocks, but the 4th holds the last token: 3 blocks at most.
  BlockManager m2 = make_manager(tiny_config(8, 8));
  const auto p16 = iota_tokens(16);
  (void)must(m2.allocate(1, p16));
  must(m2.mark_computed(1, 16));
  must(m2.free(1));
  EXPECT_EQ(must(m2.allocate(2, p16)), 12);
  BIE_EXPECT_INTEGRITY(m2);
}

TEST(KvBlockManager, OnlyComputedFullBlocksAreCached) {
  BlockManager m = make_manager(tiny_config(8, 8));
  (void)must(m.allocate(1, iota_tokens(10)));
  must(m.mark_computed(1, 7));  // block 0 full and computed; block 1 only partly computed
  EXPECT_TRUE(m.pool(F).has_key(1));
  EXPECT_FALSE(m.pool(F).has_key(2));
  (void)must(m.append(1, iota_tokens(6, 500)));  // unverified draft tokens
  EXPECT_FALSE(m.pool(F).has_key(3));
  EXPECT_FALSE(m.mark_computed(1, 5).ok());   // cannot go backwards
  EXPECT_FALSE(m.mark_computed(1, 17).ok());  // beyond the known tokens
  BIE_EXPECT_INTEGRITY(m);
}

TEST(KvBlockManager, EvictionTakesTheLeastRecentlyUsedTailsFirst) {
  BlockManager m = make_manager(tiny_config(4, 4));
  const auto p20 = iota_tokens(20);
  (void)must(m.allocate(1, p20));  // F1 B1 B2 F2 F3
  must(m.mark_computed(1, 20));
  must(m.free(1));
  // fp16: free [4], LRU [3, 2, 1]; body: free [3, 4], LRU [2, 1].
  EXPECT_EQ(must(m.allocate(2, iota_tokens(20, 500))), 0);
  // Free blocks go first; then the LRU head: block 3 (seq 1's tail), then block 2.
  EXPECT_EQ(m.table(2), (BlockTable{E(F, 4), E(Bd, 3), E(Bd, 4), E(F, 3, 2), E(F, 2, 2)}));
  EXPECT_EQ(m.prefix_stats().evictions, 2);
  EXPECT_EQ(m.pool(F).lru_order(), (std::vector<BlockIndex>{1}));
  EXPECT_EQ(m.pool(Bd).lru_order(), (std::vector<BlockIndex>{2, 1}));
  BIE_EXPECT_INTEGRITY(m);

  // p20 again: blocks 0..2 still hit, block 3 was evicted. Blocks 3 and 4 need FP16 blocks, but
  // the only one left is the hit on block 0: it cannot be admitted, and nothing changes.
  EXPECT_EQ(m.lookup_prefix(p20).cached_tokens, 12);
  EXPECT_FALSE(m.can_allocate(p20));
  const auto before = snapshot(m, {2, 3});
  const auto r = m.allocate(3, p20);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("not enough free blocks"), std::string::npos) << r.error();
  EXPECT_EQ(snapshot(m, {2, 3}), before);
  EXPECT_FALSE(m.has_sequence(3));
  BIE_EXPECT_INTEGRITY(m);
}

// ---- what a hit means across the FP16 window / body boundary ------------------------------

TEST(KvBlockManager, Fp16CachedBlockNeededInTheBodyIsAHitThatMustBeQuantised) {
  BlockManager m = make_manager(tiny_config(8, 8));
  const auto p20 = iota_tokens(20);
  (void)must(m.allocate(1, p20));  // F1 B1 B2 F2 F3; blocks 3, 4 are FP16 (window)
  must(m.mark_computed(1, 20));
  must(m.free(1));

  // 32 tokens: blocks 1..5 are body now. Blocks 3 and 4 are cached only in FP16: they hit and
  // come back as window exits (quantise, no forward pass). Block 5 misses.
  const auto p32 = concat(p20, iota_tokens(12, 300));
  const PrefixHit hit = m.lookup_prefix(p32);
  EXPECT_EQ(hit.cached_tokens, 20);
  EXPECT_EQ(hit.fp16_hits_needing_body, 2);
  EXPECT_EQ(must(m.allocate(2, p32)), 20);
  EXPECT_EQ(m.table(2), (BlockTable{E(F, 1), E(Bd, 1), E(Bd, 2), E(F, 2), E(F, 3), E(Bd, 3),
                                    E(F, 4), E(F, 5)}));
  EXPECT_EQ(m.blocks_leaving_window(2), (std::vector<WindowExit>{{3, false}, {4, false}}));
  BIE_EXPECT_INTEGRITY(m);

  auto mg = m.begin_migration(2, 3);
  ASSERT_TRUE(mg.ok());
  EXPECT_TRUE(mg->needs_quantise);
  EXPECT_EQ(mg->dst, (BlockRef{4, 1}));
  ASSERT_TRUE(m.migrate(2, 3, mg->dst).ok());

  // A third request with the same prompt finds block 3 in the body format already.
  const PrefixHit hit3 = m.lookup_prefix(p32);
  EXPECT_EQ(hit3.cached_tokens, 20);
  EXPECT_EQ(hit3.fp16_hits_needing_body, 1);  // only block 4
  EXPECT_EQ(hit3.blocks[3], E(Bd, 4));
  EXPECT_EQ(must(m.allocate(3, p32)), 20);

  // Block 4: seq 2 quantises it; seq 3's migration then reuses that body block (no data work).
  auto a = m.begin_migration(2, 4);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->needs_quantise);
  ASSERT_TRUE(m.migrate(2, 4, a->dst).ok());
  auto b = m.begin_migration(3, 4);
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(b->needs_quantise);
  EXPECT_EQ(b->dst, a->dst);
  ASSERT_TRUE(m.migrate(3, 4, b->dst).ok());
  EXPECT_EQ(m.table(3)[4], m.table(2)[4]);
  EXPECT_EQ(m.pool(Bd).ref_count(a->dst.index), 2);
  EXPECT_TRUE(m.pool(F).is_cached(3));  // the FP16 copy stays cached for short prompts
  BIE_EXPECT_INTEGRITY(m);
}

TEST(KvBlockManager, BodyCachedBlockNeededInTheFp16WindowIsAMiss) {
  BlockManager m = make_manager(tiny_config(8, 8));
  const auto p32 = iota_tokens(32);
  (void)must(m.allocate(1, p32));  // F1, B1..B5, F2, F3
  must(m.mark_computed(1, 32));
  must(m.free(1));

  // 13 tokens: block 0 is the sink, blocks 1..3 hold the last 8 tokens -> FP16. Block 1 is cached
  // only in the body format: dequantised data is not FP16 precision, so the run stops there.
  auto p13 = iota_tokens(12);
  p13.push_back(999);
  const PrefixHit hit = m.lookup_prefix(p13);
  EXPECT_EQ(hit.cached_tokens, 4);
  EXPECT_EQ(hit.blocks, (std::vector<BlockTableEntry>{E(F, 1)}));
  EXPECT_EQ(must(m.allocate(2, p13)), 4);
  for (size_t i = 1; i < m.table(2).size(); ++i) EXPECT_EQ(m.table(2)[i].pool, F) << i;
  BIE_EXPECT_INTEGRITY(m);
}

TEST(KvBlockManager, HitsNeedTheSamePrefixAndTheSameModel) {
  BlockManager m = make_manager(tiny_config(8, 8));
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::vector<int32_t> b = {0, 2, 3, 4, 5, 6, 7, 8, 9};  // same block 1, other parent
  (void)must(m.allocate(1, a));
  must(m.mark_computed(1, 9));
  EXPECT_EQ(m.lookup_prefix(a).cached_tokens, 8);
  EXPECT_EQ(m.lookup_prefix(b).cached_tokens, 0);
  // Another model's cache never hits.
  auto cfg = tiny_config(8, 8);
  cfg.model_id = "other";
  BlockManager other = make_manager(cfg);
  (void)must(other.allocate(1, a));
  must(other.mark_computed(1, 9));
  BlockManager same = make_manager(tiny_config(8, 8));
  (void)must(same.allocate(1, a));
  must(same.mark_computed(1, 9));
  EXPECT_NE(other.pool(F).key(1).key, m.pool(F).key(1).key);
  EXPECT_EQ(same.pool(F).key(1).key, m.pool(F).key(1).key);
  BIE_EXPECT_INTEGRITY(m);
}

// ---- rollback --------------------------------------------------------------------------------

TEST(KvBlockManager, RollbackReleasesWholeWindowBlocksTailFirst) {
  BlockManager m = make_manager(tiny_config(8, 8));
  (void)must(m.allocate(1, iota_tokens(20)));  // F1 B1 B2 F2 F3
  must(m.mark_computed(1, 20));
  (void)must(m.append(1, iota_tokens(5, 700)));  // 25 tokens: new blocks 5 (F4), 6 (F5)
  EXPECT_EQ(m.blocks_leaving_window(1), (std::vector<WindowExit>{{3, false}}));
  must(m.truncate(1, 20));  // all 5 draft tokens rejected
  EXPECT_EQ(m.table(1), (BlockTable{E(F, 1), E(Bd, 1), E(Bd, 2), E(F, 2), E(F, 3)}));
  EXPECT_EQ(m.num_tokens(1), 20);
  EXPECT_TRUE(m.blocks_leaving_window(1).empty());  // block 3 is back in the window
  EXPECT_EQ(m.pool(F).free_order().front(), 4);     // block 6's F5 freed first, then F4
  EXPECT_EQ(m.pool(F).free_order()[1], 5);
  BIE_EXPECT_INTEGRITY(m);

  // Rolling back to 18 would need body block 2 in the window again: refused.
  EXPECT_FALSE(m.truncate(1, 18).ok());

  (void)must(m.append(1, iota_tokens(4, 800)));  // 24 tokens, block 5 = F4
  must(m.mark_computed(1, 24));
  EXPECT_TRUE(m.pool(F).has_key(4));
  must(m.truncate(1, 22));  // block 5 becomes partial; its cached content is still valid
  EXPECT_TRUE(m.pool(F).has_key(4));
  EXPECT_EQ(m.num_computed(1), 22);
  (void)must(m.append(1, Tok{1, 2}));  // overwrites it: the key goes first (block is ours alone)
  EXPECT_FALSE(m.pool(F).has_key(4));
  EXPECT_EQ(m.table(1)[5], E(F, 4, 2));  // handed out before, by the first append
  BIE_EXPECT_INTEGRITY(m);
}

TEST(KvBlockManager, RollbackIntoASharedCachedBlockCopiesOnTheNextWrite) {
  BlockManager m = make_manager(tiny_config(8, 8));
  (void)must(m.allocate(1, iota_tokens(12)));
  must(m.mark_computed(1, 12));
  must(m.fork(1, 2));
  must(m.truncate(2, 10));  // block 2 partial in seq 2, still full (and cached) in seq 1
  const auto copies = must(m.append(2, Tok{77}));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, m.table(1)[2].block);
  EXPECT_TRUE(m.pool(F).has_key(m.table(1)[2].block.index));  // seq 1's content untouched
  EXPECT_FALSE(m.pool(F).has_key(m.table(2)[2].block.index));
  BIE_EXPECT_INTEGRITY(m);
}

TEST(KvBlockManager, RollbackNeverTouchesBodyBlocks) {
  BlockManager m = make_manager(tiny_config(8, 8));
  (void)must(m.allocate(1, iota_tokens(32)));
  must(m.mark_computed(1, 32));
  const auto before = snapshot(m, {1});
  // Cutting to 20 would discard body blocks; cutting to 28 or 31 would put body block 5 back in
  // the FP16 window. All fail and change nothing: rollback goes no further than the length at
  // which the last migration ran (so migrate only verified tokens' blocks).
  for (int64_t n : {20, 28, 31, 0}) {
    const Status s = m.truncate(1, n);
    EXPECT_FALSE(s.ok()) << n;
    EXPECT_NE(s.error().find("body"), std::string::npos) << s.error();
    EXPECT_EQ(snapshot(m, {1}), before);
  }
  (void)must(m.append(1, iota_tokens(5, 900)));  // 5 draft tokens: 37 tokens, block 6 leaves
  EXPECT_EQ(m.blocks_leaving_window(1), (std::vector<WindowExit>{{6, false}}));
  must(m.truncate(1, 33));  // partial rejection
  must(m.truncate(1, 32));  // all drafts rejected: back where it was
  EXPECT_EQ(m.table(1), before.seqs[0].table);
  EXPECT_EQ(m.num_computed(1), 32);
  BIE_EXPECT_INTEGRITY(m);
}

// ---- failures change nothing ----------------------------------------------------------------

TEST(KvBlockManager, FailedCallsChangeNothing) {
  BlockManager m = make_manager(tiny_config(3, 2));
  (void)must(m.allocate(1, iota_tokens(16)));  // F1 B1 F2 F3
  must(m.mark_computed(1, 16));
  const std::vector<SeqId> ids = {1, 2, 3};
  const auto before = snapshot(m, ids);
  auto expect_same = [&](const char* what) {
    EXPECT_EQ(snapshot(m, ids), before) << what;
    BIE_EXPECT_INTEGRITY(m);
  };
  EXPECT_FALSE(m.allocate(1, iota_tokens(4)).ok());  // id in use
  expect_same("allocate existing");
  EXPECT_FALSE(m.allocate(2, {}).ok());
  expect_same("allocate empty");
  EXPECT_FALSE(m.allocate(2, iota_tokens(8, 900)).ok());  // needs 2 FP16 blocks, 0 free
  expect_same("allocate too big");
  EXPECT_FALSE(m.can_append(1, 1));
  EXPECT_FALSE(m.append(1, Tok{5}).ok());  // needs a new FP16 block
  expect_same("append");
  EXPECT_FALSE(m.append(9, Tok{5}).ok());
  expect_same("append unknown");
  EXPECT_FALSE(m.fork(1, 1).ok());
  expect_same("fork onto itself");
  EXPECT_FALSE(m.begin_migration(1, 0).ok());  // the sink block never leaves
  EXPECT_FALSE(m.begin_migration(1, 9).ok());
  expect_same("begin_migration");
  EXPECT_FALSE(m.migrate(1, 2, BlockRef{2, 1}).ok());  // nothing in flight
  EXPECT_FALSE(m.abort_migration(1, 2).ok());
  expect_same("migrate");
  EXPECT_FALSE(m.drop(1, 0).ok());
  expect_same("drop");
  EXPECT_FALSE(m.truncate(1, 17).ok());
  EXPECT_FALSE(m.truncate(1, -1).ok());
  expect_same("truncate");
  EXPECT_FALSE(m.free(2).ok());
  expect_same("free unknown");
}

TEST(KvBlockManager, MigrationWithoutABodyBlockFailsAndStaleDestinationsAreRefused) {
  BlockManager m = make_manager(tiny_config(8, 1, /*caching=*/false));
  (void)must(m.allocate(1, iota_tokens(8)));    // F1 F2 (all window)
  (void)must(m.append(1, iota_tokens(8, 50)));  // 16 tokens: blocks 1 leaves: F F F F
  ASSERT_EQ(m.blocks_leaving_window(1), (std::vector<WindowExit>{{1, false}}));
  auto a = m.begin_migration(1, 1);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->dst, (BlockRef{1, 1}));
  must(m.abort_migration(1, 1));
  EXPECT_TRUE(m.pool(Bd).is_free(1));
  // The aborted destination is gone; a migrate naming it is refused.
  EXPECT_FALSE(m.migrate(1, 1, a->dst).ok());
  auto b = m.begin_migration(1, 1);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->dst, (BlockRef{1, 2}));         // same block, new generation
  EXPECT_FALSE(m.migrate(1, 1, a->dst).ok());  // stale
  // Only one body block: with it taken, a second migration fails and changes nothing.
  (void)must(m.append(1, iota_tokens(4, 60)));  // 20 tokens: block 2 leaves too
  const auto before = snapshot(m, {1});
  EXPECT_FALSE(m.begin_migration(1, 2).ok());
  EXPECT_EQ(snapshot(m, {1}), before);
  EXPECT_FALSE(m.truncate(1, 19).ok());  // a migration is in flight
  ASSERT_TRUE(m.migrate(1, 1, b->dst).ok());
  BIE_EXPECT_INTEGRITY(m);
  must(m.free(1));
  EXPECT_EQ(m.pool(F).num_active() + m.pool(Bd).num_active(), 0);
  BIE_EXPECT_INTEGRITY(m);
}

TEST(KvBlockManager, FreeAbortsMigrationsInFlight) {
  BlockManager m = make_manager(tiny_config(8, 8));
  (void)must(m.allocate(1, iota_tokens(24)));
  (void)must(m.append(1, Tok{1}));
  auto mg = m.begin_migration(1, 1);  // block 1 is body already; block... pick a leaving one
  EXPECT_FALSE(mg.ok());
  (void)must(m.append(1, iota_tokens(3, 70)));  // 28 tokens: block 4 leaves
  ASSERT_EQ(m.blocks_leaving_window(1), (std::vector<WindowExit>{{4, false}}));
  auto mg2 = m.begin_migration(1, 4);
  ASSERT_TRUE(mg2.ok());
  must(m.free(1));
  EXPECT_EQ(m.pool(Bd).num_active(), 0);
  BIE_EXPECT_INTEGRITY(m);
}

// ---- other layouts ---------------------------------------------------------------------------

TEST(KvBlockManager, UnmixedLayoutKeepsEverythingInTheBodyPool) {
  auto cfg = tiny_config(0, 8);
  cfg.layout.k = cfg.layout.v = planner::kKvF16;
  BlockManager m = make_manager(cfg);
  (void)must(m.allocate(1, iota_tokens(10)));
  EXPECT_EQ(m.table(1), (BlockTable{E(Bd, 1), E(Bd, 2), E(Bd, 3)}));
  (void)must(m.append(1, iota_tokens(20, 40)));
  EXPECT_TRUE(m.blocks_leaving_window(1).empty());
  must(m.truncate(1, 3));  // any rollback is fine: nothing is quantised
  EXPECT_EQ(m.table(1), (BlockTable{E(Bd, 1)}));
  BIE_EXPECT_INTEGRITY(m);
  cfg.fp16_blocks = 2;
  EXPECT_FALSE(BlockManager::create(cfg).ok());
}

TEST(KvBlockManager, SlidingWindowGroupDropsBlocksItNoLongerKeeps) {
  auto cfg = tiny_config(0, 8);
  cfg.layout.k = cfg.layout.v = planner::kKvF16;
  cfg.local_window = 8;
  BlockManager m = make_manager(cfg);
  (void)must(m.allocate(1, iota_tokens(12)));  // block 0 is outside the last 8 tokens
  EXPECT_EQ(m.table(1), (BlockTable{E(Bd, 1), E(Bd, 2), E(Bd, 3)}));
  EXPECT_EQ(m.blocks_leaving_window(1), (std::vector<WindowExit>{{0, true}}));
  auto d = m.drop(1, 0);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d.value(), (BlockRef{1, 1}));
  EXPECT_EQ(m.table(1)[0], (BlockTableEntry{Bd, BlockRef{}}));
  EXPECT_TRUE(m.pool(Bd).is_free(1));
  BIE_EXPECT_INTEGRITY(m);
  (void)must(m.append(1, iota_tokens(4, 40)));  // 16 tokens: block 1 leaves
  run_exits(m, 1);
  const auto before = snapshot(m, {1});
  EXPECT_FALSE(m.truncate(1, 12).ok());  // block 1 would be needed again
  EXPECT_EQ(snapshot(m, {1}), before);
  (void)must(m.append(1, Tok{1, 2}));  // 18 tokens: block 2 (tokens 8..11) still kept
  EXPECT_TRUE(m.blocks_leaving_window(1).empty());
  must(m.truncate(1, 16));
  EXPECT_EQ(m.lookup_prefix(iota_tokens(16)).cached_tokens, 0);  // nothing computed yet
  BIE_EXPECT_INTEGRITY(m);
}

// A local group serves a hit of h blocks when it holds the blocks the window of token h*B reaches
// (here window 8, B = 4: blocks from (4h - 7) / 4 on); the blocks before them become null entries.
// Blocks the window dropped return to the cache and hit until their memory is reused, so the
// servable hit lengths need not be a prefix-closed set.
TEST(KvBlockManager, SlidingWindowGroupHitsNeedOnlyTheWindowsBlocks) {
  auto cfg = tiny_config(0, 8);
  cfg.layout.k = cfg.layout.v = planner::kKvF16;
  cfg.local_window = 8;
  BlockManager m = make_manager(cfg);
  (void)must(m.allocate(1, iota_tokens(12)));
  must(m.mark_computed(1, 12));  // blocks 1, 2, 3 keyed
  auto dropped = m.drop(1, 0);
  ASSERT_TRUE(dropped.ok());
  EXPECT_EQ(dropped.value(), (BlockRef{1, 1}));
  EXPECT_TRUE(m.pool(Bd).is_cached(1));  // dropped, but its content stays findable
  must(m.free(1));                       // LRU: 1 (dropped first), then 3, 2 (tail first)
  const Tok p = concat(iota_tokens(12), Tok{7});
  EXPECT_EQ(m.local_window_first_block(3), 1);
  EXPECT_EQ(m.local_window_first_block(2), 0);
  EXPECT_EQ(m.servable_prefixes(p), (std::vector<bool>{true, true, true, true}));

  // Another sequence takes the 5 free blocks and evicts the oldest cached one: the dropped block.
  (void)must(m.allocate(2, iota_tokens(24, 500)));
  EXPECT_FALSE(m.pool(Bd).is_cached(1));
  EXPECT_EQ(m.servable_prefixes(p), (std::vector<bool>{true, false, false, true}));
  const PrefixHit hit = m.lookup_prefix(p);
  EXPECT_EQ(hit.cached_tokens, 12);
  EXPECT_EQ(hit.blocks, (BlockTable{E(Bd, kNullBlock, 0), E(Bd, 2), E(Bd, 3)}));
  EXPECT_EQ(m.lookup_prefix(p, 2).cached_tokens, 0);  // no servable length in (0, 2]
  must(m.free(2));  // never computed: its blocks go back to the free list
  EXPECT_EQ(must(m.allocate(3, p)), 12);
  const BlockTable& t = m.table(3);
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(BlockTable(t.begin(), t.begin() + 3),
            (BlockTable{E(Bd, kNullBlock, 0), E(Bd, 2), E(Bd, 3)}));
  BIE_EXPECT_INTEGRITY(m);
  must(m.free(3));

  // Evicting a block of the window (physical 2 or 3) ends every hit.
  (void)must(m.allocate(4, iota_tokens(28, 900)));  // 7 blocks: the 6 free ones, then LRU-first
  EXPECT_EQ(m.servable_prefixes(p), (std::vector<bool>{true, false, false, false}));
  EXPECT_EQ(m.lookup_prefix(p).cached_tokens, 0);
  BIE_EXPECT_INTEGRITY(m);
}

TEST(KvBlockManager, IntegrityCheckCatchesCorruptTables) {
  BlockManager m = make_manager(tiny_config(8, 8));
  (void)must(m.allocate(1, iota_tokens(20)));
  BIE_EXPECT_INTEGRITY(m);
  BlockTable& t = BlockManagerTestPeer::table(m, 1);
  t[1].block.gen = 7;  // stale
  EXPECT_FALSE(m.check_integrity().ok());
  t[1].block.gen = 1;
  t[2] = E(Bd, 1);  // two entries on one block with ref count 1
  EXPECT_FALSE(m.check_integrity().ok());
  t[2] = E(Bd, 2);
  t[3] = E(Bd, 2, 1);  // block 3 is in the window but points at a body block
  EXPECT_FALSE(m.check_integrity().ok());
  t[3] = E(F, 2);
  BIE_EXPECT_INTEGRITY(m);
}

}  // namespace
}  // namespace bie::kv
