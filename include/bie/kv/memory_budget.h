// MemoryBudget: one byte budget that the block pools of several KV formats commit their memory
// from (an engine serving requests in f16, int8 and int4 regimes at once). Pools reserve address
// space for as many blocks as the whole budget could hold and commit a block's pages on first use;
// the budget counts committed pages across all of them. A pool that needs pages beyond the limit
// asks the budget to reclaim: other pools return the pages of their free blocks first and, if that
// is not enough, evict cached (prefix-cache) blocks, least recently used first.
// Admission stays exact: BlockManager::fits charges every active block its page-rounded size
// (block_cost), so what fits can always be committed once the rest is reclaimed.
// Not thread-safe (the engine thread owns every pool).
#pragma once

#include <cstdint>
#include <vector>

namespace bie::kv {

class BlockPool;

class MemoryBudget {
 public:
  explicit MemoryBudget(uint64_t limit_bytes) : limit_(limit_bytes) {}
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  [[nodiscard]] uint64_t limit() const { return limit_; }
  [[nodiscard]] uint64_t committed() const { return committed_; }
  // Sum over attached pools of active blocks x their stride (whole pages per block).
  [[nodiscard]] uint64_t active_cost() const;
  // The OS page size (4096 if it cannot be read).
  [[nodiscard]] static uint64_t page_size();
  // A block's charge: its bytes rounded up to whole pages (pools under a budget lay blocks out
  // page-aligned, so each block's pages are its own).
  [[nodiscard]] static uint64_t block_cost(uint64_t block_bytes);

  // Pools register themselves on creation and leave on destruction.
  void attach(BlockPool* p);
  void detach(BlockPool* p);

  // Charges `bytes` of new pages; false (nothing charged) when that would pass the limit.
  [[nodiscard]] bool try_charge(uint64_t bytes);
  void credit(uint64_t bytes);
  // Frees at least `bytes` of committed pages from pools other than `except` if it can: free
  // blocks' pages first (all pools), then, unless free_only, cached blocks (evicted). Returns the
  // bytes freed.
  uint64_t reclaim(const BlockPool* except, uint64_t bytes, bool free_only);

 private:
  uint64_t limit_;
  uint64_t committed_ = 0;
  std::vector<BlockPool*> pools_;
};

}  // namespace bie::kv
