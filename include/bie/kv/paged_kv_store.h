// PagedKvStore: the paged, mixed-precision KV storage shared by every sequence of an engine.
// Owns one BlockManager per layer group (block pools, block tables, ref counts, prefix-cache
// index; planner::kv_pool_plan's groups: all layers for a model without sliding windows, else one
// group of global layers and one of local layers per window) and executes what the managers
// decide on the pools' memory: K/V rows are written into FP16 sink/window blocks (or straight
// into body blocks that lie outside the window), blocks that leave the window are re-quantised
// into the body pool, blocks a local group's sliding window no longer reaches are dropped after
// the pass, copy-on-write copies are made. It runs no attention: host_blocks describes a
// sequence's blocks of a layer (its group's block table) for the attention runner in attention/,
// and on a device store attention() is the backend's paged_attention. Every group holds the same
// tokens of every sequence.
// With layout.rotate, K rows pass through kv::hadamard_rotate per head (V does not); the
// attention runner or the device rotates the queries.
// Not thread-safe (engine thread).
//
// Block layout (every pool): per layer of the group (in layer order), the K tiles of KV heads
// 0..n_head_kv-1, then the V tiles; a tile is kv::kv_tile_bytes(format, head_dim, block_size)
// bytes, so a block is exactly the planner's group block bytes. FP16-pool blocks are f16/f16;
// body blocks use layout.k / layout.v.
//
// Prefix caching with local groups: every group keeps its own prefix index; a hit of h blocks
// is taken only when every group serves it — global groups hold blocks [0, h), local groups the
// blocks the window of token h * block_size reaches (blocks a window dropped return to the pool's
// cache and hit while their memory is not reused). The store takes the largest such h.
// docs/kv-cache.md §"Sliding-window layers".
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "bie/kv/block_manager.h"
#include "bie/kv/kv_block_view.h"
#include "bie/kv/kv_cache.h"
#include "bie/kv/kv_format.h"

namespace bie {

struct PagedKvStoreConfig {
  KvGeometry geometry;
  planner::KvLayout layout;  // body formats, block size, sink and window tokens
  int64_t fp16_blocks = 0;   // pool sizes of a one-group geometry (see planner::kv_pool_plan)
  int64_t body_blocks = 0;
  // Pool sizes per layer group, in planner::kv_pool_plan's order; required when the geometry has
  // sliding-window layers (then fp16_blocks/body_blocks are ignored).
  std::vector<planner::KvGroupPool> groups;
  std::string model_id = "bie-paged-kv";  // keys the prefix cache (e.g. the model's sha256)
  bool enable_prefix_caching = false;
  // Shared byte budget (several stores, one per KV regime): the pools draw on it and
  // fp16_blocks/body_blocks/groups are ignored (kv::BlockManagerConfig::budget); every group's
  // manager draws on it.
  kv::MemoryBudget* budget = nullptr;
  // With a budget: the pools hold exactly fp16_blocks/body_blocks/groups (the budget still bounds
  // what is active). A device allocates its pools up front, so it holds the plan's pools instead
  // of ids for the whole budget in every pool (kv::BlockManagerConfig::sizes_as_given).
  bool pools_as_given = false;
  // KV events of every group's prefix index (kv::BlockManagerConfig::events); a store of several
  // layer groups names them "<events_medium>/g<group>/<pool>".
  kv::KvEventSink* events = nullptr;
  std::string events_medium = "kv";
  // Pools in this backend's memory (a backend that supports_paged_kv() and the layout's formats):
  // K/V writes, attention, copy-on-write copies and window exits run as its operations, and no
  // block data is held on the host. nullptr: pools in host memory, kernels of attention/.
  Backend* device = nullptr;
};

class PagedKvStore {
 public:
  // Checks the layout (formats with kernels, int4_channel tiles equal to the block size, a window
  // of at least one token when keys are per-channel) and reserves the pools.
  [[nodiscard]] static Result<std::unique_ptr<PagedKvStore>> create(const PagedKvStoreConfig& cfg);
  // Pools that hold max_num_seqs sequences of max_tokens each, appended in passes of up to
  // chunk_tokens tokens (planner::kv_pool_plan, with the local groups' pass headroom).
  [[nodiscard]] static Result<PagedKvStoreConfig> planned_config(const KvGeometry& geometry,
                                                                 const planner::KvLayout& layout,
                                                                 int64_t max_tokens,
                                                                 int64_t max_num_seqs,
                                                                 int64_t chunk_tokens);

  ~PagedKvStore();
  PagedKvStore(const PagedKvStore&) = delete;
  PagedKvStore& operator=(const PagedKvStore&) = delete;

  [[nodiscard]] const KvGeometry& geometry() const { return cfg_.geometry; }
  [[nodiscard]] const planner::KvLayout& layout() const { return cfg_.layout; }
  // The lead manager: the first group of global layers (the prefix cache, token ids, computed
  // counts and block tables the scheduler reads); group 0 if every layer is local.
  [[nodiscard]] kv::BlockManager& manager() { return *groups_[lead_].mgr; }
  [[nodiscard]] const kv::BlockManager& manager() const { return *groups_[lead_].mgr; }
  [[nodiscard]] int n_groups() const { return static_cast<int>(groups_.size()); }
  [[nodiscard]] kv::BlockManager& manager(int g) { return *groups_[static_cast<size_t>(g)].mgr; }
  [[nodiscard]] const kv::BlockManager& manager(int g) const {
    return *groups_[static_cast<size_t>(g)].mgr;
  }
  // Sliding window of group g's layers (0: global) and the group of layer il.
  [[nodiscard]] int64_t group_window(int g) const { return groups_[static_cast<size_t>(g)].window; }
  [[nodiscard]] int layer_group(int il) const { return slots_[static_cast<size_t>(il)].group; }
  [[nodiscard]] bool has_local_groups() const;
  // Address space every group's pools reserve.
  [[nodiscard]] uint64_t reserved_bytes() const;

  // ---- sequence state across every group -------------------------------------------------
  [[nodiscard]] bool has_sequence(kv::SeqId s) const { return manager().has_sequence(s); }
  // Ends s in every group (kv::BlockManager::free).
  [[nodiscard]] Status free(kv::SeqId s);
  // Rolls s back to n tokens in every group (kv::BlockManager::truncate). Fails, changing
  // nothing, where any group refuses, or where a local group already dropped a block its window
  // at n tokens would keep (a rollback further back than the draft tokens).
  [[nodiscard]] Status truncate(kv::SeqId s, int64_t n);
  // kv::BlockManager::mark_computed in every group.
  [[nodiscard]] Status mark_computed(kv::SeqId s, int64_t n);

  // ---- block bookkeeping with the data work it implies --------------------------------------
  // Whether `n` more tokens fit for sequence s, which holds `written` tokens' K/V (a dry run of
  // append_tokens, migrations included). A sequence not started yet: can_start with placeholder
  // tokens (no prefix hits).
  // migrate = false (speculative draft tokens, which may be rolled back): no block leaves the
  // FP16 window for them; the window exits happen with the next append of verified tokens.
  [[nodiscard]] bool can_append(kv::SeqId s, int64_t written, int64_t n, bool migrate = true) const;
  // Whether a new sequence starting with `tokens` fits, its prefix hits counted (append_tokens'
  // dry run for a sequence not started yet).
  [[nodiscard]] bool can_start(std::span<const int32_t> tokens) const;
  // Prompt tokens the prefix cache serves in every group (a multiple of the block size).
  [[nodiscard]] int64_t prefix_hit_tokens(std::span<const int32_t> prompt) const;
  // Appends tokens to s (starting it with allocate when new) in pieces up to block boundaries and,
  // between pieces, moves every block that has left the FP16 window to the body pool (written
  // blocks re-quantised), so pools planned for a sequence's peak hold any chunking. Copy-on-write
  // copies are executed. Returns the tokens served from the prefix cache (new sequences only).
  [[nodiscard]] Result<int64_t> append_tokens(kv::SeqId s, int64_t written,
                                              std::span<const int32_t> tokens, bool migrate = true);
  // After a forward pass over s (`written` tokens stored): quantises every block that has left
  // the FP16 window into the body pool and frees its FP16 block (partly written per-channel tiles
  // wait), and drops the blocks of local groups that their sliding window no longer keeps at the
  // sequence's length. note: call it after a pass of verified tokens only (no draft tokens held),
  // or a rollback could need a dropped block.
  [[nodiscard]] Status migrate_exits(kv::SeqId s, int64_t written);
  // Executes group g's copy-on-write copies.
  [[nodiscard]] Status execute_copies(int g, std::span<const kv::KvCopy> copies);

  // ---- data ------------------------------------------------------------------------------
  // Whether the pools live in a device backend's memory (PagedKvStoreConfig::device).
  [[nodiscard]] bool on_device() const { return cfg_.device != nullptr; }
  // A host store: layer il's blocks of s for a pass ending at n_ctx tokens (KvCache::host_blocks;
  // valid until the next call or block change). A device store: empty.
  [[nodiscard]] kv::HostKvBlocks host_blocks(kv::SeqId s, int il, int64_t n_ctx);
  // store / attention on backend tensors (k, v, q, out: the sequence's rows, F32). On a device
  // store they are kv_write / paged_attention operations on the device. On a host store write
  // waits for the backend and runs store on the tensors' host memory; attention is refused (the
  // attention runner reads host_blocks).
  [[nodiscard]] Status write(kv::SeqId s, int il, int64_t pos0, const Tensor& k, const Tensor& v,
                             Backend& backend);
  [[nodiscard]] Status attention(kv::SeqId s, int il, int64_t pos0, const Tensor& q, int n_head,
                                 float scale, const Tensor& out, Backend& backend,
                                 int64_t window = 0);
  // Host-memory data path (host stores; on a device store store stages through device buffers).
  // note: positions [pos0, pos0 + n) must be allocated for s.
  void store(kv::SeqId s, int il, int64_t pos0, int64_t n, const float* k, const float* v);
  // A device store: causal attention of n queries at positions [pos0, pos0 + n) of s over
  // [0, pos0 + i], or with window > 0 over [max(0, pos0 + i - window + 1), pos0 + i], staged
  // through device buffers. A host store refuses it (reported by check_integrity).
  void attend(kv::SeqId s, int il, int64_t pos0, int64_t n, const float* q, int n_head, float scale,
              float* out, int64_t window = 0);

  // Bytes of the blocks held by sequences (active blocks of both pools of every group).
  [[nodiscard]] uint64_t held_bytes() const;
  // Read-only storage of a table entry's block (tests and tools; nullptr on a device store).
  [[nodiscard]] const uint8_t* block_storage(const kv::BlockTableEntry& e) const {
    return groups_[lead_].mgr->pool(e.pool).data(e.block.index);
  }
  // The same for a table entry of group g.
  [[nodiscard]] const uint8_t* block_storage(int g, const kv::BlockTableEntry& e) const {
    return groups_[static_cast<size_t>(g)].mgr->pool(e.pool).data(e.block.index);
  }
  // check_integrity also reports the first failure of a void call (store / attend on a device
  // store, attend on a host store).
  [[nodiscard]] Status check_integrity() const;

 private:
  struct PoolFormat {
    planner::KvFormat k, v;
    const kv::KvFormatTraits* tk = nullptr;
    const kv::KvFormatTraits* tv = nullptr;
    size_t k_tile = 0, v_tile = 0;  // bytes of one KV head's tile
    size_t layer_bytes = 0;         // n_head_kv * (k_tile + v_tile)
  };
  struct Group {
    std::unique_ptr<kv::BlockManager> mgr;
    int64_t window = 0;  // sliding window of its layers (0: global)
    int n_layers = 0;
  };
  struct LayerSlot {
    int group = 0;
    int index = 0;  // the layer's place within its group's block
  };
  explicit PagedKvStore(const PagedKvStoreConfig& cfg);
  [[nodiscard]] const PoolFormat& format(kv::PoolKind p) const { return fmt_[static_cast<int>(p)]; }
  [[nodiscard]] uint8_t* block_data(int g, const kv::BlockTableEntry& e);
  [[nodiscard]] Status quantise_block(int g, const kv::Migration& m, int rows);
  // The manager appends an append of n tokens to s (holding `written` tokens) makes in group g:
  // first up to a block boundary, then one block at a time; nullopt when the pools cannot hold
  // them with the migrations in between. *budget_bytes (a shared budget's bytes left, carried
  // from group to group) is updated.
  [[nodiscard]] std::optional<std::vector<int64_t>> plan_append(int g, kv::SeqId s, int64_t written,
                                                                int64_t n, bool migrate,
                                                                uint64_t* budget_bytes) const;
  [[nodiscard]] int64_t prefix_hit_blocks(std::span<const int32_t> prompt) const;
  // FP16 -> body moves of group g, and with drop also sliding-window drops.
  [[nodiscard]] Status move_exits(int g, kv::SeqId s, int64_t written, bool drop);
  // Whether a block with `written` of its rows stored may move to the body pool now.
  [[nodiscard]] bool can_migrate_now(int64_t written_rows) const;
  // Device pools: allocates each group's pools in cfg_.device's memory.
  [[nodiscard]] Status alloc_device_pools();
  // The backend's name for table entry e of group g.
  [[nodiscard]] static KvBlockRef device_ref(const kv::BlockTableEntry& e);
  // A device staging tensor of rows x cols F32 for host calls on a device store (slot 0..3).
  [[nodiscard]] Result<Tensor> staging(int slot, int64_t rows, int64_t cols);

  PagedKvStoreConfig cfg_;
  std::vector<Group> groups_;
  std::vector<LayerSlot> slots_;  // [n_layer]
  size_t lead_ = 0;
  std::array<PoolFormat, kv::kPoolKinds> fmt_;
  std::vector<float> rows_;             // [block_size, head_dim] staging for store
  std::vector<kv::KvBlockView> views_;  // per logical block, rebuilt per host_blocks
  // Device store: per group, the pools' descriptions in kv::PoolKind order (their memory in
  // device_buffers_), and staging buffers for host calls.
  std::vector<std::array<KvPoolDesc, kv::kPoolKinds>> device_pools_;
  std::vector<std::unique_ptr<DeviceBuffer>> device_buffers_;
  std::array<std::unique_ptr<DeviceBuffer>, 4> staging_;
  std::vector<KvSlot> slots_buf_;
  std::vector<KvBlockRef> table_buf_;
  std::string device_error_;  // sticky: the first failed void call (check_integrity)
};

}  // namespace bie
