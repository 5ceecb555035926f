#include "bie/kv/memory_budget.h"

#include <unistd.h>

#include <algorithm>

#include "bie/kv/block_pool.h"

namespace bie::kv {

uint64_t MemoryBudget::page_size() {
  static const uint64_t page = [] {
    const long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<uint64_t>(p) : uint64_t{4096};
  }();
  return page;
}

uint64_t MemoryBudget::block_cost(uint64_t block_bytes) {
  const uint64_t page = page_size();
  return (block_bytes + page - 1) / page * page;
}

uint64_t MemoryBudget::active_cost() const {
  uint64_t sum = 0;
  for (const BlockPool* p : pools_) {
    sum += static_cast<uint64_t>(p->num_active()) * p->stride();
  }
  return sum;
}

void MemoryBudget::attach(BlockPool* p) {
  pools_.push_back(p);
}

void MemoryBudget::detach(BlockPool* p) {
  std::erase(pools_, p);
}

bool MemoryBudget::try_charge(uint64_t bytes) {
  if (committed_ + bytes > limit_) return false;
  committed_ += bytes;
  return true;
}

void MemoryBudget::credit(uint64_t bytes) {
  committed_ -= std::min(bytes, committed_);
}

uint64_t MemoryBudget::reclaim(const BlockPool* except, uint64_t bytes, bool free_only) {
  uint64_t freed = 0;
  // Free pages everywhere before any cached content is lost.
  for (int pass = 0; pass < (free_only ? 1 : 2) && freed < bytes; ++pass) {
    for (BlockPool* p : pools_) {
      if (p == except || freed >= bytes) continue;
      freed += p->give_back(bytes - freed, /*free_only=*/pass == 0);
    }
  }
  return freed;
}

}  // namespace bie::kv
