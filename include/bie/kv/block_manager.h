// BlockManager: the paged KV cache's bookkeeping for one layer group (all layers of a model
// without sliding windows). Owns the FP16 (sink/window) pool and the body pool, every sequence's
// block table, tokens and chain hashes, the prefix-cache index and in-flight migrations. It never
// touches KV data: copy-on-write and window exits come back as instructions (KvCopy, Migration)
// that the attention/format code executes on the pools' memory. Sequence state is plain data; the
// scheduler owns queues and policy. Not thread-safe: the engine thread owns it.
//
// Ask-then-act: can_allocate/allocate and can_append/append agree, and a call that fails returns
// an error and changes nothing (the one exception: if the OS refuses to commit memory for a new
// block, cached blocks evicted on the way stay evicted). docs/kv-cache.md has the state machine.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "bie/common/result.h"
#include "bie/kv/block_pool.h"
#include "bie/kv/block_table.h"
#include "bie/kv/kv_event_sink.h"
#include "bie/kv/memory_budget.h"
#include "bie/kv/seq_id.h"
#include "bie/planner/kv_bytes.h"

namespace bie::kv {

struct BlockManagerConfig {
  planner::KvLayout layout;
  int64_t local_window = 0;  // the group's sliding window in tokens (0: global layers)
  std::string model_id;      // e.g. the model file's sha256; caches of two models never mix
  bool enable_prefix_caching = true;
  int64_t fp16_blocks = 0;  // FP16 sink/window pool (0 in an unmixed layout)
  int64_t body_blocks = 0;  // body-format pool
  uint64_t fp16_block_bytes = 0;
  uint64_t body_block_bytes = 0;
  // Shared byte budget (several managers' pools, e.g. one per KV regime, draw on it): each pool
  // then gets ids for as many blocks as the whole budget holds, fp16_blocks/body_blocks are
  // ignored, and admission charges MemoryBudget::block_cost per active block.
  MemoryBudget* budget = nullptr;
  // With a budget: keep fp16_blocks/body_blocks as the pools' sizes (the budget still bounds what
  // is active). For pools whose memory is allocated up front, not reserved (a device's).
  bool sizes_as_given = false;
  // KV events (kv_event_sink.h): every full block entering or leaving the prefix index is
  // reported here, under the medium "<events_medium>/fp16" or "<events_medium>/body" (which
  // store holds it). nullptr: no events.
  KvEventSink* events = nullptr;
  std::string events_medium = "kv";
};

// What the pools can still hand out, for dry runs: available blocks per pool (free + cached)
// and, with a shared budget, the bytes left for active blocks and each pool's charge per block.
struct PoolCapacity {
  std::array<int64_t, kPoolKinds> blocks{};
  std::array<uint64_t, kPoolKinds> cost{};
  bool budgeted = false;
  uint64_t bytes = 0;  // budget left (budgeted only)
  // One more active block in p (new, or a cached hit pinned); false, taking nothing, if it does
  // not fit.
  bool take(PoolKind p);
  // An active block of p released.
  void give(PoolKind p);
};

// Blocks an allocation takes per pool: fresh ones and cached blocks it pins (cached -> active).
struct BlockNeeds {
  std::array<int64_t, kPoolKinds> need{};
  std::array<int64_t, kPoolKinds> pinned{};
};

// Copy the whole block src to dst in `pool` (same format) before writing into dst.
struct KvCopy {
  PoolKind pool = PoolKind::kBody;
  BlockRef src;
  BlockRef dst;
  friend bool operator==(const KvCopy&, const KvCopy&) = default;
};

// What the prefix cache holds for a prompt (see lookup_prefix).
struct PrefixHit {
  std::vector<BlockTableEntry> blocks;  // hits for logical blocks 0, 1, ...
  std::vector<uint64_t> chains;         // their chain hashes
  int64_t cached_tokens = 0;            // blocks.size() * block_size
  int64_t fp16_hits_needing_body = 0;   // FP16 hits the request needs in the body format
};

// A block whose storage no longer matches the sequence's regime: it left the FP16 window
// (migrate it into the body pool) or a sliding window (drop it).
struct WindowExit {
  int64_t logical = 0;
  bool drop = false;
  friend bool operator==(const WindowExit&, const WindowExit&) = default;
};

// An FP16 -> body move in flight. needs_quantise: quantise src's data into dst; false when dst is
// a prefix-cache hit that already holds this content in the body format (no data work).
struct Migration {
  int64_t logical = 0;
  BlockRef src;  // in the FP16 pool
  BlockRef dst;  // in the body pool, held by the migration until migrate/abort_migration
  bool needs_quantise = true;
};

// One entry of the prefix index: the pool holding it and its chain hash (KvEventSink's names).
struct CachedBlock {
  PoolKind pool = PoolKind::kBody;
  uint64_t chain = 0;
};

struct PrefixCacheStats {
  int64_t lookups = 0;         // allocate() calls with prefix caching on
  int64_t queried_blocks = 0;  // full blocks that could have hit (excluding the last token's)
  int64_t hit_blocks = 0;
  int64_t evictions = 0;  // cached blocks reused for new content
};

class BlockManager {
 public:
  [[nodiscard]] static Result<BlockManager> create(const BlockManagerConfig& cfg);

  BlockManager(BlockManager&&) noexcept = default;
  BlockManager& operator=(BlockManager&&) noexcept = default;

  [[nodiscard]] const BlockManagerConfig& config() const { return cfg_; }
  [[nodiscard]] int block_size() const { return cfg_.layout.block_size; }
  [[nodiscard]] BlockPool& pool(PoolKind p) { return *pools_[static_cast<int>(p)]; }
  [[nodiscard]] const BlockPool& pool(PoolKind p) const { return *pools_[static_cast<int>(p)]; }
  // Address space both pools reserve (= the planner's bytes for this group).
  [[nodiscard]] uint64_t reserved_bytes() const;
  [[nodiscard]] PrefixCacheStats prefix_stats() const;
  [[nodiscard]] PoolCapacity capacity() const;
  // Every block the prefix index holds (active or cached), in no particular order.
  [[nodiscard]] std::vector<CachedBlock> cached_blocks() const;
  // The medium KV events name pool p's blocks by ("<events_medium>/fp16|body").
  [[nodiscard]] const std::string& event_medium(PoolKind p) const {
    return index_->medium[static_cast<size_t>(p)];
  }

  // ---- sequences -------------------------------------------------------------------------

  [[nodiscard]] bool has_sequence(SeqId s) const { return seqs_.count(s) != 0; }
  [[nodiscard]] int64_t num_sequences() const { return static_cast<int64_t>(seqs_.size()); }
  // note: the accessors below take a known sequence (has_sequence(s))
  [[nodiscard]] const BlockTable& table(SeqId s) const;
  [[nodiscard]] std::span<const int32_t> tokens(SeqId s) const;
  [[nodiscard]] int64_t num_tokens(SeqId s) const;
  // Tokens whose KV is written and verified (prefix hits count); full blocks below it are hashed.
  [[nodiscard]] int64_t num_computed(SeqId s) const;

  // The longest run of leading full blocks of `prompt` (at most max_blocks) the cache can serve,
  // never the block holding the prompt's last token (its logits must be computed). Where the
  // prompt needs a block in FP16 (sink or window at the prompt's length) only an FP16 entry hits;
  // where it needs the body format a body entry hits, else an FP16 entry (to be quantised: see
  // migrate). Tokens and the parent hash are re-checked on every hit. Changes nothing.
  // A local (sliding-window) group serves h blocks when it holds the blocks the window of the
  // first computed token reaches, [local_window_first_block(h), h); the blocks before them are
  // null entries (dropped at once, never read). It returns the largest such h <= max_blocks.
  [[nodiscard]] PrefixHit lookup_prefix(std::span<const int32_t> prompt,
                                        int64_t max_blocks = INT64_MAX) const;
  // servable[h] (h = 0 .. (prompt.size() - 1) / block_size): whether lookup_prefix could return
  // exactly h blocks. Global groups: h up to the longest hit; local groups: any h whose window
  // blocks are all cached. A store of several groups takes the largest h every group serves.
  [[nodiscard]] std::vector<bool> servable_prefixes(std::span<const int32_t> prompt) const;
  // The first block a pass starting at token h * block_size reads in a local group (0: global).
  [[nodiscard]] int64_t local_window_first_block(int64_t h) const;

  [[nodiscard]] bool can_allocate(std::span<const int32_t> prompt,
                                  int64_t max_hit_blocks = INT64_MAX) const;
  // Blocks allocate(prompt, max_hit_blocks) would take from each pool: new ones, and cached
  // (unreferenced) hits it would pin.
  [[nodiscard]] BlockNeeds allocation_needs(std::span<const int32_t> prompt,
                                            int64_t max_hit_blocks = INT64_MAX) const;
  // Starts sequence s with its prompt: maps the cached prefix (at most max_hit_blocks blocks)
  // and allocates blocks for the rest of the prompt, each in the pool its role at the prompt's
  // length asks for. Returns the number of prompt tokens served from cache (num_computed). FP16
  // hits that the prompt needs in the body format show up in blocks_leaving_window(s) at once.
  [[nodiscard]] Result<int64_t> allocate(SeqId s, std::span<const int32_t> prompt,
                                         int64_t max_hit_blocks = INT64_MAX);

  [[nodiscard]] bool can_append(SeqId s, int64_t n_tokens) const;
  // Appends tokens (decoded, or draft tokens to verify): allocates the new blocks (role at the new
  // length) and makes the partly filled last block private first. Returns the copies the caller
  // must execute before writing (at most one: copy-on-write of a shared last block).
  [[nodiscard]] Result<std::vector<KvCopy>> append(SeqId s, std::span<const int32_t> tokens);

  // Marks tokens [0, n) as written and verified; full blocks among them enter the prefix cache.
  // Call it after a forward pass with the accepted count (never for unverified draft tokens).
  [[nodiscard]] Status mark_computed(SeqId s, int64_t n);

  // Blocks of s that are FP16 but whose role is now body, or that a sliding window no longer
  // keeps, in logical order, excluding blocks with a migration in flight.
  [[nodiscard]] std::vector<WindowExit> blocks_leaving_window(SeqId s) const;

  // FP16 -> body, in two steps so the data work happens in between:
  //   begin_migration takes a body block for the logical block (a body prefix-cache hit if one
  //   holds the same content, else a fresh block) and fails, changing nothing, if none is left;
  //   the caller quantises src into dst when needs_quantise;
  //   migrate points the table at dst, enters dst in the prefix cache, releases the FP16 block
  //   (it returns to the free list, or the LRU if cached) and returns that FP16 block.
  [[nodiscard]] Result<Migration> begin_migration(SeqId s, int64_t logical);
  [[nodiscard]] Result<BlockRef> migrate(SeqId s, int64_t logical, BlockRef dst);
  [[nodiscard]] Status abort_migration(SeqId s, int64_t logical);

  // Releases a block a sliding window no longer keeps; its table entry becomes the null block.
  [[nodiscard]] Result<BlockRef> drop(SeqId s, int64_t logical);

  // Child shares every block of parent (ref counts + 1): speculative branches, n > 1 sampling.
  [[nodiscard]] Status fork(SeqId parent, SeqId child);

  // Rolls s back to n tokens (rejected draft tokens). Only FP16 window blocks may be cut or made
  // partial; whole blocks past n are released (tail first). Fails, changing nothing, if it would
  // touch a body block or a dropped block, or while a migration of s is in flight.
  [[nodiscard]] Status truncate(SeqId s, int64_t n);

  // Ends s (finished or preempted): aborts its migrations and releases its blocks in reverse
  // order, so cached tails are evicted before the prefixes they hang off.
  [[nodiscard]] Status free(SeqId s);

  // Verifies every invariant: each pool's lists and states; ref counts = table entries +
  // migrations; no stale or null entries where a block is kept; entry pools match roles; the
  // prefix index and the pools' keys agree; chain hashes and cached tokens match sequences.
  [[nodiscard]] Status check_integrity() const;

 private:
  friend struct BlockManagerTestPeer;  // tests corrupt state to exercise check_integrity
  struct SeqState {
    std::vector<int32_t> tokens;
    BlockTable table;
    std::vector<uint64_t> chains;  // chain hashes of blocks [0, chains.size()): full and computed
    int64_t computed = 0;
  };
  struct PendingMigration {
    SeqId seq = 0;
    int64_t logical = 0;
    BlockRef dst;
  };
  struct IndexEntry {
    PoolKind pool = PoolKind::kBody;
    BlockIndex block = kNullBlock;
    uint64_t chain = 0;  // the block's chain hash (what KV events name it by)
  };
  // The prefix index, shared with the pools' evict listeners (a pool giving pages back to a
  // shared budget evicts cached blocks and drops their keys here), so it outlives moves.
  struct PrefixIndex {
    std::unordered_map<uint64_t, IndexEntry> map;  // key -> block holding that content
    int64_t budget_evictions = 0;
    KvEventSink* events = nullptr;
    std::array<std::string, kPoolKinds> medium;  // per pool, for events
    // Drops key from the map, reporting the block's removal.
    void erase(uint64_t key);
  };

  explicit BlockManager(const BlockManagerConfig& cfg);
  [[nodiscard]] bool caching() const { return cfg_.enable_prefix_caching; }
  // Per leading full block of prompt (never the last token's): the cached entry lookup_prefix
  // would take, its chain hash and whether it is an FP16 entry the prompt needs in the body
  // format. A global group stops at its first miss; a local group probes every block.
  struct Probe {
    std::vector<std::optional<BlockTableEntry>> found;
    std::vector<uint64_t> chains;
    std::vector<bool> quantise;
    // after_miss[h] (h = 0 .. found.size()): one past the last block in [0, h) that missed, or 0.
    std::vector<int64_t> after_miss{0};
    // Whether blocks [first_block, h) are all cached (O(1)).
    [[nodiscard]] bool serves(int64_t h, int64_t first_block) const {
      return h < static_cast<int64_t>(after_miss.size()) &&
             after_miss[static_cast<size_t>(h)] <= first_block;
    }
  };
  [[nodiscard]] Probe probe_prefix(std::span<const int32_t> prompt) const;
  [[nodiscard]] uint64_t key_for(PoolKind p, uint64_t chain) const;
  [[nodiscard]] PoolKind alloc_pool(int64_t logical, int64_t n) const;
  [[nodiscard]] std::optional<BlockTableEntry> find_cached(PoolKind p, uint64_t chain,
                                                           uint64_t parent,
                                                           std::span<const int32_t> toks) const;
  [[nodiscard]] Result<BlockRef> allocate_block(PoolKind p);
  void release_block(const BlockTableEntry& e);
  void register_block(const BlockTableEntry& e, uint64_t chain, uint64_t parent,
                      std::span<const int32_t> toks);
  void unregister_block(const BlockTableEntry& e);
  [[nodiscard]] bool fits(const std::array<int64_t, kPoolKinds>& need,
                          const std::array<int64_t, kPoolKinds>& pinned) const;
  [[nodiscard]] const PendingMigration* find_pending(SeqId s, int64_t logical) const;

  BlockManagerConfig cfg_;
  std::array<std::unique_ptr<BlockPool>, kPoolKinds> pools_;
  std::array<planner::KvFormat, kPoolKinds> fmt_k_;
  std::array<planner::KvFormat, kPoolKinds> fmt_v_;
  uint64_t root_ = 0;
  std::unordered_map<SeqId, SeqState> seqs_;
  std::shared_ptr<PrefixIndex> index_ = std::make_shared<PrefixIndex>();
  std::vector<PendingMigration> pending_;
  PrefixCacheStats stats_;
};

// One manager per layer group of the plan, pools sized exactly as planner::kv_pool_plan says
// (reserved_bytes() summed over the managers equals plan.total_bytes()).
[[nodiscard]] Result<std::vector<BlockManager>> make_block_managers(
    const planner::KvPoolPlan& plan, const planner::KvLayout& layout, const std::string& model_id,
    bool enable_prefix_caching = true);

}  // namespace bie::kv
