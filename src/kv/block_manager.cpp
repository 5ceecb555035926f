#include "bie/kv/block_manager.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <map>

#include "bie/kv/prefix_hash.h"

namespace bie::kv {

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

int idx(PoolKind p) {
  return static_cast<int>(p);
}

const char* pool_name(PoolKind p) {
  return p == PoolKind::kFp16 ? "fp16" : "body";
}

}  // namespace

BlockManager::BlockManager(const BlockManagerConfig& cfg) : cfg_(cfg) {
  fmt_k_ = {planner::kKvF16, cfg.layout.k};
  fmt_v_ = {planner::kKvF16, cfg.layout.v};
  root_ = prefix_root_hash(cfg.model_id);
  index_->events = cfg.events;
  for (int p = 0; p < kPoolKinds; ++p) {
    index_->medium[static_cast<size_t>(p)] = cfg.events_medium + "/" + pool_name(PoolKind(p));
  }
}

void BlockManager::PrefixIndex::erase(uint64_t key) {
  const auto it = map.find(key);
  if (it == map.end()) return;
  if (events) events->block_removed(medium[static_cast<size_t>(it->second.pool)], it->second.chain);
  map.erase(it);
}

Result<BlockManager> BlockManager::create(const BlockManagerConfig& cfg) {
  const planner::KvLayout& l = cfg.layout;
  if (l.block_size < 1 || l.sink_tokens < 0 || l.window_tokens < 0 || cfg.local_window < 0) {
    return Error{fmt::format("KV block manager: bad layout (block {}, sink {}, window {})",
                             l.block_size, l.sink_tokens, l.window_tokens)};
  }
  if (!l.mixed() && cfg.fp16_blocks != 0) {
    return Error{
        "KV block manager: an unmixed layout keeps every block in the body pool; "
        "its FP16 pool must be empty"};
  }
  BlockManager m(cfg);
  std::array<int64_t, kPoolKinds> counts = {cfg.fp16_blocks, cfg.body_blocks};
  const std::array<uint64_t, kPoolKinds> bytes = {cfg.fp16_block_bytes, cfg.body_block_bytes};
  if (cfg.budget && !cfg.sizes_as_given) {
    // Ids for as many blocks as the whole budget could hold; the budget bounds what is used.
    counts[idx(PoolKind::kFp16)] = 0;
    for (int p = 0; p < kPoolKinds; ++p) {
      if (p == idx(PoolKind::kFp16) && !l.mixed()) continue;
      if (bytes[p] > 0) {
        const uint64_t stride = MemoryBudget::block_cost(bytes[p]);
        counts[p] =
            std::min<int64_t>(static_cast<int64_t>(cfg.budget->limit() / stride), int64_t{1} << 30);
      }
    }
  }
  for (int p = 0; p < kPoolKinds; ++p) {
    BlockPoolConfig pc{counts[p], bytes[p], l.block_size, cfg.budget};
    auto pool = BlockPool::create(pc);
    if (!pool) return Error{fmt::format("{} pool: {}", pool_name(PoolKind(p)), pool.error())};
    m.pools_[p] = std::move(pool.value());
    std::weak_ptr<PrefixIndex> index = m.index_;
    m.pools_[p]->set_evict_listener([index](uint64_t key) {
      if (auto i = index.lock()) {
        i->erase(key);
        ++i->budget_evictions;
      }
    });
  }
  return m;
}

PrefixCacheStats BlockManager::prefix_stats() const {
  PrefixCacheStats s = stats_;
  s.evictions += index_->budget_evictions;
  return s;
}

bool PoolCapacity::take(PoolKind p) {
  const int i = static_cast<int>(p);
  if (blocks[i] < 1) return false;
  if (budgeted) {
    if (bytes < cost[i]) return false;
    bytes -= cost[i];
  }
  --blocks[i];
  return true;
}

void PoolCapacity::give(PoolKind p) {
  const int i = static_cast<int>(p);
  ++blocks[i];
  if (budgeted) bytes += cost[i];
}

PoolCapacity BlockManager::capacity() const {
  PoolCapacity c;
  for (int p = 0; p < kPoolKinds; ++p) c.blocks[p] = pools_[p]->num_available();
  if (cfg_.budget) {
    c.budgeted = true;
    const uint64_t used = cfg_.budget->active_cost();
    c.bytes = cfg_.budget->limit() > used ? cfg_.budget->limit() - used : 0;
    for (int p = 0; p < kPoolKinds; ++p) {
      c.cost[p] = pools_[p]->stride();
    }
  }
  return c;
}

std::vector<CachedBlock> BlockManager::cached_blocks() const {
  std::vector<CachedBlock> out;
  out.reserve(index_->map.size());
  for (const auto& [key, e] : index_->map) out.push_back({e.pool, e.chain});
  return out;
}

uint64_t BlockManager::reserved_bytes() const {
  return pools_[0]->reserved_bytes() + pools_[1]->reserved_bytes();
}

const BlockTable& BlockManager::table(SeqId s) const {
  assert(has_sequence(s));
  return seqs_.at(s).table;
}
std::span<const int32_t> BlockManager::tokens(SeqId s) const {
  assert(has_sequence(s));
  return seqs_.at(s).tokens;
}
int64_t BlockManager::num_tokens(SeqId s) const {
  assert(has_sequence(s));
  return static_cast<int64_t>(seqs_.at(s).tokens.size());
}
int64_t BlockManager::num_computed(SeqId s) const {
  assert(has_sequence(s));
  return seqs_.at(s).computed;
}

uint64_t BlockManager::key_for(PoolKind p, uint64_t chain) const {
  return prefix_block_key(chain, fmt_k_[idx(p)], fmt_v_[idx(p)]);
}

// New blocks go where their role at the new length puts them. A block that is already outside a
// sliding window is still stored (the forward pass that writes it may attend to it) and dropped
// afterwards, from the body pool.
PoolKind BlockManager::alloc_pool(int64_t logical, int64_t n) const {
  return block_role(cfg_.layout, cfg_.local_window, logical, n) == BlockRole::kFp16
             ? PoolKind::kFp16
             : PoolKind::kBody;
}

std::optional<BlockTableEntry> BlockManager::find_cached(PoolKind p, uint64_t chain,
                                                         uint64_t parent,
                                                         std::span<const int32_t> toks) const {
  auto it = index_->map.find(key_for(p, chain));
  if (it == index_->map.end() || it->second.pool != p) return std::nullopt;
  const BlockPool& pl = pool(p);
  const BlockIndex b = it->second.block;
  const BlockKey& k = pl.key(b);
  if (k.chain != chain || k.parent != parent) return std::nullopt;
  const auto cached = pl.key_tokens(b);
  if (!std::equal(cached.begin(), cached.end(), toks.begin(), toks.end())) return std::nullopt;
  return BlockTableEntry{p, BlockRef{b, pl.generation(b)}};
}

Result<BlockRef> BlockManager::allocate_block(PoolKind p) {
  auto a = pool(p).allocate();
  if (!a) return Error{fmt::format("{} pool: {}", pool_name(p), a.error())};
  if (a->evicted_key) {
    index_->erase(*a->evicted_key);
    ++stats_.evictions;
  }
  return a->block;
}

void BlockManager::release_block(const BlockTableEntry& e) {
  if (e.block.index != kNullBlock) pool(e.pool).release(e.block.index);
}

void BlockManager::register_block(const BlockTableEntry& e, uint64_t chain, uint64_t parent,
                                  std::span<const int32_t> toks) {
  if (!caching() || e.block.index == kNullBlock) return;
  BlockPool& pl = pool(e.pool);
  if (pl.has_key(e.block.index)) return;  // a hit: already in the index
  const uint64_t key = key_for(e.pool, chain);
  // Another block already holds this content: keep that one; this one stays private.
  if (!index_->map.emplace(key, IndexEntry{e.pool, e.block.index, chain}).second) return;
  pl.set_key(e.block.index, BlockKey{key, chain, parent}, toks);
  if (index_->events) {
    index_->events->block_stored(index_->medium[static_cast<size_t>(idx(e.pool))], chain,
                                 parent == root_ ? std::nullopt : std::optional<uint64_t>(parent),
                                 toks, block_size());
  }
}

void BlockManager::unregister_block(const BlockTableEntry& e) {
  BlockPool& pl = pool(e.pool);
  index_->erase(pl.key(e.block.index).key);
  pl.clear_key(e.block.index);
}

bool BlockManager::fits(const std::array<int64_t, kPoolKinds>& need,
                        const std::array<int64_t, kPoolKinds>& pinned) const {
  PoolCapacity c = capacity();
  for (int p = 0; p < kPoolKinds; ++p) {
    for (int64_t k = 0; k < need[p] + pinned[p]; ++k) {
      if (!c.take(PoolKind(p))) return false;
    }
  }
  return true;
}

const BlockManager::PendingMigration* BlockManager::find_pending(SeqId s, int64_t logical) const {
  for (const PendingMigration& m : pending_) {
    if (m.seq == s && m.logical == logical) return &m;
  }
  return nullptr;
}

// ---- prefix lookup and allocation ----------------------------------------------------------

BlockManager::Probe BlockManager::probe_prefix(std::span<const int32_t> prompt) const {
  Probe pr;
  if (!caching() || prompt.empty()) return pr;
  const int64_t B = block_size();
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int64_t max_blocks = (n - 1) / B;  // the last token's block is always computed
  uint64_t parent = root_;
  for (int64_t i = 0; i < max_blocks; ++i) {
    const auto toks = prompt.subspan(static_cast<size_t>(i * B), static_cast<size_t>(B));
    const uint64_t chain = prefix_chain_hash(parent, toks);
    const BlockRole role = block_role(cfg_.layout, cfg_.local_window, i, n);
    const bool want_fp16 = role == BlockRole::kFp16;
    auto found = find_cached(want_fp16 ? PoolKind::kFp16 : PoolKind::kBody, chain, parent, toks);
    // Body needed, only FP16 cached: hit, then quantise (no forward pass needed). The reverse
    // (FP16 needed, only body cached) is a miss: dequantised data is not FP16 precision. A block
    // a local window drops after the pass hits in either pool, as it is.
    bool quantise = false;
    if (!found && !want_fp16 && cfg_.layout.mixed()) {
      found = find_cached(PoolKind::kFp16, chain, parent, toks);
      quantise = found.has_value() && role == BlockRole::kBody;
    }
    if (!found && cfg_.local_window == 0) break;
    pr.found.push_back(found);
    pr.chains.push_back(chain);
    pr.quantise.push_back(quantise);
    pr.after_miss.push_back(found ? pr.after_miss.back() : i + 1);
    parent = chain;
  }
  return pr;
}

int64_t BlockManager::local_window_first_block(int64_t h) const {
  if (cfg_.local_window == 0) return 0;
  // The token at h*B attends to positions > h*B - window (kv::block_role keeps the same blocks).
  const int64_t first_pos = h * block_size() - cfg_.local_window + 1;
  return first_pos > 0 ? first_pos / block_size() : 0;
}

std::vector<bool> BlockManager::servable_prefixes(std::span<const int32_t> prompt) const {
  const int64_t max_blocks =
      prompt.empty() ? 0 : (static_cast<int64_t>(prompt.size()) - 1) / block_size();
  std::vector<bool> out(static_cast<size_t>(max_blocks + 1), false);
  out[0] = true;
  const Probe pr = probe_prefix(prompt);
  for (int64_t h = 1; h <= static_cast<int64_t>(pr.found.size()); ++h) {
    out[static_cast<size_t>(h)] = pr.serves(h, local_window_first_block(h));
  }
  return out;
}

PrefixHit BlockManager::lookup_prefix(std::span<const int32_t> prompt, int64_t max_blocks) const {
  PrefixHit hit;
  const Probe pr = probe_prefix(prompt);
  int64_t h = std::min(max_blocks, static_cast<int64_t>(pr.found.size()));
  while (h > 0 && !pr.serves(h, local_window_first_block(h))) --h;
  const int64_t first = local_window_first_block(h);
  for (int64_t i = 0; i < h; ++i) {
    const auto k = static_cast<size_t>(i);
    // Blocks before the window of the first computed token: null entries, as if dropped.
    hit.blocks.push_back(i < first ? BlockTableEntry{PoolKind::kBody, BlockRef{}} : *pr.found[k]);
    hit.chains.push_back(pr.chains[k]);
    hit.fp16_hits_needing_body += i >= first && pr.quantise[k] ? 1 : 0;
  }
  hit.cached_tokens = h * block_size();
  return hit;
}

BlockNeeds BlockManager::allocation_needs(std::span<const int32_t> prompt,
                                          int64_t max_hit_blocks) const {
  BlockNeeds nd;
  if (prompt.empty()) return nd;
  const PrefixHit hit = lookup_prefix(prompt, max_hit_blocks);
  const int64_t n = static_cast<int64_t>(prompt.size());
  for (const BlockTableEntry& e : hit.blocks) {
    if (e.block.index != kNullBlock && pool(e.pool).is_cached(e.block.index)) {
      ++nd.pinned[idx(e.pool)];
    }
  }
  for (int64_t i = static_cast<int64_t>(hit.blocks.size()); i < ceil_div(n, block_size()); ++i) {
    ++nd.need[idx(alloc_pool(i, n))];
  }
  // The quantised copies of FP16 hits are part of the request's admission.
  nd.need[idx(PoolKind::kBody)] += hit.fp16_hits_needing_body;
  return nd;
}

bool BlockManager::can_allocate(std::span<const int32_t> prompt, int64_t max_hit_blocks) const {
  if (prompt.empty()) return false;
  const BlockNeeds nd = allocation_needs(prompt, max_hit_blocks);
  return fits(nd.need, nd.pinned);
}

Result<int64_t> BlockManager::allocate(SeqId s, std::span<const int32_t> prompt,
                                       int64_t max_hit_blocks) {
  if (has_sequence(s)) return Error{fmt::format("KV: sequence {} already exists", s)};
  if (prompt.empty()) return Error{"KV: cannot allocate a sequence with an empty prompt"};
  if (!can_allocate(prompt, max_hit_blocks)) {
    return Error{fmt::format("KV: not enough free blocks for a {}-token prompt", prompt.size())};
  }
  const PrefixHit hit = lookup_prefix(prompt, max_hit_blocks);
  const int64_t n = static_cast<int64_t>(prompt.size());
  SeqState st;
  st.tokens.assign(prompt.begin(), prompt.end());
  // cached -> active / active -> active first, so the allocations below cannot evict a hit.
  int64_t hit_blocks = 0;
  for (const BlockTableEntry& e : hit.blocks) {
    if (e.block.index != kNullBlock) {
      pool(e.pool).retain(e.block.index);
      ++hit_blocks;
    }
    st.table.push_back(e);
  }
  for (int64_t i = static_cast<int64_t>(hit.blocks.size()); i < ceil_div(n, block_size()); ++i) {
    const PoolKind p = alloc_pool(i, n);
    auto b = allocate_block(p);
    if (!b) {  // only an OS commit failure gets here (can_allocate held)
      for (auto it = st.table.rbegin(); it != st.table.rend(); ++it) release_block(*it);
      return Error{b.error()};
    }
    st.table.push_back({p, *b});
  }
  st.chains = hit.chains;
  st.computed = hit.cached_tokens;
  if (caching()) {
    ++stats_.lookups;
    stats_.queried_blocks += (n - 1) / block_size();
    stats_.hit_blocks += hit_blocks;
  }
  seqs_.emplace(s, std::move(st));
  return hit.cached_tokens;
}

// ---- growth --------------------------------------------------------------------------------

bool BlockManager::can_append(SeqId s, int64_t n_tokens) const {
  auto it = seqs_.find(s);
  if (it == seqs_.end() || n_tokens < 0) return false;
  const SeqState& st = it->second;
  const int64_t B = block_size();
  const int64_t n0 = static_cast<int64_t>(st.tokens.size());
  const int64_t n1 = n0 + n_tokens;
  BlockNeeds nd;
  if (n_tokens > 0 && n0 % B != 0) {
    const BlockTableEntry& last = st.table.back();
    if (pool(last.pool).ref_count(last.block.index) > 1) ++nd.need[idx(last.pool)];
  }
  for (int64_t i = ceil_div(n0, B); i < ceil_div(n1, B); ++i) ++nd.need[idx(alloc_pool(i, n1))];
  return fits(nd.need, nd.pinned);
}

Result<std::vector<KvCopy>> BlockManager::append(SeqId s, std::span<const int32_t> tokens) {
  if (!has_sequence(s)) return Error{fmt::format("KV: unknown sequence {}", s)};
  const int64_t k = static_cast<int64_t>(tokens.size());
  if (!can_append(s, k)) {
    return Error{
        fmt::format("KV: not enough free blocks to append {} tokens to sequence {}", k, s)};
  }
  SeqState& st = seqs_.at(s);
  const int64_t B = block_size();
  const int64_t n0 = static_cast<int64_t>(st.tokens.size());
  const int64_t n1 = n0 + k;
  std::vector<KvCopy> copies;
  std::vector<BlockTableEntry> added;
  if (k > 0 && n0 % B != 0) {
    BlockTableEntry& last = st.table.back();
    BlockPool& pl = pool(last.pool);
    if (pl.ref_count(last.block.index) > 1) {
      // Copy-on-write: the partly filled block is shared; write into a private copy.
      auto b = allocate_block(last.pool);
      if (!b) return Error{b.error()};
      copies.push_back({last.pool, last.block, *b});
      pl.release(last.block.index);
      last.block = *b;
    } else if (pl.has_key(last.block.index)) {
      // Ours alone but still cached as the full block it was before a rollback: forget the key
      // rather than let a later hit see the tokens we are about to overwrite.
      unregister_block(last);
    }
  }
  for (int64_t i = ceil_div(n0, B); i < ceil_div(n1, B); ++i) {
    const PoolKind p = alloc_pool(i, n1);
    auto b = allocate_block(p);
    if (!b) {  // OS commit failure only; undo the new blocks (a CoW copy stays: harmless)
      for (auto it = added.rbegin(); it != added.rend(); ++it) release_block(*it);
      st.table.resize(st.table.size() - added.size());
      return Error{b.error()};
    }
    st.table.push_back({p, *b});
    added.push_back(st.table.back());
  }
  st.tokens.insert(st.tokens.end(), tokens.begin(), tokens.end());
  return copies;
}

Status BlockManager::mark_computed(SeqId s, int64_t n) {
  auto it = seqs_.find(s);
  if (it == seqs_.end()) return Error{fmt::format("KV: unknown sequence {}", s)};
  SeqState& st = it->second;
  if (n < st.computed || n > static_cast<int64_t>(st.tokens.size())) {
    return Error{fmt::format("KV: sequence {}: computed count {} outside [{}, {}]", s, n,
                             st.computed, st.tokens.size())};
  }
  st.computed = n;
  const int64_t B = block_size();
  for (int64_t i = static_cast<int64_t>(st.chains.size()); i < n / B; ++i) {
    const auto toks = std::span<const int32_t>(st.tokens).subspan(static_cast<size_t>(i * B),
                                                                  static_cast<size_t>(B));
    const uint64_t parent = i == 0 ? root_ : st.chains[static_cast<size_t>(i - 1)];
    const uint64_t chain = prefix_chain_hash(parent, toks);
    st.chains.push_back(chain);
    register_block(st.table[static_cast<size_t>(i)], chain, parent, toks);
  }
  return {};
}

// ---- window exits --------------------------------------------------------------------------

std::vector<WindowExit> BlockManager::blocks_leaving_window(SeqId s) const {
  std::vector<WindowExit> out;
  auto it = seqs_.find(s);
  if (it == seqs_.end()) return out;
  const SeqState& st = it->second;
  const int64_t n = static_cast<int64_t>(st.tokens.size());
  for (int64_t i = 0; i < static_cast<int64_t>(st.table.size()); ++i) {
    const BlockTableEntry& e = st.table[static_cast<size_t>(i)];
    if (e.block.index == kNullBlock || find_pending(s, i)) continue;
    const BlockRole r = block_role(cfg_.layout, cfg_.local_window, i, n);
    if (r == BlockRole::kDropped) {
      out.push_back({i, true});
    } else if (r == BlockRole::kBody && e.pool == PoolKind::kFp16) {
      out.push_back({i, false});
    }
  }
  return out;
}

Result<Migration> BlockManager::begin_migration(SeqId s, int64_t logical) {
  auto it = seqs_.find(s);
  if (it == seqs_.end()) return Error{fmt::format("KV: unknown sequence {}", s)};
  SeqState& st = it->second;
  if (logical < 0 || logical >= static_cast<int64_t>(st.table.size())) {
    return Error{fmt::format("KV: sequence {} has no block {}", s, logical)};
  }
  const BlockTableEntry& e = st.table[static_cast<size_t>(logical)];
  const int64_t n = static_cast<int64_t>(st.tokens.size());
  if (e.pool != PoolKind::kFp16 || e.block.index == kNullBlock ||
      block_role(cfg_.layout, cfg_.local_window, logical, n) != BlockRole::kBody) {
    return Error{
        fmt::format("KV: block {} of sequence {} is not leaving the FP16 window", logical, s)};
  }
  if (find_pending(s, logical)) {
    return Error{fmt::format("KV: block {} of sequence {} is already migrating", logical, s)};
  }
  Migration m{logical, e.block, {}, true};
  std::optional<BlockTableEntry> hit;
  if (caching() && logical < static_cast<int64_t>(st.chains.size())) {
    const auto toks = std::span<const int32_t>(st.tokens).subspan(
        static_cast<size_t>(logical * block_size()), static_cast<size_t>(block_size()));
    const uint64_t parent = logical == 0 ? root_ : st.chains[static_cast<size_t>(logical - 1)];
    hit = find_cached(PoolKind::kBody, st.chains[static_cast<size_t>(logical)], parent, toks);
  }
  if (hit) {
    pool(PoolKind::kBody).retain(hit->block.index);  // cached -> active, or active -> active
    m.dst = hit->block;
    m.needs_quantise = false;
  } else {
    auto b = allocate_block(PoolKind::kBody);
    if (!b) return Error{b.error()};
    m.dst = *b;
  }
  pending_.push_back({s, logical, m.dst});
  return m;
}

Result<BlockRef> BlockManager::migrate(SeqId s, int64_t logical, BlockRef dst) {
  auto pit = std::find_if(pending_.begin(), pending_.end(), [&](const PendingMigration& m) {
    return m.seq == s && m.logical == logical;
  });
  if (pit == pending_.end() || pit->dst != dst || pool(PoolKind::kBody).is_stale(dst)) {
    return Error{fmt::format("KV: no migration of block {} of sequence {} to body block {}",
                             logical, s, dst.index)};
  }
  SeqState& st = seqs_.at(s);
  BlockTableEntry& e = st.table[static_cast<size_t>(logical)];
  const BlockTableEntry old = e;
  e = BlockTableEntry{PoolKind::kBody, dst};
  pending_.erase(pit);
  if (logical < static_cast<int64_t>(st.chains.size())) {
    const auto toks = std::span<const int32_t>(st.tokens).subspan(
        static_cast<size_t>(logical * block_size()), static_cast<size_t>(block_size()));
    const uint64_t parent = logical == 0 ? root_ : st.chains[static_cast<size_t>(logical - 1)];
    register_block(e, st.chains[static_cast<size_t>(logical)], parent, toks);
  }
  release_block(old);  // active -> free, or -> cached (the FP16 copy stays findable)
  return old.block;
}

Status BlockManager::abort_migration(SeqId s, int64_t logical) {
  auto pit = std::find_if(pending_.begin(), pending_.end(), [&](const PendingMigration& m) {
    return m.seq == s && m.logical == logical;
  });
  if (pit == pending_.end()) {
    return Error{fmt::format("KV: no migration of block {} of sequence {}", logical, s)};
  }
  pool(PoolKind::kBody).release(pit->dst.index);
  pending_.erase(pit);
  return {};
}

Result<BlockRef> BlockManager::drop(SeqId s, int64_t logical) {
  auto it = seqs_.find(s);
  if (it == seqs_.end()) return Error{fmt::format("KV: unknown sequence {}", s)};
  SeqState& st = it->second;
  const int64_t n = static_cast<int64_t>(st.tokens.size());
  if (logical < 0 || logical >= static_cast<int64_t>(st.table.size()) ||
      st.table[static_cast<size_t>(logical)].block.index == kNullBlock ||
      block_role(cfg_.layout, cfg_.local_window, logical, n) != BlockRole::kDropped) {
    return Error{
        fmt::format("KV: block {} of sequence {} is not leaving a sliding window", logical, s)};
  }
  BlockTableEntry& e = st.table[static_cast<size_t>(logical)];
  const BlockTableEntry old = e;
  e.block = BlockRef{};
  release_block(old);
  return old.block;
}

// ---- sharing, rollback, release ------------------------------------------------------------

Status BlockManager::fork(SeqId parent, SeqId child) {
  auto it = seqs_.find(parent);
  if (it == seqs_.end()) return Error{fmt::format("KV: unknown sequence {}", parent)};
  if (has_sequence(child)) return Error{fmt::format("KV: sequence {} already exists", child)};
  SeqState copy = it->second;
  for (const BlockTableEntry& e : copy.table) {
    if (e.block.index != kNullBlock) pool(e.pool).retain(e.block.index);  // active -> active
  }
  seqs_.emplace(child, std::move(copy));
  return {};
}

Status BlockManager::truncate(SeqId s, int64_t n) {
  auto it = seqs_.find(s);
  if (it == seqs_.end()) return Error{fmt::format("KV: unknown sequence {}", s)};
  SeqState& st = it->second;
  const int64_t n_old = static_cast<int64_t>(st.tokens.size());
  if (n < 0 || n > n_old) {
    return Error{fmt::format("KV: cannot truncate sequence {} of {} tokens to {}", s, n_old, n)};
  }
  if (n == n_old) return {};
  for (const PendingMigration& m : pending_) {
    if (m.seq == s) {
      return Error{fmt::format("KV: sequence {} has a migration in flight; finish it first", s)};
    }
  }
  const int64_t B = block_size();
  const int64_t nb_new = ceil_div(n, B);
  const bool mixed = cfg_.layout.mixed();
  for (int64_t i = 0; i < static_cast<int64_t>(st.table.size()); ++i) {
    const BlockTableEntry& e = st.table[static_cast<size_t>(i)];
    const bool cut = i >= nb_new;
    const bool made_partial = !cut && i == nb_new - 1 && n % B != 0;  // loses tokens
    const BlockRole r =
        cut ? BlockRole::kDropped : block_role(cfg_.layout, cfg_.local_window, i, n);
    if (e.block.index == kNullBlock && (cut || r != BlockRole::kDropped)) {
      return Error{
          fmt::format("KV: cannot roll sequence {} back to {}: block {} was dropped from "
                      "the sliding window",
                      s, n, i)};
    }
    if (mixed && e.pool == PoolKind::kBody && e.block.index != kNullBlock &&
        (cut || made_partial || r == BlockRole::kFp16)) {
      return Error{
          fmt::format("KV: cannot roll sequence {} back to {}: block {} is already in "
                      "the body format (rollback only touches FP16 window blocks)",
                      s, n, i)};
    }
  }
  for (int64_t i = static_cast<int64_t>(st.table.size()) - 1; i >= nb_new; --i) {
    release_block(st.table[static_cast<size_t>(i)]);  // tail first
  }
  st.table.resize(static_cast<size_t>(nb_new));
  st.tokens.resize(static_cast<size_t>(n));
  st.computed = std::min(st.computed, n);
  st.chains.resize(std::min<size_t>(st.chains.size(), static_cast<size_t>(st.computed / B)));
  return {};
}

Status BlockManager::free(SeqId s) {
  auto it = seqs_.find(s);
  if (it == seqs_.end()) return Error{fmt::format("KV: unknown sequence {}", s)};
  for (size_t k = pending_.size(); k-- > 0;) {
    if (pending_[k].seq == s) {
      pool(PoolKind::kBody).release(pending_[k].dst.index);
      pending_.erase(pending_.begin() + static_cast<ptrdiff_t>(k));
    }
  }
  const BlockTable& t = it->second.table;
  for (auto e = t.rbegin(); e != t.rend(); ++e) release_block(*e);
  seqs_.erase(it);
  return {};
}

// ---- integrity -----------------------------------------------------------------------------

Status BlockManager::check_integrity() const {
  for (int p = 0; p < kPoolKinds; ++p) {
    if (Status st = pools_[p]->check_integrity(); !st) {
      return Error{fmt::format("{} {}", pool_name(PoolKind(p)), st.error())};
    }
  }
  const int64_t B = block_size();
  std::array<std::vector<int32_t>, kPoolKinds> refs;
  for (int p = 0; p < kPoolKinds; ++p) refs[p].assign(pools_[p]->n_blocks() + 1, 0);

  // Iterate sequences in id order so the first reported error is deterministic.
  std::map<SeqId, const SeqState*> ordered;
  for (const auto& [id, st] : seqs_) ordered.emplace(id, &st);
  for (const auto& [id, stp] : ordered) {
    const SeqState& st = *stp;
    const int64_t n = static_cast<int64_t>(st.tokens.size());
    if (static_cast<int64_t>(st.table.size()) != ceil_div(n, B)) {
      return Error{fmt::format("seq {}: {} table entries for {} tokens", id, st.table.size(), n)};
    }
    if (st.computed < 0 || st.computed > n) {
      return Error{fmt::format("seq {}: computed {} of {} tokens", id, st.computed, n)};
    }
    if (static_cast<int64_t>(st.chains.size()) > st.computed / B) {
      return Error{fmt::format("seq {}: {} chain hashes but {} computed tokens", id,
                               st.chains.size(), st.computed)};
    }
    uint64_t parent = root_;
    for (int64_t i = 0; i < static_cast<int64_t>(st.table.size()); ++i) {
      const BlockTableEntry& e = st.table[static_cast<size_t>(i)];
      const BlockRole r = block_role(cfg_.layout, cfg_.local_window, i, n);
      const BlockPool& pl = pool(e.pool);
      const bool full = (i + 1) * B <= n;
      const auto toks = full ? std::span<const int32_t>(st.tokens).subspan(
                                   static_cast<size_t>(i * B), static_cast<size_t>(B))
                             : std::span<const int32_t>();
      if (i < static_cast<int64_t>(st.chains.size())) {
        const uint64_t chain = prefix_chain_hash(parent, toks);
        if (chain != st.chains[static_cast<size_t>(i)]) {
          return Error{
              fmt::format("seq {}: chain hash of block {} does not match its tokens", id, i)};
        }
        parent = chain;
      }
      if (e.block.index == kNullBlock) {
        if (r != BlockRole::kDropped) {
          return Error{fmt::format("seq {}: block {} is null but still kept", id, i)};
        }
        continue;
      }
      if (pl.is_stale(e.block)) {
        return Error{
            fmt::format("seq {}: block {} -> {} #{} is stale", id, i, e.block.index, e.block.gen)};
      }
      ++refs[idx(e.pool)][static_cast<size_t>(e.block.index)];
      if (e.pool == PoolKind::kBody && r == BlockRole::kFp16) {
        return Error{
            fmt::format("seq {}: block {} is in the body pool but in the FP16 window", id, i)};
      }
      if (e.pool == PoolKind::kFp16 && !cfg_.layout.mixed()) {
        return Error{fmt::format("seq {}: FP16-pool block in an unmixed layout", id)};
      }
      if (full && pl.has_key(e.block.index) && i < static_cast<int64_t>(st.chains.size())) {
        const auto cached = pl.key_tokens(e.block.index);
        if (!std::equal(cached.begin(), cached.end(), toks.begin(), toks.end()) ||
            pl.key(e.block.index).chain != st.chains[static_cast<size_t>(i)]) {
          return Error{fmt::format("seq {}: cached block {} holds other tokens", id, i)};
        }
      }
    }
  }
  for (const PendingMigration& m : pending_) {
    auto it = seqs_.find(m.seq);
    if (it == seqs_.end() || m.logical < 0 ||
        m.logical >= static_cast<int64_t>(it->second.table.size()) ||
        it->second.table[static_cast<size_t>(m.logical)].pool != PoolKind::kFp16) {
      return Error{
          fmt::format("migration of seq {} block {} has no FP16 source", m.seq, m.logical)};
    }
    if (pool(PoolKind::kBody).is_stale(m.dst)) {
      return Error{
          fmt::format("migration of seq {} block {}: stale destination", m.seq, m.logical)};
    }
    ++refs[idx(PoolKind::kBody)][static_cast<size_t>(m.dst.index)];
  }
  for (int p = 0; p < kPoolKinds; ++p) {
    const BlockPool& pl = *pools_[p];
    for (BlockIndex b = 1; b <= pl.n_blocks(); ++b) {
      if (pl.ref_count(b) != refs[p][static_cast<size_t>(b)]) {
        return Error{fmt::format("{} block {}: ref count {} but {} references",
                                 pool_name(PoolKind(p)), b, pl.ref_count(b),
                                 refs[p][static_cast<size_t>(b)])};
      }
    }
  }
  // The index and the pools' keys are one relation.
  size_t keyed = 0;
  for (int p = 0; p < kPoolKinds; ++p) {
    const BlockPool& pl = *pools_[p];
    for (BlockIndex b = 1; b <= pl.n_blocks(); ++b) {
      if (!pl.has_key(b)) continue;
      ++keyed;
      const BlockKey& k = pl.key(b);
      auto it = index_->map.find(k.key);
      if (it == index_->map.end() || idx(it->second.pool) != p || it->second.block != b) {
        return Error{fmt::format("{} block {} has a key the index does not map to it",
                                 pool_name(PoolKind(p)), b)};
      }
      if (k.key != key_for(PoolKind(p), k.chain) || it->second.chain != k.chain ||
          k.chain != prefix_chain_hash(k.parent, pl.key_tokens(b))) {
        return Error{
            fmt::format("{} block {}: key does not match its content", pool_name(PoolKind(p)), b)};
      }
    }
  }
  if (keyed != index_->map.size()) {
    return Error{fmt::format("prefix index has {} entries but {} blocks are keyed",
                             index_->map.size(), keyed)};
  }
  if (!caching() && !index_->map.empty()) return Error{"prefix index in use with caching off"};
  return {};
}

Result<std::vector<BlockManager>> make_block_managers(const planner::KvPoolPlan& plan,
                                                      const planner::KvLayout& layout,
                                                      const std::string& model_id,
                                                      bool enable_prefix_caching) {
  std::vector<BlockManager> out;
  for (const planner::KvGroupPool& g : plan.groups) {
    BlockManagerConfig cfg;
    cfg.layout = layout;
    cfg.local_window = g.group.shape.window;
    cfg.model_id = model_id;
    cfg.enable_prefix_caching = enable_prefix_caching;
    cfg.fp16_blocks = g.fp16_blocks;
    cfg.body_blocks = g.body_blocks;
    cfg.fp16_block_bytes = g.fp16_block_bytes;
    cfg.body_block_bytes = g.body_block_bytes;
    auto m = BlockManager::create(cfg);
    if (!m) return Error{m.error()};
    out.push_back(std::move(m.value()));
  }
  return out;
}

}  // namespace bie::kv
