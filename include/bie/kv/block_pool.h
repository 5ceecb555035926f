// BlockPool: one flat pool of fixed-size KV blocks in one storage format. Owns block ids, ref
// counts, the free list, the LRU of unreferenced cached blocks, each block's prefix-cache record
// (key, chain hash, tokens) and which of the pool's memory is committed (the memory itself is a
// backend buffer the KV storage attaches: attach_memory). It knows nothing of sequences or of what
// a key means; the BlockManager owns those. Not thread-safe: the engine thread owns it.
//
// Block states (TurboMind's vocabulary):
//   free    ref 0, no key             in the free list (LIFO: reuse what is already committed)
//   cached  ref 0, key                in the LRU (oldest first; evicted only when no free block)
//   active  ref > 0 (key or not)      in no list
// Block 0 is the null block: never handed out, no storage; table entries use it for "no block".
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "bie/common/result.h"

namespace bie {
class DeviceBuffer;
}  // namespace bie

namespace bie::kv {

class MemoryBudget;

using BlockIndex = int32_t;
inline constexpr BlockIndex kNullBlock = 0;

// A block id that can be checked for staleness: `gen` changes whenever the block is handed out
// with new content (free -> active, or an evicted cached block -> active). A prefix-cache hit
// keeps the generation: the content is the same.
struct BlockRef {
  BlockIndex index = kNullBlock;
  uint32_t gen = 0;
  friend bool operator==(const BlockRef&, const BlockRef&) = default;
};

struct BlockPoolConfig {
  int64_t n_blocks = 0;      // usable blocks, ids 1..n_blocks
  uint64_t block_bytes = 0;  // bytes of one block (all layers of the group); 0 = no storage
  int block_tokens = 16;     // tokens per block (length of a cached block's token record)
  // Shared budget (kv/memory_budget.h): the pool's memory comes from it, pages are given back
  // when other pools need them. nullptr: the pool owns n_blocks * block_bytes outright.
  MemoryBudget* budget = nullptr;
};

// A cached block's identity (see BlockManager for how keys are formed).
struct BlockKey {
  uint64_t key = 0;     // lookup key: hash(chain, storage format)
  uint64_t chain = 0;   // chained content hash of this block (parent chain, tokens, model id)
  uint64_t parent = 0;  // the parent block's chain hash (re-checked on a hit)
};

class BlockPool {
 public:
  // Metadata only until attach_memory.
  [[nodiscard]] static Result<std::unique_ptr<BlockPool>> create(const BlockPoolConfig& cfg);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  [[nodiscard]] int64_t n_blocks() const { return n_; }
  [[nodiscard]] uint64_t block_bytes() const { return cfg_.block_bytes; }
  [[nodiscard]] int block_tokens() const { return cfg_.block_tokens; }
  // The pool's blocks live in `memory` from now on: block b at byte (b - 1) * stride(), committed
  // (DeviceBuffer::commit) on its first allocation and, under a budget, decommitted when its pages
  // are given back. memory is host-visible memory from Backend::reserve, at least
  // reserved_bytes() long, and outlives the pool; attach before the first allocation.
  [[nodiscard]] Status attach_memory(DeviceBuffer& memory);
  // Address space the pool's memory spans: n_blocks * stride() (the null block has no storage).
  [[nodiscard]] uint64_t reserved_bytes() const { return reserved_; }
  // Bytes made readable/writable so far (whole pages; never shrinks).
  [[nodiscard]] uint64_t committed_bytes() const { return committed_pages_ * page_; }

  [[nodiscard]] int64_t num_free() const { return n_free_; }
  [[nodiscard]] int64_t num_cached() const { return n_cached_; }
  [[nodiscard]] int64_t num_available() const { return n_free_ + n_cached_; }
  [[nodiscard]] int64_t num_active() const { return n_ - n_free_ - n_cached_; }

  // note: the queries below take any index; out-of-range and the null block are neither.
  [[nodiscard]] bool is_free(BlockIndex b) const;
  [[nodiscard]] bool is_cached(BlockIndex b) const;
  [[nodiscard]] bool is_active(BlockIndex b) const;
  [[nodiscard]] bool has_key(BlockIndex b) const;
  [[nodiscard]] int32_t ref_count(BlockIndex b) const;
  [[nodiscard]] uint32_t generation(BlockIndex b) const;
  // True if `r` no longer names the active block it was handed out as.
  [[nodiscard]] bool is_stale(BlockRef r) const;

  // note: call only if has_key(b)
  [[nodiscard]] const BlockKey& key(BlockIndex b) const;
  [[nodiscard]] std::span<const int32_t> key_tokens(BlockIndex b) const;

  // Storage of block b (committed); nullptr for a pool without storage.
  // note: call only if is_active(b)
  [[nodiscard]] uint8_t* data(BlockIndex b);

  struct Allocated {
    BlockRef block;
    std::optional<uint64_t> evicted_key;  // the key of the cached block that was evicted
  };
  // free -> active (ref 1), taking the most recently freed block; if none is free,
  // cached -> active by evicting the least recently used cached block (its key is dropped and
  // returned so the owner can remove it from its index). Fails, changing nothing, when no block
  // is available or the OS refuses to commit the memory.
  [[nodiscard]] Result<Allocated> allocate();

  // active -> active (ref + 1), or cached -> active (a prefix-cache hit; leaves the LRU).
  // note: call only if is_active(b) || is_cached(b)
  void retain(BlockIndex b);

  // active -> active (ref - 1); at ref 0: -> cached (LRU tail) if it has a key, else -> free
  // (free-list head).
  // note: call only if is_active(b)
  void release(BlockIndex b);

  // Records the content identity of an active block (it becomes findable by its owner's index).
  // note: call only if is_active(b) && !has_key(b) && tokens.size() == block_tokens()
  void set_key(BlockIndex b, const BlockKey& k, std::span<const int32_t> tokens);
  // note: call only if is_active(b) && has_key(b)
  void clear_key(BlockIndex b);

  // Lists, front first (tests and integrity checks): the free list in allocation order and the
  // LRU in eviction order.
  [[nodiscard]] std::vector<BlockIndex> free_order() const;
  [[nodiscard]] std::vector<BlockIndex> lru_order() const;

  // Verifies the lists, counts and per-block states against each other.
  [[nodiscard]] Status check_integrity() const;

  // ---- shared budget (cfg.budget) ----------------------------------------------------------
  // Called with the key of every cached block give_back evicts (its owner drops it from its
  // index).
  void set_evict_listener(std::function<void(uint64_t key)> f) { on_evict_ = std::move(f); }
  // Returns committed pages to the budget: those of free blocks and, unless free_only, of cached
  // blocks (evicted, least recently used first), until at least `bytes` are freed. Returns the
  // bytes freed.
  uint64_t give_back(uint64_t bytes, bool free_only);
  // A block a queued KvWork item still reads (a window exit's FP16 source, released by the
  // migration before the work runs) keeps its pages until unpin_all(), which the store calls
  // once it has executed the work: give_back skips it, so another pool's allocation in between
  // cannot take its pages away (it may still be handed out again; nothing writes it before the
  // queued work has run).
  void pin(BlockIndex b);
  void unpin_all();
  [[nodiscard]] uint64_t page_size() const { return page_; }
  // Distance between blocks in memory: block_bytes, rounded up to whole pages under a budget
  // (what the budget charges per active block).
  [[nodiscard]] uint64_t stride() const { return stride_; }

 private:
  friend struct BlockPoolTestPeer;  // tests corrupt state to exercise check_integrity
  enum class List : uint8_t { kNone, kFree, kLru };

  explicit BlockPool(const BlockPoolConfig& cfg);
  void list_push_front(int32_t sentinel, BlockIndex b);
  void list_push_back(int32_t sentinel, BlockIndex b);
  void list_remove(BlockIndex b);
  [[nodiscard]] Status commit(BlockIndex b);
  // b's pages go back to the OS and the budget (budget pools only: blocks own their pages).
  void decommit(BlockIndex b);

  BlockPoolConfig cfg_;
  int64_t n_ = 0;
  int32_t free_head_ = 0;  // sentinel ids: n + 1 (free list) and n + 2 (LRU)
  int32_t lru_head_ = 0;
  std::vector<int32_t> prev_, next_;
  std::vector<List> list_;
  std::vector<int32_t> ref_;
  std::vector<uint32_t> gen_;
  std::vector<uint8_t> keyed_;
  std::vector<BlockKey> keys_;
  std::vector<int32_t> key_tokens_;  // [n + 1, block_tokens]
  int64_t n_free_ = 0;
  int64_t n_cached_ = 0;

  // Memory (attach_memory): [base_, base_ + reserved_); block b lives at base_ + (b - 1) * stride_.
  DeviceBuffer* memory_ = nullptr;
  uint8_t* base_ = nullptr;
  uint64_t reserved_ = 0;
  uint64_t page_ = 4096;
  uint64_t stride_ = 0;
  std::vector<uint8_t> block_committed_;
  std::vector<uint8_t> page_committed_;
  uint64_t committed_pages_ = 0;
  std::function<void(uint64_t)> on_evict_;
  std::vector<uint8_t> pinned_;          // [n + 1] once a block was pinned
  std::vector<BlockIndex> pinned_list_;  // what unpin_all clears
};

}  // namespace bie::kv
