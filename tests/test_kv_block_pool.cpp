// BlockPool: ids, free list (LIFO), LRU of cached blocks, eviction, staleness, and memory that is
// reserved up front but committed only as blocks are first used.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "bie/kv/block_pool.h"
#include "kv_block_test_util.h"

namespace bie::kv {
namespace {

std::unique_ptr<BlockPool> make_pool(int64_t n, uint64_t bytes = 0, int tokens = 4) {
  auto p = BlockPool::create({n, bytes, tokens});
  EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.error());
  // The pool's memory stays reserved until the test binary exits.
  static std::vector<std::unique_ptr<DeviceBuffer>> memory;
  if (p.ok() && bytes > 0) memory.push_back(test::attach_host_memory(**p));
  return std::move(p.value());
}

BlockIndex alloc(BlockPool& p) {
  auto a = p.allocate();
  EXPECT_TRUE(a.ok());
  return a.ok() ? a->block.index : kNullBlock;
}

void expect_ok(const BlockPool& p) {
  const Status s = p.check_integrity();
  EXPECT_TRUE(s.ok()) << s.error();
}

const std::vector<int32_t> kToks = {1, 2, 3, 4};

TEST(KvBlockPool, FreshPoolHandsOutIdsInOrderAndNeverTheNullBlock) {
  auto p = make_pool(4);
  EXPECT_EQ(p->free_order(), (std::vector<BlockIndex>{1, 2, 3, 4}));
  EXPECT_FALSE(p->is_free(kNullBlock));
  EXPECT_FALSE(p->is_active(kNullBlock));
  EXPECT_EQ(alloc(*p), 1);
  EXPECT_EQ(alloc(*p), 2);
  EXPECT_TRUE(p->is_active(1));
  EXPECT_EQ(p->ref_count(1), 1);
  EXPECT_EQ(p->num_free(), 2);
  EXPECT_EQ(p->num_active(), 2);
  expect_ok(*p);
}

TEST(KvBlockPool, FreedBlocksAreReusedFirst) {
  auto p = make_pool(4);
  for (int i = 0; i < 3; ++i) (void)alloc(*p);
  p->release(2);
  p->release(1);
  // LIFO: the most recently freed (already committed) block comes back first.
  EXPECT_EQ(p->free_order(), (std::vector<BlockIndex>{1, 2, 4}));
  EXPECT_EQ(alloc(*p), 1);
  EXPECT_EQ(alloc(*p), 2);
  expect_ok(*p);
}

TEST(KvBlockPool, CachedBlocksWaitInLruOrderAndAreEvictedOnlyWhenNothingIsFree) {
  auto p = make_pool(3);
  for (int i = 0; i < 3; ++i) (void)alloc(*p);
  p->set_key(1, {11, 111, 0}, kToks);
  p->set_key(3, {33, 333, 0}, kToks);
  p->release(3);  // active -> cached
  p->release(1);  // active -> cached
  p->release(2);  // active -> free
  EXPECT_TRUE(p->is_cached(3));
  EXPECT_TRUE(p->is_free(2));
  EXPECT_EQ(p->lru_order(), (std::vector<BlockIndex>{3, 1}));
  EXPECT_EQ(p->num_available(), 3);
  expect_ok(*p);

  auto a = p->allocate();  // the free block first: no eviction
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->block.index, 2);
  EXPECT_FALSE(a->evicted_key.has_value());

  const uint32_t gen3 = p->generation(3);
  auto b = p->allocate();  // now the LRU head is evicted
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->block.index, 3);
  EXPECT_EQ(b->evicted_key, std::optional<uint64_t>(33));
  EXPECT_FALSE(p->has_key(3));
  EXPECT_EQ(p->generation(3), gen3 + 1);
  EXPECT_TRUE(p->is_stale(BlockRef{3, gen3}));
  EXPECT_FALSE(p->is_stale(b->block));
  EXPECT_EQ(p->lru_order(), (std::vector<BlockIndex>{1}));
  expect_ok(*p);
}

TEST(KvBlockPool, HitOnACachedBlockTakesItOutOfTheMiddleOfTheLru) {
  auto p = make_pool(3);
  for (int i = 0; i < 3; ++i) (void)alloc(*p);
  for (BlockIndex b : {1, 2, 3}) p->set_key(b, {uint64_t(b), 0, 0}, kToks);
  const uint32_t gen2 = p->generation(2);
  for (BlockIndex b : {1, 2, 3}) p->release(b);
  EXPECT_EQ(p->lru_order(), (std::vector<BlockIndex>{1, 2, 3}));
  p->retain(2);  // cached -> active
  EXPECT_TRUE(p->is_active(2));
  EXPECT_EQ(p->generation(2), gen2);  // same content: not stale
  EXPECT_EQ(p->lru_order(), (std::vector<BlockIndex>{1, 3}));
  p->retain(2);  // active -> active
  EXPECT_EQ(p->ref_count(2), 2);
  p->release(2);
  p->release(2);  // back to the LRU tail
  EXPECT_EQ(p->lru_order(), (std::vector<BlockIndex>{1, 3, 2}));
  expect_ok(*p);
}

TEST(KvBlockPool, FailedAllocationChangesNothing) {
  auto p = make_pool(2);
  (void)alloc(*p);
  (void)alloc(*p);
  const auto before_gen = std::vector<uint32_t>{p->generation(1), p->generation(2)};
  auto a = p->allocate();
  EXPECT_FALSE(a.ok());
  EXPECT_EQ(p->num_active(), 2);
  EXPECT_EQ(p->ref_count(1), 1);
  EXPECT_EQ((std::vector<uint32_t>{p->generation(1), p->generation(2)}), before_gen);
  expect_ok(*p);
  auto empty = make_pool(0);
  EXPECT_FALSE(empty->allocate().ok());
  expect_ok(*empty);
}

// Corrupts state the API cannot reach, to show check_integrity notices.
}  // namespace
struct BlockPoolTestPeer {
  static void set_ref(BlockPool& p, BlockIndex b, int32_t r) { p.ref_[b] = r; }
  static void set_keyed(BlockPool& p, BlockIndex b, bool k) { p.keyed_[b] = k ? 1 : 0; }
};
namespace {

TEST(KvBlockPool, IntegrityCheckCatchesCorruption) {
  auto p = make_pool(3);
  (void)alloc(*p);
  BlockPoolTestPeer::set_ref(*p, 1, 0);  // unreferenced but in no list: a leak
  EXPECT_FALSE(p->check_integrity().ok());
  BlockPoolTestPeer::set_ref(*p, 1, 1);
  expect_ok(*p);
  BlockPoolTestPeer::set_keyed(*p, 2, true);  // a free block with a key
  EXPECT_FALSE(p->check_integrity().ok());
  BlockPoolTestPeer::set_keyed(*p, 2, false);
  BlockPoolTestPeer::set_ref(*p, 3, 2);  // referenced yet still in the free list
  EXPECT_FALSE(p->check_integrity().ok());
}

size_t resident_pages(const void* base, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> v((bytes + page - 1) / page);
  if (mincore(const_cast<void*>(base), bytes, v.data()) != 0) return SIZE_MAX;
  size_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}

TEST(KvBlockPool, MemoryIsReservedUpFrontAndCommittedOnFirstUse) {
  const uint64_t mib = 1 << 20;
  auto p = make_pool(1024, mib);  // 1 GiB of address space
  EXPECT_EQ(p->reserved_bytes(), 1024 * mib);
  EXPECT_EQ(p->committed_bytes(), 0u);
  const BlockIndex a = alloc(*p);
  const BlockIndex b = alloc(*p);
  EXPECT_EQ(p->committed_bytes(), 2 * mib);
  uint8_t* base = p->data(a);
  ASSERT_NE(base, nullptr);
  EXPECT_EQ(p->data(b), base + mib);
  std::memset(p->data(a), 0x5a, mib);  // touch one block only
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  EXPECT_EQ(resident_pages(base, 1024 * mib), mib / page);
  // Freeing and reallocating reuses the committed block: nothing new is committed.
  p->release(a);
  EXPECT_EQ(alloc(*p), a);
  EXPECT_EQ(p->committed_bytes(), 2 * mib);
  expect_ok(*p);
}

TEST(KvBlockPool, BlocksThatAreNotWholePagesCommitEveryPageTheyTouch) {
  auto p = make_pool(16, 1000);
  std::vector<BlockIndex> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(alloc(*p));
  for (BlockIndex b : ids) std::memset(p->data(b), 1, 1000);  // would fault if not committed
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  EXPECT_EQ(p->committed_bytes(), (5000 + page - 1) / page * page);
  expect_ok(*p);
}

}  // namespace
}  // namespace bie::kv
