// PagedKvStore: the paged, mixed-precision KV storage shared by every sequence of an engine.
// Owns a BlockManager (block pools, block tables, ref counts, prefix-cache index) and executes
// what the manager decides on the pools' memory: K/V rows are written into FP16 sink/window
// blocks (or straight into body blocks that lie outside the window), blocks that leave the window
// are re-quantised into the body pool, copy-on-write copies are made, and attention walks a
// sequence's block table with the formats' fused dot/axpy kernels (attention/paged_attention.h)
// as (query tile x KV head x context split) tasks on the ThreadPool.
// With layout.rotate, K rows and queries pass through kv::hadamard_rotate per head (V does not).
// Not thread-safe (engine thread); attend() fans out over the ThreadPool it is given.
//
// Block layout (every pool): per layer il, the K tiles of KV heads 0..n_head_kv-1, then the V
// tiles; a tile is kv::kv_tile_bytes(format, head_dim, block_size) bytes, so a block is exactly the
// planner's block bytes. FP16-pool blocks are f16/f16; body blocks use layout.k / layout.v.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "bie/attention/paged_attention.h"
#include "bie/kv/block_manager.h"
#include "bie/kv/kv_cache.h"

namespace bie {

struct PagedKvStoreConfig {
  KvGeometry geometry;
  planner::KvLayout layout;  // body formats, block size, sink and window tokens
  int64_t fp16_blocks = 0;   // pool sizes (see planner::kv_pool_plan)
  int64_t body_blocks = 0;
  std::string model_id = "bie-paged-kv";  // keys the prefix cache (e.g. the model's sha256)
  bool enable_prefix_caching = false;
  // Shared byte budget (several stores, one per KV regime): the pools draw on it and
  // fp16_blocks/body_blocks are ignored (kv::BlockManagerConfig::budget).
  kv::MemoryBudget* budget = nullptr;
};

class PagedKvStore {
 public:
  // Checks the layout (formats with kernels, int4_channel tiles equal to the block size, a window
  // of at least one token when keys are per-channel) and reserves the pools.
  [[nodiscard]] static Result<std::unique_ptr<PagedKvStore>> create(const PagedKvStoreConfig& cfg);
  // Pools that hold max_num_seqs sequences of max_tokens each (planner::kv_pool_plan).
  [[nodiscard]] static Result<PagedKvStoreConfig> planned_config(const KvGeometry& geometry,
                                                                 const planner::KvLayout& layout,
                                                                 int64_t max_tokens,
                                                                 int64_t max_num_seqs);

  [[nodiscard]] const KvGeometry& geometry() const { return cfg_.geometry; }
  [[nodiscard]] const planner::KvLayout& layout() const { return cfg_.layout; }
  [[nodiscard]] kv::BlockManager& manager() { return *mgr_; }
  [[nodiscard]] const kv::BlockManager& manager() const { return *mgr_; }

  // ---- block bookkeeping with the data work it implies --------------------------------------
  // Whether `n` more tokens fit for sequence s, which holds `written` tokens' K/V (a dry run of
  // append_tokens, migrations included). A sequence not started yet: can_allocate.
  // migrate = false (speculative draft tokens, which may be rolled back): no block leaves the
  // FP16 window for them; the window exits happen with the next append of verified tokens.
  [[nodiscard]] bool can_append(kv::SeqId s, int64_t written, int64_t n, bool migrate = true) const;
  // Appends tokens to s (starting it with allocate when new) in pieces up to block boundaries and,
  // between pieces, moves every block that has left the FP16 window to the body pool (written
  // blocks re-quantised), so pools planned for a sequence's peak hold any chunking. Copy-on-write
  // copies are executed. Returns the tokens served from the prefix cache (new sequences only).
  [[nodiscard]] Result<int64_t> append_tokens(kv::SeqId s, int64_t written,
                                              std::span<const int32_t> tokens, bool migrate = true);
  // Quantises every block of s that has left the FP16 window (`written` tokens stored) into the
  // body pool and frees its FP16 block. Partly written per-channel tiles wait.
  [[nodiscard]] Status migrate_exits(kv::SeqId s, int64_t written);
  void execute_copies(std::span<const kv::KvCopy> copies);

  // ---- data ------------------------------------------------------------------------------
  // note: positions [pos0, pos0 + n) must be allocated for s.
  void store(kv::SeqId s, int il, int64_t pos0, int64_t n, const float* k, const float* v);
  // Causal attention of n queries at positions [pos0, pos0 + n) of s over [0, pos0 + i], or with
  // window > 0 over [max(0, pos0 + i - window + 1), pos0 + i] (sliding window; blocks wholly
  // before a tile's window are not read, but they stay allocated).
  void attend(kv::SeqId s, int il, int64_t pos0, int64_t n, const float* q, int n_head, float scale,
              float* out, ThreadPool& pool, int64_t window = 0);

  // Bytes of the blocks held by sequences (active blocks of both pools).
  [[nodiscard]] uint64_t held_bytes() const;
  // Read-only storage of a table entry's block (tests and tools).
  [[nodiscard]] const uint8_t* block_storage(const kv::BlockTableEntry& e) const {
    return mgr_->pool(e.pool).data(e.block.index);
  }
  [[nodiscard]] Status check_integrity() const;

 private:
  struct PoolFormat {
    planner::KvFormat k, v;
    const kv::KvFormatTraits* tk = nullptr;
    const kv::KvFormatTraits* tv = nullptr;
    size_t k_tile = 0, v_tile = 0;  // bytes of one KV head's tile
    size_t layer_bytes = 0;         // n_head_kv * (k_tile + v_tile)
  };
  PagedKvStore(const PagedKvStoreConfig& cfg, kv::BlockManager mgr);
  [[nodiscard]] const PoolFormat& format(kv::PoolKind p) const { return fmt_[static_cast<int>(p)]; }
  [[nodiscard]] uint8_t* block_data(const kv::BlockTableEntry& e);
  void quantise_block(const kv::Migration& m, int rows);
  void build_views(kv::SeqId s, int il, int64_t n_ctx);
  // The manager appends an append of n tokens to s (holding `written` tokens) makes: first up to
  // a block boundary, then one block at a time; nullopt when the pools cannot hold them with the
  // migrations in between.
  [[nodiscard]] std::optional<std::vector<int64_t>> plan_append(kv::SeqId s, int64_t written,
                                                                int64_t n, bool migrate) const;
  // Whether a block with `written` of its rows stored may move to the body pool now.
  [[nodiscard]] bool can_migrate_now(int64_t written_rows) const;

  PagedKvStoreConfig cfg_;
  std::unique_ptr<kv::BlockManager> mgr_;
  std::array<PoolFormat, kv::kPoolKinds> fmt_;
  std::vector<float> rows_;                       // [block_size, head_dim] staging for store
  std::vector<attention::PagedBlockView> views_;  // per logical block, rebuilt per attend
  std::vector<float> scratch_;                    // per thread: paged_attn_scratch_floats
  std::vector<float> partials_;                   // per task: paged_partial_floats
  std::vector<float> q_rot_;                      // [n, n_head * head_dim] rotated queries
};

}  // namespace bie
