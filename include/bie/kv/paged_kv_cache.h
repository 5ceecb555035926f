// PagedKvCache: the paged, mixed-precision KV cache behind the KvCache interface, for one sequence.
// Owns a BlockManager (pools sized by the planner: kv_pool_plan(geometry, layout, max_tokens, 1))
// and executes what the manager decides: K/V rows are written into FP16 sink/window blocks (or
// straight into body blocks that a prefill chunk places outside the window), blocks that leave
// the window are re-quantised into the body pool with the format kernels after each forward pass,
// and attention walks the block table with the formats' fused dot/axpy kernels
// (attention/paged_attention.h), as (query tile x KV head x context split) tasks on the ThreadPool.
// With layout.rotate, K rows and queries pass through kv::hadamard_rotate per head (V does not).
// Prefix caching is off: the KvCache interface carries no token ids.
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
#include <string>
#include <vector>

#include "bie/attention/paged_attention.h"
#include "bie/kv/block_manager.h"
#include "bie/kv/kv_cache.h"

namespace bie {

struct PagedKvCacheConfig {
  KvGeometry geometry;
  planner::KvLayout layout;  // body formats, block size, sink and window tokens
  int64_t max_tokens = 0;    // longest sequence; the pools are planned for exactly this
};

class PagedKvCache final : public KvCache {
 public:
  // Plans the pools for cfg and checks the layout (formats with kernels, int4_channel tiles equal
  // to the block size, a window of at least one token when keys are per-channel).
  [[nodiscard]] static Result<std::unique_ptr<PagedKvCache>> create(const PagedKvCacheConfig& cfg);
  // Same, with pools of exactly these many blocks (tests of a tight budget).
  [[nodiscard]] static Result<std::unique_ptr<PagedKvCache>> create(const PagedKvCacheConfig& cfg,
                                                                    int64_t fp16_blocks,
                                                                    int64_t body_blocks);

  [[nodiscard]] const KvGeometry& geometry() const override { return cfg_.geometry; }
  [[nodiscard]] int64_t n_tokens() const override { return n_tokens_; }
  [[nodiscard]] int64_t capacity() const override { return cfg_.max_tokens; }
  // A later chunk is appended to the manager block by block, and between blocks every block that
  // has left the FP16 window is moved to the body pool (written blocks re-quantised, blocks of the
  // chunk not yet written just re-pointed; store then writes them in the body format). So a chunk
  // never holds old window blocks and new window blocks in FP16 at once, and pools planned for
  // max_tokens hold any chunking. One exception: a chunk that starts inside a block and pushes
  // that partly written block out of the window keeps it FP16 until the pass ends when K is
  // per-channel (int4_channel tiles are written whole); that needs one FP16 block of slack.
  [[nodiscard]] bool can_append(int64_t n) const override;
  [[nodiscard]] Status append(int64_t n) override;
  void store(int il, int64_t pos0, int64_t n, const float* k, const float* v) override;
  // After the last layer's attention over the newest tokens, migrates the blocks that left the
  // FP16 window (so rollback of the batch just run may be refused; see truncate).
  void attend(int il, int64_t pos0, int64_t n, const float* q, int n_head, float scale, float* out,
              ThreadPool& pool) override;
  // Through BlockManager::truncate: only FP16 window blocks may be cut; n == 0 frees everything.
  [[nodiscard]] Status truncate(int64_t n) override;

  // Quantises every block that has left the FP16 window into the body pool and frees its FP16
  // block. attend() calls it; exposed for callers that store without attending.
  [[nodiscard]] Status migrate_window_exits();

  [[nodiscard]] Status check_integrity() const;
  [[nodiscard]] const kv::BlockManager& manager() const { return *mgr_; }
  // The sequence's block table (empty while it holds no tokens).
  [[nodiscard]] const kv::BlockTable& table() const;
  [[nodiscard]] const planner::KvLayout& layout() const { return cfg_.layout; }
  // Read-only storage of a table entry's block (tests and tools).
  [[nodiscard]] const uint8_t* block_storage(const kv::BlockTableEntry& e) const {
    return mgr_->pool(e.pool).data(e.block.index);
  }

 private:
  static constexpr kv::SeqId kSeq = 0;
  struct PoolFormat {
    planner::KvFormat k, v;
    const kv::KvFormatTraits* tk = nullptr;
    const kv::KvFormatTraits* tv = nullptr;
    size_t k_tile = 0, v_tile = 0;  // bytes of one KV head's tile
    size_t layer_bytes = 0;         // n_head_kv * (k_tile + v_tile)
  };

  PagedKvCache(const PagedKvCacheConfig& cfg, kv::BlockManager mgr);
  [[nodiscard]] const PoolFormat& format(kv::PoolKind p) const { return fmt_[static_cast<int>(p)]; }
  [[nodiscard]] uint8_t* block_data(const kv::BlockTableEntry& e);
  void quantise_block(const kv::Migration& m, int rows);
  void build_views(int il, int64_t n_ctx);
  [[nodiscard]] std::vector<int32_t> placeholder_tokens(int64_t n) const;
  // The manager appends append(n) makes (first up to a block boundary, then one block at a time);
  // nullopt when the pools cannot hold them with the migrations in between.
  [[nodiscard]] std::optional<std::vector<int64_t>> plan_append(int64_t n) const;
  // Whether a block with `written` of its rows stored may move to the body pool now.
  [[nodiscard]] bool can_migrate_now(int64_t written_rows) const;
  [[nodiscard]] Status migrate_exits(int64_t written_tokens);

  PagedKvCacheConfig cfg_;
  std::unique_ptr<kv::BlockManager> mgr_;
  std::array<PoolFormat, kv::kPoolKinds> fmt_;
  int64_t n_tokens_ = 0;
  std::vector<float> rows_;                       // [block_size, head_dim] staging for store
  std::vector<attention::PagedBlockView> views_;  // per logical block, rebuilt per attend
  std::vector<float> scratch_;                    // per thread: paged_attn_scratch_floats
  std::vector<float> partials_;                   // per task: paged_partial_floats
  std::vector<float> q_rot_;                      // [n, n_head * head_dim] rotated queries
  std::string migration_error_;                   // sticky; reported by check_integrity
};

}  // namespace bie
