#include "bie/kv/kv_coordinator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>

#include "bie/planner/kv_format.h"
#include "bie/planner/model_geometry.h"

namespace bie::kv {

planner::ModelGeometry planner_geometry(const KvGeometry& geo) {
  planner::ModelGeometry g;
  g.n_layer = geo.n_layer;
  g.layers.assign(static_cast<size_t>(geo.n_layer),
                  planner::LayerKv{geo.n_head_kv, geo.head_dim, geo.head_dim, 0});
  for (int il = 0; il < geo.n_layer; ++il)
    g.layers[static_cast<size_t>(il)].window = geo.window(il);
  return g;
}

KvGeometry kv_geometry(const planner::ModelGeometry& g) {
  KvGeometry kg{static_cast<int>(g.n_layer), static_cast<int>(g.n_head_kv()),
                static_cast<int>(g.head_dim_kv()), {}};
  if (g.n_swa_layers() > 0) {
    for (const planner::LayerKv& l : g.layers) kg.layer_window.push_back(static_cast<int32_t>(l.window));
  }
  return kg;
}

Result<std::unique_ptr<KvCoordinator>> KvCoordinator::create(const KvCoordinatorConfig& cfg) {
  const planner::ModelGeometry g = planner_geometry(cfg.geometry);
  const planner::KvPoolPlan plan = planner::kv_pool_plan(g, cfg.layout, 1, 1);
  const size_t n_groups = plan.groups.size();
  if (cfg.budget == nullptr && n_groups > 1 && cfg.groups.size() != n_groups) {
    return Error{fmt::format("paged KV cache: {} layer groups but pool sizes for {}", n_groups,
                             cfg.groups.size())};
  }
  std::unique_ptr<KvCoordinator> c(new KvCoordinator(cfg));
  // Layer il -> (group, index within the group's block), in layer order.
  c->slots_.resize(static_cast<size_t>(cfg.geometry.n_layer));
  std::vector<int> filled(n_groups, 0);
  const std::vector<planner::KvLayerGroup> groups = planner::kv_layer_groups(g, cfg.layout);
  assert(groups.size() == n_groups);
  for (int il = 0; il < cfg.geometry.n_layer; ++il) {
    const size_t gi = planner::kv_layer_group_of(groups, g, cfg.layout, static_cast<size_t>(il));
    c->slots_[static_cast<size_t>(il)] = {static_cast<int>(gi), filled[gi]++};
  }
  const bool one_group_sizes = n_groups == 1 && cfg.groups.empty();
  for (size_t gi = 0; gi < n_groups; ++gi) {
    const planner::KvGroupPool& p = plan.groups[gi];
    BlockManagerConfig mc;
    mc.layout = cfg.layout;  // with the group's body formats: a manager sees one per pool
    mc.layout.k = p.group.body.k;
    mc.layout.v = p.group.body.v;
    mc.layout.per_layer.clear();
    mc.local_window = p.group.shape.window;
    mc.model_id = cfg.model_id;
    mc.enable_prefix_caching = cfg.enable_prefix_caching;
    mc.fp16_blocks = one_group_sizes          ? cfg.fp16_blocks
                     : gi < cfg.groups.size() ? cfg.groups[gi].fp16_blocks
                                              : 0;
    mc.body_blocks = one_group_sizes          ? cfg.body_blocks
                     : gi < cfg.groups.size() ? cfg.groups[gi].body_blocks
                                              : 0;
    mc.fp16_block_bytes = p.fp16_block_bytes;
    mc.body_block_bytes = p.body_block_bytes;
    mc.budget = cfg.budget;
    mc.sizes_as_given = cfg.pools_as_given;
    mc.events = cfg.events;
    mc.events_medium =
        n_groups == 1 ? cfg.events_medium : fmt::format("{}/g{}", cfg.events_medium, gi);
    auto m = BlockManager::create(mc);
    if (!m) return Error{m.error()};
    c->groups_.push_back({std::make_unique<BlockManager>(std::move(m).value()),
                          p.group.shape.window, static_cast<int>(p.group.n_layers), p.group.body});
  }
  const auto lead = std::find_if(c->groups_.begin(), c->groups_.end(),
                                 [](const Group& gr) { return gr.window == 0; });
  c->lead_ = lead == c->groups_.end() ? 0 : static_cast<size_t>(lead - c->groups_.begin());
  return c;
}

bool KvCoordinator::has_local_groups() const {
  return std::any_of(groups_.begin(), groups_.end(), [](const Group& gr) { return gr.window > 0; });
}

uint64_t KvCoordinator::reserved_bytes() const {
  uint64_t sum = 0;
  for (const Group& gr : groups_) sum += gr.mgr->reserved_bytes();
  return sum;
}

uint64_t KvCoordinator::held_bytes() const {
  uint64_t sum = 0;
  for (const Group& gr : groups_) {
    for (const PoolKind p : {PoolKind::kFp16, PoolKind::kBody}) {
      const BlockPool& pool = gr.mgr->pool(p);
      sum += static_cast<uint64_t>(pool.num_active()) * pool.block_bytes();
    }
  }
  return sum;
}

// ---- questions ------------------------------------------------------------------------------

int64_t KvCoordinator::prefix_hit_blocks(std::span<const int32_t> prompt) const {
  if (groups_.size() == 1) {
    return groups_[0].mgr->lookup_prefix(prompt).cached_tokens / cfg_.layout.block_size;
  }
  std::vector<bool> all;
  for (const Group& gr : groups_) {
    const std::vector<bool> g = gr.mgr->servable_prefixes(prompt);
    if (all.empty()) {
      all = g;
    } else {
      for (size_t h = 0; h < all.size(); ++h) all[h] = all[h] && g[h];
    }
  }
  int64_t h = static_cast<int64_t>(all.size()) - 1;
  while (h > 0 && !all[static_cast<size_t>(h)]) --h;
  return std::max<int64_t>(h, 0);
}

int64_t KvCoordinator::prefix_hit_tokens(std::span<const int32_t> prompt) const {
  return prefix_hit_blocks(prompt) * cfg_.layout.block_size;
}

bool KvCoordinator::can_start(std::span<const int32_t> tokens) const {
  if (tokens.empty()) return false;
  const int64_t h = prefix_hit_blocks(tokens);
  // Each group places every block by its role at once; with a shared budget the groups' new
  // blocks and pinned hits are charged together.
  uint64_t cost = 0, left = 0;
  bool budgeted = false;
  for (const Group& gr : groups_) {
    if (!gr.mgr->can_allocate(tokens, h)) return false;
    const PoolCapacity cap = gr.mgr->capacity();
    if (!cap.budgeted) continue;
    budgeted = true;
    left = cap.bytes;
    const BlockNeeds nd = gr.mgr->allocation_needs(tokens, h);
    for (int p = 0; p < kPoolKinds; ++p) {
      cost += static_cast<uint64_t>(nd.need[p] + nd.pinned[p]) * cap.cost[p];
    }
  }
  return !budgeted || groups_.size() == 1 || cost <= left;
}

bool KvCoordinator::can_migrate_now(int64_t written_rows) const {
  // Whole blocks, and blocks not written yet (store then writes them in the body format), can
  // move at any time; a partly written one only if the body formats store rows independently.
  if (written_rows <= 0 || written_rows >= cfg_.layout.block_size) return true;
  return !cfg_.layout.has_per_channel();
}

std::optional<KvCoordinator::AppendPlan> KvCoordinator::plan_append(int g, SeqId s, int64_t written,
                                                                    int64_t n, bool migrate,
                                                                    uint64_t* budget_bytes) const {
  const BlockManager& mgr = manager(g);
  assert(mgr.has_sequence(s) && n > 0);
  const planner::KvLayout& l = cfg_.layout;
  const int64_t B = l.block_size;
  const int64_t W = groups_[static_cast<size_t>(g)].window;
  const int64_t n0 = mgr.num_tokens(s);
  PoolCapacity cap = mgr.capacity();
  if (cap.budgeted) cap.bytes = std::min(cap.bytes, *budget_bytes);
  // An unmixed layout has no window to leave: one append, as the manager plans it.
  if (!l.mixed()) {
    if (!mgr.can_append(s, n)) return std::nullopt;
    if (cap.budgeted) {  // the groups before this one charged the shared budget too
      const auto fresh = static_cast<uint64_t>((n0 + n + B - 1) / B - (n0 + B - 1) / B);
      const uint64_t need = fresh * cap.cost[static_cast<int>(PoolKind::kBody)];
      if (need > cap.bytes) return std::nullopt;
      *budget_bytes = cap.bytes - need;
    }
    return AppendPlan{Piece{n, {}}};
  }
  // Where each block lives after every piece and its migrations (nullopt: dropped from a sliding
  // window), simulated on the table as it is now.
  const BlockTable& t = mgr.table(s);
  std::vector<std::optional<PoolKind>> where;
  where.reserve(t.size() + static_cast<size_t>(n / B + 2));
  for (const BlockTableEntry& e : t) {
    where.push_back(e.block.index == kNullBlock ? std::nullopt : std::optional<PoolKind>(e.pool));
  }
  const auto role = [&](int64_t i, int64_t len) { return block_role(l, W, i, len); };
  // The FP16 blocks whose role is body at len move (exits, in logical order); after the pass a
  // partly written per-channel tile moves too.
  const auto exits_at = [&](int64_t len, bool after_pass, std::vector<int64_t>* exits) {
    for (size_t i = 0; i < where.size(); ++i) {
      const auto b = static_cast<int64_t>(i);
      if (where[i] != PoolKind::kFp16 || role(b, len) != BlockRole::kBody) continue;
      if (!after_pass && !can_migrate_now(std::clamp<int64_t>(written - b * B, 0, B))) continue;
      if (!cap.take(PoolKind::kBody)) return false;
      cap.give(PoolKind::kFp16);
      where[i] = PoolKind::kBody;
      if (exits != nullptr) exits->push_back(b);
    }
    return true;
  };
  AppendPlan plan;
  for (int64_t x = n0; x < n0 + n;) {
    const int64_t k = std::min(B - x % B, n0 + n - x);  // up to the next block boundary
    const int64_t x1 = x + k;
    if (x % B == 0) {  // the piece starts a new block, in the pool of its role at x1
      const PoolKind p = role(x / B, x1) == BlockRole::kFp16 ? PoolKind::kFp16 : PoolKind::kBody;
      if (!cap.take(p)) return std::nullopt;
      where.push_back(p);
    }
    Piece piece{k, {}};
    if (migrate && !exits_at(x1, false, &piece.exits)) return std::nullopt;
    plan.push_back(std::move(piece));
    x = x1;
  }
  // Blocks kept FP16 through the pass move after it (finish_pass); counted here so the pass's
  // end fits. Blocks a sliding window no longer keeps are dropped then too, but not counted as
  // freed here (a caller may hold draft tokens, and a drop waits for verified tokens).
  if (migrate && !exits_at(n0 + n, true, nullptr)) return std::nullopt;
  if (cap.budgeted) *budget_bytes = cap.bytes;
  return plan;
}

std::optional<std::vector<KvCoordinator::AppendPlan>> KvCoordinator::plan_all(
    SeqId s, int64_t written, int64_t n, bool migrate, int* failed) const {
  std::vector<AppendPlan> plans;
  uint64_t budget_bytes = UINT64_MAX;
  for (int g = 0; g < n_groups(); ++g) {
    std::optional<AppendPlan> p = plan_append(g, s, written, n, migrate, &budget_bytes);
    if (!p) {
      if (failed != nullptr) *failed = g;
      return std::nullopt;
    }
    plans.push_back(std::move(*p));
  }
  return plans;
}

bool KvCoordinator::can_append(SeqId s, int64_t written, int64_t n, bool migrate) const {
  if (n <= 0) return n == 0;
  if (!has_sequence(s)) {
    const std::vector<int32_t> placeholder(static_cast<size_t>(n), 0);
    return can_start(placeholder);
  }
  return plan_all(s, written, n, migrate).has_value();
}

// ---- decisions ------------------------------------------------------------------------------

Status KvCoordinator::migrate_block(int g, SeqId s, int64_t b, int64_t written, KvWork& work) {
  BlockManager& mgr = manager(g);
  const int64_t rows =
      std::clamp<int64_t>(written - b * cfg_.layout.block_size, 0, cfg_.layout.block_size);
  auto m = mgr.begin_migration(s, b);
  if (!m) return Error{m.error()};
  if (m->needs_quantise && rows > 0) {
    KvWorkItem q;
    q.kind = KvWorkItem::Kind::kQuantise;
    q.group = g;
    q.src = m->src;
    q.dst = m->dst;
    q.rows = static_cast<int>(rows);
    q.seq = s;
    work.push_back(q);
    // The release below may free the source before the work runs: its pages stay until then.
    mgr.pool(PoolKind::kFp16).pin(m->src.index);
  }
  auto r = mgr.migrate(s, b, m->dst);
  if (!r) return Error{r.error()};
  return {};
}

Status KvCoordinator::move_exits(int g, SeqId s, int64_t written, bool drop, KvWork& work) {
  BlockManager& mgr = manager(g);
  if (!mgr.has_sequence(s)) return {};
  const int64_t B = cfg_.layout.block_size;
  const int64_t W = groups_[static_cast<size_t>(g)].window;
  for (const WindowExit& x : mgr.blocks_leaving_window(s)) {
    if (x.drop) {
      // Dropped only once no query to come can reach it: outside the window at the `written`
      // tokens stored (the sequence may hold more, e.g. a whole prompt of which a chunk ran).
      if (drop && block_role(cfg_.layout, W, x.logical, written) == BlockRole::kDropped) {
        auto r = mgr.drop(s, x.logical);
        if (!r) return Error{r.error()};
      }
      continue;
    }
    // A partly written per-channel tile waits for the pass that completes it.
    if (!can_migrate_now(std::clamp<int64_t>(written - x.logical * B, 0, B))) continue;
    if (Status st = migrate_block(g, s, x.logical, written, work); !st) return st;
  }
  return {};
}

Result<int64_t> KvCoordinator::start(SeqId s, std::span<const int32_t> tokens, KvWork& work) {
  const auto n = static_cast<int64_t>(tokens.size());
  if (groups_.size() > 1 && !can_start(tokens)) {
    return Error{fmt::format("KV cache out of budget: a new sequence of {} tokens", n)};
  }
  // Every group maps the same hit: the longest prefix all of them serve.
  const int64_t h = prefix_hit_blocks(tokens);
  int64_t cached = 0;
  for (int g = 0; g < n_groups(); ++g) {
    auto r = manager(g).allocate(s, tokens, h);
    if (!r) {
      (void)free(s);  // the groups allocated before this one
      return Error{r.error()};
    }
    if (static_cast<size_t>(g) == lead_) cached = *r;
  }
  // FP16 prefix hits the prompt needs in the body format are quantised now.
  if (cfg_.layout.mixed() && cached > 0) {
    for (int g = 0; g < n_groups(); ++g) {
      if (Status st = move_exits(g, s, cached, false, work); !st) return Error{st.error()};
    }
  }
  return cached;
}

Result<int64_t> KvCoordinator::append(SeqId s, int64_t written, std::span<const int32_t> tokens,
                                      bool migrate, KvWork& work) {
  const auto n = static_cast<int64_t>(tokens.size());
  if (n == 0) return int64_t{0};
  if (!has_sequence(s)) return start(s, tokens, work);
  int failed = 0;
  const std::optional<std::vector<AppendPlan>> plans = plan_all(s, written, n, migrate, &failed);
  if (!plans) {
    const BlockPool& f16 = manager(failed).pool(PoolKind::kFp16);
    const BlockPool& body = manager(failed).pool(PoolKind::kBody);
    return Error{fmt::format(
        "KV cache out of budget: {} tokens held, {} more requested (layer group {}: FP16 pool {} "
        "of {} blocks free, body pool {} of {} free)",
        manager(failed).num_tokens(s), n, failed, f16.num_available(), f16.n_blocks(),
        body.num_available(), body.n_blocks())};
  }
  // The plans, executed as they were made: each piece, then the exits it planned.
  for (int g = 0; g < n_groups(); ++g) {
    size_t off = 0;
    for (const Piece& piece : (*plans)[static_cast<size_t>(g)]) {
      auto r = manager(g).append(s, tokens.subspan(off, static_cast<size_t>(piece.tokens)));
      if (!r) return Error{r.error()};  // unreachable after the plan
      off += static_cast<size_t>(piece.tokens);
      for (const KvCopy& c : *r) {
        KvWorkItem w;
        w.kind = KvWorkItem::Kind::kCopy;
        w.group = g;
        w.copy = c;
        w.seq = s;
        work.push_back(w);
      }
      for (const int64_t b : piece.exits) {
        if (Status st = migrate_block(g, s, b, written, work); !st) return Error{st.error()};
      }
    }
  }
  return int64_t{0};
}

Status KvCoordinator::finish_pass(SeqId s, int64_t written, KvWork& work) {
  for (int g = 0; g < n_groups(); ++g) {
    if (Status st = move_exits(g, s, written, true, work); !st) return st;
  }
  return {};
}

Status KvCoordinator::fork(SeqId parent, SeqId child) {
  for (Group& gr : groups_) {
    if (!gr.mgr->has_sequence(parent)) continue;
    if (Status st = gr.mgr->fork(parent, child); !st) return st;
  }
  return {};
}

void KvCoordinator::unpin_all() {
  for (Group& gr : groups_) {
    for (const PoolKind p : {PoolKind::kFp16, PoolKind::kBody}) gr.mgr->pool(p).unpin_all();
  }
}

Status KvCoordinator::free(SeqId s) {
  for (Group& gr : groups_) {
    if (!gr.mgr->has_sequence(s)) continue;
    if (Status st = gr.mgr->free(s); !st) return st;
  }
  return {};
}

Status KvCoordinator::truncate(SeqId s, int64_t n) {
  // Local groups first: the lead (global) group refuses only where a local group refuses too
  // (its body blocks are body or dropped there), so a refusal changes nothing.
  for (size_t pass = 0; pass < 2; ++pass) {
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      if ((gi == lead_) != (pass == 1)) continue;
      if (Status st = groups_[gi].mgr->truncate(s, n); !st) return st;
    }
  }
  return {};
}

Status KvCoordinator::mark_computed(SeqId s, int64_t n) {
  for (Group& gr : groups_) {
    if (Status st = gr.mgr->mark_computed(s, n); !st) return st;
  }
  return {};
}

Status KvCoordinator::check_integrity() const {
  const BlockManager& lead = manager();
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const BlockManager& m = *groups_[gi].mgr;
    if (Status st = m.check_integrity(); !st) {
      return groups_.size() == 1 ? st : Error{fmt::format("layer group {}: {}", gi, st.error())};
    }
    if (gi == lead_) continue;
    // Every group holds the same sequences with the same tokens and computed counts.
    if (m.num_sequences() != lead.num_sequences()) {
      return Error{fmt::format("paged KV cache: layer group {} holds {} sequences, the lead {}", gi,
                               m.num_sequences(), lead.num_sequences())};
    }
  }
  return {};
}

}  // namespace bie::kv
