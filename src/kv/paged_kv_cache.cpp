#include "bie/kv/paged_kv_cache.h"

#include <fmt/format.h>

#include <algorithm>

#include "bie/backend/thread_pool.h"

namespace bie {

Result<std::unique_ptr<PagedKvCache>> PagedKvCache::create(const PagedKvCacheConfig& cfg) {
  const int64_t chunk =
      cfg.max_append > 0 ? std::min(cfg.max_append, cfg.max_tokens) : cfg.max_tokens;
  auto sc = PagedKvStore::planned_config(cfg.geometry, cfg.layout, cfg.max_tokens, 1, chunk);
  if (!sc) return Error{sc.error()};
  return create(cfg, sc->groups);
}

Result<std::unique_ptr<PagedKvCache>> PagedKvCache::create(
    const PagedKvCacheConfig& cfg, const std::vector<planner::KvGroupPool>& groups) {
  if (cfg.max_tokens < 1) return Error{"paged KV cache: empty geometry or max_tokens < 1"};
  PagedKvStoreConfig sc;
  sc.geometry = cfg.geometry;
  sc.layout = cfg.layout;
  sc.groups = groups;
  if (groups.size() == 1) {
    sc.fp16_blocks = groups[0].fp16_blocks;
    sc.body_blocks = groups[0].body_blocks;
  }
  sc.enable_prefix_caching = false;  // no token ids reach the cache through KvCache
  sc.backend = cfg.backend;
  auto store = PagedKvStore::create(sc);
  if (!store) return Error{store.error()};
  return std::unique_ptr<PagedKvCache>(new PagedKvCache(cfg, std::move(store).value()));
}

Result<std::unique_ptr<PagedKvCache>> PagedKvCache::create(const PagedKvCacheConfig& cfg,
                                                           int64_t fp16_blocks,
                                                           int64_t body_blocks) {
  if (cfg.max_tokens < 1) return Error{"paged KV cache: empty geometry or max_tokens < 1"};
  PagedKvStoreConfig sc;
  sc.geometry = cfg.geometry;
  sc.layout = cfg.layout;
  sc.fp16_blocks = fp16_blocks;
  sc.body_blocks = body_blocks;
  sc.enable_prefix_caching = false;  // no token ids reach the cache through KvCache
  sc.backend = cfg.backend;
  auto store = PagedKvStore::create(sc);
  if (!store) return Error{store.error()};
  return std::unique_ptr<PagedKvCache>(new PagedKvCache(cfg, std::move(store).value()));
}

PagedKvCache::PagedKvCache(const PagedKvCacheConfig& cfg, std::unique_ptr<PagedKvStore> store)
    : cfg_(cfg), store_(std::move(store)) {}

const kv::BlockTable& PagedKvCache::table() const {
  static const kv::BlockTable kEmpty;
  return manager().has_sequence(kSeq) ? manager().table(kSeq) : kEmpty;
}

std::vector<int32_t> PagedKvCache::placeholder_tokens(int64_t n) const {
  // Token ids only feed the prefix cache, which is off; positions keep them distinct.
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>(n_tokens_ + i);
  return t;
}

bool PagedKvCache::can_append(int64_t n) const {
  if (n < 0 || n_tokens_ + n > cfg_.max_tokens) return false;
  if (store_->coordinator().has_local_groups() && cfg_.max_append > 0 && n > cfg_.max_append) {
    // A prompt longer than a chunk goes in chunks with a pass (and the local groups' drops) in
    // between; the pools hold a sequence of max_tokens in such chunks, so the first chunk
    // decides.
    return store_->coordinator().can_append(kSeq, n_tokens_, cfg_.max_append);
  }
  return store_->coordinator().can_append(kSeq, n_tokens_, n);
}

Status PagedKvCache::append(int64_t n) {
  if (n == 0) return {};
  if (n < 0 || n_tokens_ + n > cfg_.max_tokens ||
      !store_->coordinator().can_append(kSeq, n_tokens_, n)) {
    const kv::BlockPool& f16 = manager().pool(kv::PoolKind::kFp16);
    const kv::BlockPool& body = manager().pool(kv::PoolKind::kBody);
    return Error{fmt::format(
        "KV cache out of budget: {} tokens held, {} more requested (capacity {} tokens; FP16 "
        "pool {} of {} blocks free, body pool {} of {} free; raise --max-model-len or the KV "
        "memory)",
        n_tokens_, n, cfg_.max_tokens, f16.num_available(), f16.n_blocks(), body.num_available(),
        body.n_blocks())};
  }
  auto r = store_->append_tokens(kSeq, n_tokens_, placeholder_tokens(n));
  const kv::BlockManager& m = manager();
  n_tokens_ = m.has_sequence(kSeq) ? m.num_tokens(kSeq) : 0;
  if (!r) return Error{r.error()};
  return {};
}

void PagedKvCache::store(int il, int64_t pos0, int64_t n, const float* k, const float* v) {
  store_->store(kSeq, il, pos0, n, k, v);
}

void PagedKvCache::finish_pass() {
  // Every layer of the pass is written: blocks that left the window can be re-quantised. A
  // failure (body pool exhausted; impossible with planned pools) leaves them FP16, which is still
  // correct data, and is reported by check_integrity.
  if (Status s = migrate_window_exits(); !s) migration_error_ = s.error();
}

Status PagedKvCache::migrate_window_exits() {
  if (!manager().has_sequence(kSeq)) return {};
  return store_->finish_pass(kSeq, n_tokens_);
}

Status PagedKvCache::truncate(int64_t n) {
  if (n >= n_tokens_) return {};
  if (n <= 0) {
    if (Status s = store_->coordinator().free(kSeq); !s) return s;
    n_tokens_ = 0;
    return {};
  }
  if (Status s = store_->coordinator().truncate(kSeq, n); !s) return s;
  n_tokens_ = n;
  return {};
}

Status PagedKvCache::check_integrity() const {
  if (Status s = store_->check_integrity(); !s) return s;
  if (!migration_error_.empty())
    return Error{"paged KV cache: migration failed: " + migration_error_};
  const int64_t held = manager().has_sequence(kSeq) ? manager().num_tokens(kSeq) : 0;
  if (held != n_tokens_) {
    return Error{
        fmt::format("paged KV cache: {} tokens but the manager holds {}", n_tokens_, held)};
  }
  return {};
}

}  // namespace bie
