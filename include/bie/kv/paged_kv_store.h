// PagedKvStore: the paged, mixed-precision KV storage shared by every sequence of an engine.
// Its KvCoordinator (kv_coordinator.h) decides, across the layer groups, which blocks each
// sequence holds and when blocks move (prefix hits, appends, window exits, sliding-window drops);
// the store owns what those blocks hold and executes the coordinator's KvWork lists on it:
// K/V rows are written into FP16 sink/window blocks (or straight into body blocks that lie
// outside the window), blocks that leave the window are re-quantised into the body pool,
// copy-on-write copies are made. The pools are the backend's memory (PagedKvStoreConfig::backend:
// address space committed block by block on the CPU, buffers allocated up front on a device), and
// every piece of data work is one of the backend's KV operations (kv_write, copy_blocks,
// quantise_blocks) on the pools' descriptions: the store runs no kernel of its own. It runs no
// attention either: paged_layer describes a sequence's blocks of a layer for the attention
// runner in attention/, which calls the backend's paged_attention.
// Every group holds the same tokens of every sequence.
// With layout.rotate, K rows are stored Hadamard-rotated per head (V is not); the backend rotates
// them as it writes them and rotates the queries.
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
// cache and hit while their memory is not reused). The coordinator takes the largest such h.
// docs/kv-cache.md §"Sliding-window layers".
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "bie/backend/kv_block_view.h"
#include "bie/backend/kv_format.h"
#include "bie/kv/kv_cache.h"
#include "bie/kv/kv_coordinator.h"

namespace bie {

// The coordinator's configuration (geometry, layout, pool sizes, prefix caching, budget, events)
// and the backend that holds the pools.
struct PagedKvStoreConfig : kv::KvCoordinatorConfig {
  // The pools live in this backend's memory (one that supports_paged_kv() and the layout's
  // formats; Backend::reserves_on_demand decides whether they commit as they fill or are allocated
  // whole), and K/V writes, attention, copy-on-write copies and window exits run as its
  // operations. It must outlive the store. nullptr: a CPU backend of the store's own (tests and
  // tools).
  Backend* backend = nullptr;
};

class PagedKvStore {
 public:
  // Checks the layout (formats with kernels, int4_channel tiles equal to the block size, a window
  // of at least one token when keys are per-channel), creates the coordinator and reserves the
  // pools.
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
  // The decisions: which blocks each sequence holds, in every layer group.
  [[nodiscard]] kv::KvCoordinator& coordinator() { return *coord_; }
  [[nodiscard]] const kv::KvCoordinator& coordinator() const { return *coord_; }

  // ---- decisions with their data work, for single-sequence callers ------------------------
  // coordinator().append, then its work executed.
  [[nodiscard]] Result<int64_t> append_tokens(kv::SeqId s, int64_t written,
                                              std::span<const int32_t> tokens, bool migrate = true);
  // coordinator().finish_pass, then its work executed: window exits and sliding-window drops of s
  // after a pass of verified tokens (`written` stored).
  [[nodiscard]] Status finish_pass(kv::SeqId s, int64_t written);

  // ---- data ------------------------------------------------------------------------------
  // Runs the coordinator's data work on the pools, in order (copies, quantisations).
  [[nodiscard]] Status execute(const kv::KvWork& work);
  // The backend that holds the pools and runs their operations.
  [[nodiscard]] Backend& backend() const { return *backend_; }
  // Layer il's blocks of s for a pass ending at n_ctx tokens, where the pools are host-visible
  // (KvCache::host_blocks; valid until the next call or block change); else empty.
  [[nodiscard]] kv::HostKvBlocks host_blocks(kv::SeqId s, int il, int64_t n_ctx);
  // Layer il's blocks of s for a pass ending at n_ctx tokens (KvCache::paged_layer; valid until
  // the next call or block change). A block a sliding window dropped names a block of a pool that
  // holds blocks; no query reads it.
  [[nodiscard]] kv::PagedKvLayer paged_layer(kv::SeqId s, int il, int64_t n_ctx);
  // kv_write of s's K/V rows (F32 tensors the store's backend can read: its own, or host memory
  // on the CPU) at positions [pos0, pos0 + rows). `backend` is the caller's, synchronised before
  // the store's operation runs when it is another one.
  [[nodiscard]] Status write(kv::SeqId s, int il, int64_t pos0, const Tensor& k, const Tensor& v,
                             Backend& backend);
  // The same from host memory, staged through the backend's buffers (tests and tools); a failure
  // is reported by check_integrity.
  // note: positions [pos0, pos0 + n) must be allocated for s.
  void store(kv::SeqId s, int il, int64_t pos0, int64_t n, const float* k, const float* v);

  // Read-only storage of a table entry's block of the lead group, or of group g (tests and tools;
  // nullptr where the pools are not host memory committed by the block pools).
  [[nodiscard]] const uint8_t* block_storage(const kv::BlockTableEntry& e) const {
    return coord_->manager().pool(e.pool).data(e.block.index);
  }
  [[nodiscard]] const uint8_t* block_storage(int g, const kv::BlockTableEntry& e) const {
    return coord_->manager(g).pool(e.pool).data(e.block.index);
  }
  // The coordinator's integrity check, and the first failure of store.
  [[nodiscard]] Status check_integrity() const;

 private:
  struct PoolFormat {
    planner::KvFormat k, v;
    size_t k_tile = 0, v_tile = 0;  // bytes of one KV head's tile
    size_t layer_bytes = 0;         // n_head_kv * (k_tile + v_tile)
  };
  explicit PagedKvStore(const PagedKvStoreConfig& cfg);
  void set_formats();  // fmt_ from the coordinator's groups
  [[nodiscard]] const PoolFormat& format(int g, kv::PoolKind p) const {
    return fmt_[static_cast<size_t>(g)][static_cast<size_t>(p)];
  }
  [[nodiscard]] Status copy_block(int g, const kv::KvCopy& c);
  [[nodiscard]] Status quantise_block(int g, kv::BlockRef src, kv::BlockRef dst, int rows);
  // Allocates each group's pools in the backend's memory (reserved and attached to the block
  // pools, or allocated whole in parts).
  [[nodiscard]] Status alloc_pools();
  // The backend's name for table entry e of group g.
  [[nodiscard]] static KvBlockRef block_ref(const kv::BlockTableEntry& e);
  // A staging tensor of rows x cols F32 in the backend's memory for store (slot 0..1).
  [[nodiscard]] Result<Tensor> staging(int slot, int64_t rows, int64_t cols);

  PagedKvStoreConfig cfg_;
  std::unique_ptr<Backend> own_backend_;  // when cfg_.backend is nullptr
  Backend* backend_ = nullptr;
  // The pools' memory, declared before the coordinator so that it outlives the block pools.
  std::vector<std::unique_ptr<DeviceBuffer>> pool_buffers_;
  std::unique_ptr<kv::KvCoordinator> coord_;
  std::vector<std::array<PoolFormat, kv::kPoolKinds>> fmt_;  // [group][pool kind]
  std::vector<kv::KvBlockView> pool_views_;                  // host_blocks' scratch: per pool
  std::vector<kv::KvBlockView> views_;  // per logical block, rebuilt per host_blocks
  // Per group, the pools' descriptions in kv::PoolKind order (their memory in pool_buffers_).
  std::vector<std::array<KvPoolDesc, kv::kPoolKinds>> pools_;
  std::array<std::unique_ptr<DeviceBuffer>, 2> staging_;
  std::vector<KvSlot> slots_buf_;
  std::vector<KvBlockRef> table_buf_;
  std::string error_;  // sticky: the first failed void call (check_integrity)
};

}  // namespace bie
