// SequenceKv: one engine sequence's view of the shared PagedKvStore, as the KvCache the model's
// forward pass writes and reads. The scheduler allocates a sequence's blocks (with its real token
// ids, so the prefix cache works) before the pass; append() here only advances over positions
// already allocated. finish_pass(), which the model runner calls after the pass, moves blocks
// that left the FP16 window to the body pool. A light value made per step; engine thread only.
#pragma once
#include <cstdint>

#include "bie/kv/kv_cache.h"
#include "bie/kv/paged_kv_store.h"

namespace bie {

class SequenceKv final : public KvCache {
 public:
  // computed: tokens of s whose K/V are stored; capacity: the sequence's max_model_len.
  // migrate_after_pass = false while the pass holds unverified draft tokens.
  SequenceKv(PagedKvStore& store, kv::SeqId s, int64_t computed, int64_t capacity,
             bool migrate_after_pass = true)
      : store_(store),
        seq_(s),
        computed_(computed),
        capacity_(capacity),
        migrate_after_pass_(migrate_after_pass) {}

  [[nodiscard]] const KvGeometry& geometry() const override { return store_.geometry(); }
  [[nodiscard]] int64_t n_tokens() const override { return computed_; }
  [[nodiscard]] int64_t capacity() const override { return capacity_; }
  // n more positions are writable when the scheduler has allocated them.
  [[nodiscard]] bool can_append(int64_t n) const override;
  [[nodiscard]] Status append(int64_t n) override;
  void store(int il, int64_t pos0, int64_t n, const float* k, const float* v) override {
    store_.store(seq_, il, pos0, n, k, v);
  }
  [[nodiscard]] std::optional<kv::PagedKvLayer> paged_layer(int il, int64_t n_ctx) override {
    return store_.paged_layer(seq_, il, n_ctx);
  }
  [[nodiscard]] kv::HostKvBlocks host_blocks(int il, int64_t n_ctx) override {
    return store_.host_blocks(seq_, il, n_ctx);
  }
  [[nodiscard]] Status write(int il, int64_t pos0, const Tensor& k, const Tensor& v,
                             Backend& backend) override {
    return store_.write(seq_, il, pos0, k, v, backend);
  }
  // Window exits and sliding-window drops at the tokens stored (PagedKvStore::finish_pass),
  // unless the pass held unverified draft tokens (migrate_after_pass = false).
  void finish_pass() override;
  // Rollback goes through the scheduler (BlockManager::truncate); refused here.
  [[nodiscard]] Status truncate(int64_t n) override;

 private:
  PagedKvStore& store_;
  kv::SeqId seq_;
  int64_t computed_;
  int64_t capacity_;
  bool migrate_after_pass_;
};

}  // namespace bie
