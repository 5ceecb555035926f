// PagedKvCache: the paged, mixed-precision KV cache behind the KvCache interface, for one sequence
// (bie run, bie bench, bie quality). Owns a PagedKvStore (pools sized by the planner:
// kv_pool_plan(geometry, layout, max_tokens, 1)) holding that one sequence; blocks that leave the
// FP16 window are re-quantised after each forward pass (finish_pass). Prefix caching is off: the
// KvCache interface carries no token ids (the engine's scheduler drives the store directly, with
// them). Not thread-safe (engine thread).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bie/kv/block_manager.h"
#include "bie/kv/kv_cache.h"
#include "bie/kv/paged_kv_store.h"

namespace bie {

struct PagedKvCacheConfig {
  KvGeometry geometry;
  planner::KvLayout layout;  // body formats, block size, sink and window tokens
  int64_t max_tokens = 0;    // longest sequence; the pools are planned for exactly this
  // Most tokens one append() adds (a prefill chunk; 0: max_tokens). Sizes the pass headroom of
  // sliding-window layer groups (planner::kv_pool_plan's chunk_tokens); no effect without them.
  // With local groups, can_append(n > max_append) answers for appends in chunks of max_append.
  int64_t max_append = 0;
  Backend* backend = nullptr;  // holds the pools and runs their operations (PagedKvStoreConfig)
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
  // Same, with pools per layer group as given (planner::kv_pool_plan's order; a model with
  // sliding-window layers has several; plan them with chunk_tokens = cfg.max_append).
  [[nodiscard]] static Result<std::unique_ptr<PagedKvCache>> create(
      const PagedKvCacheConfig& cfg, const std::vector<planner::KvGroupPool>& groups);

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
  [[nodiscard]] std::optional<kv::PagedKvLayer> paged_layer(int il, int64_t n_ctx) override {
    return store_->paged_layer(kSeq, il, n_ctx);
  }
  [[nodiscard]] kv::HostKvBlocks host_blocks(int il, int64_t n_ctx) override {
    return store_->host_blocks(kSeq, il, n_ctx);
  }
  [[nodiscard]] Status write(int il, int64_t pos0, const Tensor& k, const Tensor& v,
                             Backend& backend) override {
    return store_->write(kSeq, il, pos0, k, v, backend);
  }
  // After a pass over the newest tokens: migrate_window_exits (so rollback of the batch just run
  // may be refused; see truncate); a failure is reported by check_integrity.
  void finish_pass() override;
  // Through BlockManager::truncate: only FP16 window blocks may be cut; n == 0 frees everything.
  [[nodiscard]] Status truncate(int64_t n) override;

  // Quantises every block that has left the FP16 window into the body pool and frees its FP16
  // block, and drops blocks a sliding window no longer reaches. finish_pass() calls it; exposed
  // for callers that store without a forward pass.
  [[nodiscard]] Status migrate_window_exits();

  [[nodiscard]] Status check_integrity() const;
  [[nodiscard]] const kv::BlockManager& manager() const { return store_->coordinator().manager(); }
  [[nodiscard]] const PagedKvStore& store() const { return *store_; }
  // The sequence's block table (empty while it holds no tokens).
  [[nodiscard]] const kv::BlockTable& table() const;
  [[nodiscard]] const planner::KvLayout& layout() const { return cfg_.layout; }
  // Read-only storage of a table entry's block (tests and tools).
  [[nodiscard]] const uint8_t* block_storage(const kv::BlockTableEntry& e) const {
    return store_->block_storage(e);
  }

 private:
  static constexpr kv::SeqId kSeq = 0;
  PagedKvCache(const PagedKvCacheConfig& cfg, std::unique_ptr<PagedKvStore> store);
  [[nodiscard]] std::vector<int32_t> placeholder_tokens(int64_t n) const;
  PagedKvCacheConfig cfg_;
  std::unique_ptr<PagedKvStore> store_;
  int64_t n_tokens_ = 0;
  std::string migration_error_;  // sticky; reported by check_integrity
};

}  // namespace bie
