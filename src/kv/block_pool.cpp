#include "bie/kv/block_pool.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cstring>

#include "bie/backend/backend.h"
#include "bie/kv/memory_budget.h"

namespace bie::kv {

BlockPool::BlockPool(const BlockPoolConfig& cfg) : cfg_(cfg), n_(cfg.n_blocks) {
  const size_t slots = static_cast<size_t>(n_) + 3;
  free_head_ = static_cast<int32_t>(n_ + 1);
  lru_head_ = static_cast<int32_t>(n_ + 2);
  prev_.assign(slots, 0);
  next_.assign(slots, 0);
  for (int32_t s : {free_head_, lru_head_}) prev_[s] = next_[s] = s;
  list_.assign(slots, List::kNone);
  ref_.assign(static_cast<size_t>(n_) + 1, 0);
  gen_.assign(static_cast<size_t>(n_) + 1, 0);
  keyed_.assign(static_cast<size_t>(n_) + 1, 0);
  keys_.assign(static_cast<size_t>(n_) + 1, BlockKey{});
  key_tokens_.assign((static_cast<size_t>(n_) + 1) * static_cast<size_t>(cfg.block_tokens), 0);
  // Ids in increasing order, so a fresh pool hands out 1, 2, 3, ...
  for (BlockIndex b = 1; b <= n_; ++b) list_push_back(free_head_, b);
  n_free_ = n_;
}

Result<std::unique_ptr<BlockPool>> BlockPool::create(const BlockPoolConfig& cfg) {
  if (cfg.n_blocks < 0 || cfg.n_blocks > (int64_t{1} << 30)) {
    return Error{fmt::format("KV block pool: block count {} out of range", cfg.n_blocks)};
  }
  if (cfg.block_tokens < 1) {
    return Error{fmt::format("KV block pool: block size {} tokens", cfg.block_tokens)};
  }
  std::unique_ptr<BlockPool> pool(new BlockPool(cfg));
  pool->page_ = MemoryBudget::page_size();
  // Under a shared budget every block starts on a page: its pages are its own to give back.
  pool->stride_ = cfg.budget ? MemoryBudget::block_cost(cfg.block_bytes) : cfg.block_bytes;
  pool->reserved_ = static_cast<uint64_t>(cfg.n_blocks) * pool->stride_;
  if (cfg.budget) cfg.budget->attach(pool.get());
  return pool;
}

Status BlockPool::attach_memory(DeviceBuffer& memory) {
  if (memory.host_ptr() == nullptr || memory.size() < reserved_) {
    return Error{fmt::format("KV block pool: memory of {} bytes{} for a pool of {} bytes",
                             memory.size(), memory.host_ptr() ? "" : " (not host-visible)",
                             reserved_)};
  }
  if (base_ != nullptr || num_free() != n_) {
    return Error{"KV block pool: memory attached twice or after the first allocation"};
  }
  memory_ = &memory;
  base_ = static_cast<uint8_t*>(memory.host_ptr());
  block_committed_.assign(static_cast<size_t>(n_) + 1, 0);
  page_committed_.assign((reserved_ + page_ - 1) / page_, 0);
  return {};
}

BlockPool::~BlockPool() {
  if (cfg_.budget) {
    cfg_.budget->credit(committed_pages_ * page_);
    cfg_.budget->detach(this);
  }
}

bool BlockPool::is_free(BlockIndex b) const {
  return b >= 1 && b <= n_ && list_[b] == List::kFree;
}
bool BlockPool::is_cached(BlockIndex b) const {
  return b >= 1 && b <= n_ && list_[b] == List::kLru;
}
bool BlockPool::is_active(BlockIndex b) const {
  return b >= 1 && b <= n_ && ref_[b] > 0;
}
bool BlockPool::has_key(BlockIndex b) const {
  return b >= 1 && b <= n_ && keyed_[b] != 0;
}
int32_t BlockPool::ref_count(BlockIndex b) const {
  return b >= 1 && b <= n_ ? ref_[b] : 0;
}
uint32_t BlockPool::generation(BlockIndex b) const {
  return b >= 1 && b <= n_ ? gen_[b] : 0;
}
bool BlockPool::is_stale(BlockRef r) const {
  return !is_active(r.index) || gen_[r.index] != r.gen;
}

const BlockKey& BlockPool::key(BlockIndex b) const {
  assert(has_key(b));
  return keys_[b];
}

std::span<const int32_t> BlockPool::key_tokens(BlockIndex b) const {
  assert(has_key(b));
  const size_t bt = static_cast<size_t>(cfg_.block_tokens);
  return {key_tokens_.data() + static_cast<size_t>(b) * bt, bt};
}

uint8_t* BlockPool::data(BlockIndex b) {
  assert(is_active(b));
  if (!base_) return nullptr;
  return base_ + static_cast<uint64_t>(b - 1) * stride_;
}

void BlockPool::list_push_front(int32_t sentinel, BlockIndex b) {
  const int32_t first = next_[sentinel];
  prev_[b] = sentinel;
  next_[b] = first;
  prev_[first] = b;
  next_[sentinel] = b;
  list_[b] = sentinel == free_head_ ? List::kFree : List::kLru;
}

void BlockPool::list_push_back(int32_t sentinel, BlockIndex b) {
  const int32_t last = prev_[sentinel];
  next_[b] = sentinel;
  prev_[b] = last;
  next_[last] = b;
  prev_[sentinel] = b;
  list_[b] = sentinel == free_head_ ? List::kFree : List::kLru;
}

void BlockPool::list_remove(BlockIndex b) {
  assert(list_[b] != List::kNone);
  next_[prev_[b]] = next_[b];
  prev_[next_[b]] = prev_[b];
  prev_[b] = next_[b] = 0;
  list_[b] = List::kNone;
}

Status BlockPool::commit(BlockIndex b) {
  if (!base_ || block_committed_[b]) return {};
  const uint64_t begin = static_cast<uint64_t>(b - 1) * stride_;
  const uint64_t end = begin + cfg_.block_bytes;
  const uint64_t p0 = begin / page_;
  const uint64_t p1 = (end + page_ - 1) / page_;
  uint64_t fresh = 0;
  if (cfg_.budget) {
    for (uint64_t p = p0; p < p1; ++p) fresh += page_committed_[p] ? 0 : page_;
    MemoryBudget& mb = *cfg_.budget;
    if (!mb.try_charge(fresh)) {
      const uint64_t room = mb.limit() > mb.committed() ? mb.limit() - mb.committed() : 0;
      mb.reclaim(this, fresh - std::min(fresh, room), /*free_only=*/true);
      if (!mb.try_charge(fresh)) {
        return Error{fmt::format(
            "KV memory budget exhausted: {} of {} bytes committed, block {} needs {} more",
            mb.committed(), mb.limit(), b, fresh)};
      }
    }
  }
  if (Status st = memory_->commit(p0 * page_, (p1 - p0) * page_); !st) {
    if (cfg_.budget) cfg_.budget->credit(fresh);
    return Error{
        fmt::format("KV block pool: block {} ({} bytes): {}", b, cfg_.block_bytes, st.error())};
  }
  for (uint64_t p = p0; p < p1; ++p) {
    if (!page_committed_[p]) {
      page_committed_[p] = 1;
      ++committed_pages_;
    }
  }
  block_committed_[b] = 1;
  return {};
}

Result<BlockPool::Allocated> BlockPool::allocate() {
  int32_t b;
  const bool has_cached = next_[lru_head_] != lru_head_;
  bool evict = next_[free_head_] == free_head_;
  if (!evict) {
    b = next_[free_head_];
    if (Status s = commit(b); !s) {
      if (!cfg_.budget) return Error{s.error()};
      if (has_cached) {
        // Over the shared budget: reuse this pool's own least recently used cached block
        // (already committed) before taking cached blocks of other pools.
        evict = true;
        b = next_[lru_head_];
      } else {
        cfg_.budget->reclaim(this, stride_, /*free_only=*/false);
        if (Status again = commit(b); !again) return Error{again.error()};
      }
    }
  } else if (has_cached) {
    b = next_[lru_head_];
  } else {
    return Error{fmt::format("KV block pool: all {} blocks are in use", n_)};
  }
  if (Status s = commit(b); !s) return Error{s.error()};
  Allocated out;
  list_remove(b);
  if (evict) {
    // cached -> active: the old content is forgotten.
    out.evicted_key = keys_[b].key;
    keyed_[b] = 0;
    keys_[b] = BlockKey{};
    --n_cached_;
  } else {
    // free -> active
    --n_free_;
  }
  ref_[b] = 1;
  ++gen_[b];
  out.block = BlockRef{b, gen_[b]};
  return out;
}

void BlockPool::retain(BlockIndex b) {
  assert(b >= 1 && b <= n_);
  if (ref_[b] == 0) {
    // cached -> active (hit on an unreferenced cached block)
    assert(list_[b] == List::kLru);
    list_remove(b);
    --n_cached_;
  }
  // active -> active
  ++ref_[b];
}

void BlockPool::release(BlockIndex b) {
  assert(is_active(b));
  if (--ref_[b] > 0) return;  // active -> active
  if (keyed_[b]) {
    list_push_back(lru_head_, b);  // active -> cached (most recently used at the tail)
    ++n_cached_;
  } else {
    list_push_front(free_head_, b);  // active -> free (reused first: already committed)
    ++n_free_;
  }
}

void BlockPool::set_key(BlockIndex b, const BlockKey& k, std::span<const int32_t> tokens) {
  assert(is_active(b) && !keyed_[b] && tokens.size() == static_cast<size_t>(cfg_.block_tokens));
  keyed_[b] = 1;
  keys_[b] = k;
  std::copy(tokens.begin(), tokens.end(),
            key_tokens_.begin() + static_cast<ptrdiff_t>(b) * cfg_.block_tokens);
}

void BlockPool::clear_key(BlockIndex b) {
  assert(is_active(b) && keyed_[b]);
  keyed_[b] = 0;
  keys_[b] = BlockKey{};
}

void BlockPool::decommit(BlockIndex b) {
  // Only pools under a budget give pages back; their blocks are page-aligned and share no page.
  assert(cfg_.budget != nullptr && stride_ % page_ == 0);
  if (!base_ || !block_committed_[b]) return;
  block_committed_[b] = 0;
  const uint64_t begin = static_cast<uint64_t>(b - 1) * stride_;
  const uint64_t p0 = begin / page_;
  const uint64_t p1 = (begin + cfg_.block_bytes + page_ - 1) / page_;
  memory_->decommit(p0 * page_, (p1 - p0) * page_);
  uint64_t freed = 0;
  for (uint64_t p = p0; p < p1; ++p) {
    if (!page_committed_[p]) continue;
    page_committed_[p] = 0;
    --committed_pages_;
    freed += page_;
  }
  cfg_.budget->credit(freed);
}

void BlockPool::pin(BlockIndex b) {
  if (pinned_.empty()) pinned_.assign(static_cast<size_t>(n_ + 1), 0);
  if (pinned_[static_cast<size_t>(b)]) return;
  pinned_[static_cast<size_t>(b)] = 1;
  pinned_list_.push_back(b);
}

void BlockPool::unpin_all() {
  for (const BlockIndex b : pinned_list_) pinned_[static_cast<size_t>(b)] = 0;
  pinned_list_.clear();
}

uint64_t BlockPool::give_back(uint64_t bytes, bool free_only) {
  if (!base_) return 0;
  const uint64_t before = committed_pages_ * page_;
  const auto freed = [&] { return before - committed_pages_ * page_; };
  const auto pinned = [&](BlockIndex b) {
    return !pinned_.empty() && pinned_[static_cast<size_t>(b)] != 0;
  };
  // Free blocks: decommitted and moved behind the committed ones (allocate takes the front).
  std::vector<BlockIndex> free_committed;
  for (int32_t b = next_[free_head_]; b != free_head_; b = next_[b]) {
    if (block_committed_[b] && !pinned(b)) free_committed.push_back(b);
  }
  for (const BlockIndex b : free_committed) {
    if (freed() >= bytes) break;
    decommit(b);
    list_remove(b);
    list_push_back(free_head_, b);
  }
  // Then cached blocks, least recently used first.
  for (int32_t b = next_[lru_head_]; !free_only && freed() < bytes && b != lru_head_;) {
    const int32_t after = next_[b];
    if (pinned(b)) {
      b = after;
      continue;
    }
    const uint64_t key = keys_[b].key;
    list_remove(b);
    keyed_[b] = 0;
    keys_[b] = BlockKey{};
    --n_cached_;
    list_push_back(free_head_, b);
    ++n_free_;
    decommit(b);
    if (on_evict_) on_evict_(key);
    b = after;
  }
  return freed();
}

std::vector<BlockIndex> BlockPool::free_order() const {
  std::vector<BlockIndex> out;
  for (int32_t b = next_[free_head_]; b != free_head_; b = next_[b]) out.push_back(b);
  return out;
}

std::vector<BlockIndex> BlockPool::lru_order() const {
  std::vector<BlockIndex> out;
  for (int32_t b = next_[lru_head_]; b != lru_head_; b = next_[b]) out.push_back(b);
  return out;
}

Status BlockPool::check_integrity() const {
  // Walk both lists forwards, checking back links and membership tags.
  int64_t counts[2] = {0, 0};
  for (int li = 0; li < 2; ++li) {
    const int32_t s = li == 0 ? free_head_ : lru_head_;
    const List tag = li == 0 ? List::kFree : List::kLru;
    int32_t prev = s;
    for (int32_t b = next_[s]; b != s; b = next_[b]) {
      if (b < 1 || b > n_) return Error{fmt::format("pool: list holds bad id {}", b)};
      if (list_[b] != tag) return Error{fmt::format("pool: block {} in the wrong list", b)};
      if (prev_[b] != prev) return Error{fmt::format("pool: broken back link at block {}", b)};
      if (++counts[li] > n_) return Error{"pool: list has a cycle"};
      prev = b;
    }
    if (prev_[s] != prev) return Error{"pool: list tail link broken"};
  }
  if (counts[0] != n_free_ || counts[1] != n_cached_) {
    return Error{fmt::format("pool: counts free {} cached {} but lists hold {} and {}", n_free_,
                             n_cached_, counts[0], counts[1])};
  }
  if (list_[kNullBlock] != List::kNone || ref_[kNullBlock] != 0 || keyed_[kNullBlock]) {
    return Error{"pool: the null block is in use"};
  }
  for (BlockIndex b = 1; b <= n_; ++b) {
    const bool keyed = keyed_[b] != 0;
    if (ref_[b] < 0) return Error{fmt::format("pool: block {} has ref count {}", b, ref_[b])};
    if (ref_[b] > 0 && list_[b] != List::kNone) {
      return Error{fmt::format("pool: active block {} is in a list", b)};
    }
    if (ref_[b] == 0 && list_[b] == List::kNone) {
      return Error{fmt::format("pool: unreferenced block {} is in no list (leak)", b)};
    }
    if (list_[b] == List::kFree && keyed)
      return Error{fmt::format("pool: free block {} has a key", b)};
    if (list_[b] == List::kLru && !keyed) {
      return Error{fmt::format("pool: cached block {} has no key", b)};
    }
    if (ref_[b] > 0 && base_ && !block_committed_[b]) {
      return Error{fmt::format("pool: active block {} is not committed", b)};
    }
  }
  return {};
}

}  // namespace bie::kv
