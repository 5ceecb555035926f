// PagedKvStore: the paged, mixed-precision KV storage shared by every sequence of an engine.
// Its KvCoordinator (kv_coordinator.h) decides, across the layer groups, which blocks each
// sequence holds and when blocks move (prefix hits, appends, window exits, sliding-window drops);
// the store owns what those blocks hold and executes the coordinator's KvWork lists on it:
// K/V rows are written into FP16 sink/window blocks (or straight into body blocks that lie
// outside the window), blocks that leave the window are re-quantised into the body pool,
// copy-on-write copies are made. The pools' memory is host memory reserved by the block pools,
// or a device backend's buffers (PagedKvStoreConfig::device). It runs no attention: host_blocks
// describes a sequence's blocks of a layer (its group's block table) for the attention runner in
// attention/, and on a device store attention() is the backend's paged_attention. Every group
// holds the same tokens of every sequence.
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
// cache and hit while their memory is not reused). The coordinator takes the largest such h.
// docs/kv-cache.md §"Sliding-window layers".
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "bie/kv/kv_block_view.h"
#include "bie/kv/kv_cache.h"
#include "bie/kv/kv_coordinator.h"
#include "bie/kv/kv_format.h"

namespace bie {

// The coordinator's configuration (geometry, layout, pool sizes, prefix caching, budget, events)
// and where the pools' memory lives.
struct PagedKvStoreConfig : kv::KvCoordinatorConfig {
  // Pools in this backend's memory (a backend that supports_paged_kv() and the layout's formats):
  // K/V writes, attention, copy-on-write copies and window exits run as its operations, and no
  // block data is held on the host. nullptr: pools in host memory, kernels of attention/.
  Backend* device = nullptr;
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

  // Read-only storage of a table entry's block of the lead group, or of group g (tests and tools;
  // nullptr on a device store).
  [[nodiscard]] const uint8_t* block_storage(const kv::BlockTableEntry& e) const {
    return coord_->manager().pool(e.pool).data(e.block.index);
  }
  [[nodiscard]] const uint8_t* block_storage(int g, const kv::BlockTableEntry& e) const {
    return coord_->manager(g).pool(e.pool).data(e.block.index);
  }
  // The coordinator's integrity check, and the first failure of a void call (store / attend on
  // a device store, attend on a host store).
  [[nodiscard]] Status check_integrity() const;

 private:
  struct PoolFormat {
    planner::KvFormat k, v;
    const kv::KvFormatTraits* tk = nullptr;
    const kv::KvFormatTraits* tv = nullptr;
    size_t k_tile = 0, v_tile = 0;  // bytes of one KV head's tile
    size_t layer_bytes = 0;         // n_head_kv * (k_tile + v_tile)
  };
  explicit PagedKvStore(const PagedKvStoreConfig& cfg);
  void set_formats();  // fmt_ from the coordinator's groups
  [[nodiscard]] const PoolFormat& format(int g, kv::PoolKind p) const {
    return fmt_[static_cast<size_t>(g)][static_cast<size_t>(p)];
  }
  [[nodiscard]] uint8_t* block_data(int g, const kv::BlockTableEntry& e);
  [[nodiscard]] Status copy_block(int g, const kv::KvCopy& c);
  [[nodiscard]] Status quantise_block(int g, kv::BlockRef src, kv::BlockRef dst, int rows);
  // Device pools: allocates each group's pools in cfg_.device's memory.
  [[nodiscard]] Status alloc_device_pools();
  // The backend's name for table entry e of group g.
  [[nodiscard]] static KvBlockRef device_ref(const kv::BlockTableEntry& e);
  // A device staging tensor of rows x cols F32 for host calls on a device store (slot 0..3).
  [[nodiscard]] Result<Tensor> staging(int slot, int64_t rows, int64_t cols);

  PagedKvStoreConfig cfg_;
  std::unique_ptr<kv::KvCoordinator> coord_;
  std::vector<std::array<PoolFormat, kv::kPoolKinds>> fmt_;  // [group][pool kind]
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
