#include "bie/kv/paged_kv_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cstring>

#include "bie/kv/kv_format_rotate.h"
#include "bie/planner/kv_bytes.h"
#include "bie/planner/kv_layout_flags.h"
#include "bie/planner/model_geometry.h"
#include "bie/quant/fp16.h"

namespace bie {

namespace {

planner::ModelGeometry planner_geometry(const KvGeometry& geo) {
  planner::ModelGeometry g;
  g.n_layer = geo.n_layer;
  g.layers.assign(static_cast<size_t>(geo.n_layer),
                  planner::LayerKv{geo.n_head_kv, geo.head_dim, geo.head_dim, 0});
  for (int il = 0; il < geo.n_layer; ++il)
    g.layers[static_cast<size_t>(il)].window = geo.window(il);
  return g;
}

Status check_config(const PagedKvStoreConfig& cfg) {
  const planner::KvLayout& l = cfg.layout;
  if (cfg.geometry.n_layer < 1 || cfg.geometry.n_head_kv < 1 || cfg.geometry.head_dim < 1 ||
      cfg.fp16_blocks < 0 || cfg.body_blocks < 0 ||
      (!cfg.geometry.layer_window.empty() &&
       cfg.geometry.layer_window.size() != static_cast<size_t>(cfg.geometry.n_layer))) {
    return Error{"paged KV cache: empty geometry or negative pool size"};
  }
  if (cfg.geometry.head_dim > 512) {
    return Error{fmt::format("paged KV cache: head_dim {} > 512", cfg.geometry.head_dim)};
  }
  if (Status s = planner::check_kv_layout(planner_geometry(cfg.geometry), l); !s) return s;
  const int d = cfg.geometry.head_dim;
  if (l.rotate && (d & (d - 1)) != 0) {
    return Error{
        fmt::format("--kv-rotate needs a power-of-two head_dim, got {}; use --no-kv-rotate", d)};
  }
  for (const planner::KvFormat f : {l.k, l.v}) {
    if (!kv::kv_format_supported(f)) {
      return Error{
          fmt::format("paged KV cache: no kernels for KV format {}", planner::kv_format_name(f))};
    }
    if (planner::is_per_channel(f)) {
      // Its scales span a tile, and a block is written or re-quantised as one tile.
      if (f.group != l.block_size) {
        return Error{fmt::format("paged KV cache: {} needs tiles of the block size ({} tokens)",
                                 planner::kv_format_name(f), l.block_size)};
      }
      // Only a block outside the window may be stored in the body format, and such a block is
      // always complete when written (it lies wholly before the newest token).
      if (l.window_tokens < 1) {
        return Error{fmt::format("paged KV cache: {} needs an FP16 window of at least one token",
                                 planner::kv_format_name(f))};
      }
    }
  }
  return {};
}

}  // namespace

Result<PagedKvStoreConfig> PagedKvStore::planned_config(const KvGeometry& geometry,
                                                        const planner::KvLayout& layout,
                                                        int64_t max_tokens, int64_t max_num_seqs,
                                                        int64_t chunk_tokens) {
  if (max_tokens < 1 || max_num_seqs < 1) return Error{"paged KV cache: max_tokens < 1"};
  const planner::KvPoolPlan plan = planner::kv_pool_plan(planner_geometry(geometry), layout,
                                                         max_tokens, max_num_seqs, chunk_tokens);
  PagedKvStoreConfig c;
  c.geometry = geometry;
  c.layout = layout;
  c.groups = plan.groups;
  if (plan.groups.size() == 1) {
    c.fp16_blocks = plan.groups[0].fp16_blocks;
    c.body_blocks = plan.groups[0].body_blocks;
  }
  return c;
}

Result<std::unique_ptr<PagedKvStore>> PagedKvStore::create(const PagedKvStoreConfig& cfg) {
  if (Status s = check_config(cfg); !s) return Error{s.error()};
  const planner::ModelGeometry g = planner_geometry(cfg.geometry);
  const planner::KvPoolPlan plan = planner::kv_pool_plan(g, cfg.layout, 1, 1);
  const size_t n_groups = plan.groups.size();
  if (cfg.budget == nullptr && n_groups > 1 && cfg.groups.size() != n_groups) {
    return Error{fmt::format("paged KV cache: {} layer groups but pool sizes for {}", n_groups,
                             cfg.groups.size())};
  }
  std::unique_ptr<PagedKvStore> c(new PagedKvStore(cfg));
  // Layer il -> (group, index within the group's block), in layer order.
  c->slots_.resize(static_cast<size_t>(cfg.geometry.n_layer));
  std::vector<int> filled(n_groups, 0);
  for (int il = 0; il < cfg.geometry.n_layer; ++il) {
    const planner::LayerKv& l = g.layers[static_cast<size_t>(il)];
    const auto it = std::find_if(plan.groups.begin(), plan.groups.end(),
                                 [&](const planner::KvGroupPool& p) { return p.group.shape == l; });
    assert(it != plan.groups.end());
    const auto gi = static_cast<size_t>(it - plan.groups.begin());
    c->slots_[static_cast<size_t>(il)] = {static_cast<int>(gi), filled[gi]++};
  }
  for (size_t gi = 0; gi < n_groups; ++gi) {
    const planner::KvGroupPool& p = plan.groups[gi];
    kv::BlockManagerConfig mc;
    mc.layout = cfg.layout;
    mc.local_window = p.group.shape.window;
    mc.model_id = cfg.model_id;
    mc.enable_prefix_caching = cfg.enable_prefix_caching;
    mc.fp16_blocks = n_groups == 1 && cfg.groups.empty() ? cfg.fp16_blocks
                     : gi < cfg.groups.size()            ? cfg.groups[gi].fp16_blocks
                                                         : 0;
    mc.body_blocks = n_groups == 1 && cfg.groups.empty() ? cfg.body_blocks
                     : gi < cfg.groups.size()            ? cfg.groups[gi].body_blocks
                                                         : 0;
    mc.fp16_block_bytes = p.fp16_block_bytes;
    mc.body_block_bytes = p.body_block_bytes;
    mc.reserve_memory = cfg.device == nullptr;  // a host store writes into the pools' memory
    mc.budget = cfg.budget;
    mc.sizes_as_given = cfg.pools_as_given;
    mc.events = cfg.events;
    mc.events_medium =
        n_groups == 1 ? cfg.events_medium : fmt::format("{}/g{}", cfg.events_medium, gi);
    auto m = kv::BlockManager::create(mc);
    if (!m) return Error{m.error()};
    c->groups_.push_back({std::make_unique<kv::BlockManager>(std::move(m).value()),
                          p.group.shape.window, static_cast<int>(p.group.n_layers)});
  }
  const auto lead = std::find_if(c->groups_.begin(), c->groups_.end(),
                                 [](const Group& gr) { return gr.window == 0; });
  c->lead_ = lead == c->groups_.end() ? 0 : static_cast<size_t>(lead - c->groups_.begin());
  for (const Group& gr : c->groups_) {
    for (int p = 0; p < kv::kPoolKinds; ++p) {
      const PoolFormat& f = c->fmt_[p];
      const uint64_t want = static_cast<uint64_t>(gr.n_layers) * f.layer_bytes;
      const kv::BlockPool& pool = gr.mgr->pool(kv::PoolKind(p));
      if (pool.n_blocks() > 0 && pool.block_bytes() != want) {
        return Error{fmt::format("paged KV cache: planner block bytes {} != layout bytes {}",
                                 pool.block_bytes(), want)};
      }
      if (f.tk == nullptr || f.tv == nullptr) return Error{"paged KV cache: missing kernels"};
    }
  }
  if (cfg.device != nullptr) {
    if (Status st = c->alloc_device_pools(); !st) return Error{st.error()};
  }
  return c;
}

Status PagedKvStore::alloc_device_pools() {
  Backend& be = *cfg_.device;
  const planner::KvLayout& l = cfg_.layout;
  for (const PoolFormat& f : fmt_) {
    if (!be.supports_paged_kv() ||
        !be.supports_kv_types(static_cast<uint8_t>(f.k.type), static_cast<uint8_t>(f.v.type),
                              l.rotate)) {
      return Error{fmt::format(
          "KV regime {} does not run on the {} backend yet (a device holds the per-token formats "
          "f16, fp8_e4m3, int8 and int4_asym, keys unrotated: use --kv-cache-dtype f16, or "
          "--device cpu)",
          planner::kv_layout_label(l), be.name())};
    }
  }
  device_pools_.resize(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (int p = 0; p < kv::kPoolKinds; ++p) {
      const kv::BlockPool& pool = groups_[g].mgr->pool(kv::PoolKind(p));
      const PoolFormat& f = fmt_[static_cast<size_t>(p)];
      KvPoolDesc& d = device_pools_[g][static_cast<size_t>(p)];
      d.k_type = static_cast<uint8_t>(f.k.type);
      d.v_type = static_cast<uint8_t>(f.v.type);
      d.k_group = f.k.group;
      d.v_group = f.v.group;
      d.k_tile_bytes = f.k_tile;
      d.v_tile_bytes = f.v_tile;
      d.round_rows_to_fp16 = l.mixed() && kv::PoolKind(p) == kv::PoolKind::kBody;  // as store()
      if (pool.n_blocks() == 0) continue;
      const size_t bytes = static_cast<size_t>(pool.n_blocks()) * pool.block_bytes();
      if (bytes > be.max_kv_pool_bytes()) {
        return Error{fmt::format(
            "a KV pool of {} blocks ({} MiB) is larger than the {} device binds at once ({} MiB); "
            "lower --max-model-len or --kv-cache-memory",
            pool.n_blocks(), bytes >> 20, be.name(), be.max_kv_pool_bytes() >> 20)};
      }
      auto buf = be.alloc(bytes);
      if (!buf) {
        return Error{fmt::format("KV pool of {} blocks ({} bytes) on the {} device: {}",
                                 pool.n_blocks(), bytes, be.name(), buf.error())};
      }
      d.memory = Tensor{buf->get(),
                        0,
                        quant::GgmlType::I8,
                        pool.n_blocks(),
                        static_cast<int64_t>(pool.block_bytes()),
                        pool.block_bytes()};
      device_buffers_.push_back(std::move(buf).value());
    }
  }
  return {};
}

KvBlockRef PagedKvStore::device_ref(const kv::BlockTableEntry& e) {
  // Pool blocks are numbered from 1 (0 is the null block, which has no storage); a null entry
  // (a block a sliding window dropped) names block 0, which attention never reads.
  return KvBlockRef{static_cast<int32_t>(e.pool),
                    e.block.index == kv::kNullBlock ? 0 : static_cast<int32_t>(e.block.index) - 1};
}

Result<Tensor> PagedKvStore::staging(int slot, int64_t rows, int64_t cols) {
  const size_t bytes = static_cast<size_t>(rows) * static_cast<size_t>(cols) * sizeof(float);
  std::unique_ptr<DeviceBuffer>& b = staging_[static_cast<size_t>(slot)];
  if (b == nullptr || b->size() < bytes) {
    auto nb = cfg_.device->alloc(std::max<size_t>(bytes, 4096));
    if (!nb) return Error{nb.error()};
    b = std::move(nb).value();
  }
  return tensor_of(*b, quant::GgmlType::F32, rows, cols);
}

PagedKvStore::~PagedKvStore() = default;

PagedKvStore::PagedKvStore(const PagedKvStoreConfig& cfg) : cfg_(cfg) {
  const int d = cfg_.geometry.head_dim;
  const int B = cfg_.layout.block_size;
  const std::array<planner::KvFormat, kv::kPoolKinds> ks = {planner::kKvF16, cfg_.layout.k};
  const std::array<planner::KvFormat, kv::kPoolKinds> vs = {planner::kKvF16, cfg_.layout.v};
  for (int p = 0; p < kv::kPoolKinds; ++p) {
    PoolFormat& f = fmt_[p];
    f.k = ks[p];
    f.v = vs[p];
    f.tk = kv::kv_traits(f.k.type);
    f.tv = kv::kv_traits(f.v.type);
    f.k_tile = kv::kv_tile_bytes(f.k, d, B);
    f.v_tile = kv::kv_tile_bytes(f.v, d, B);
    f.layer_bytes = static_cast<size_t>(cfg_.geometry.n_head_kv) * (f.k_tile + f.v_tile);
  }
  rows_.resize(static_cast<size_t>(B) * static_cast<size_t>(d));
}

uint64_t PagedKvStore::reserved_bytes() const {
  uint64_t sum = 0;
  for (const Group& gr : groups_) sum += gr.mgr->reserved_bytes();
  return sum;
}

bool PagedKvStore::has_local_groups() const {
  return std::any_of(groups_.begin(), groups_.end(), [](const Group& gr) { return gr.window > 0; });
}

Status PagedKvStore::free(kv::SeqId s) {
  for (Group& gr : groups_) {
    if (!gr.mgr->has_sequence(s)) continue;
    if (Status st = gr.mgr->free(s); !st) return st;
  }
  return {};
}

Status PagedKvStore::truncate(kv::SeqId s, int64_t n) {
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

Status PagedKvStore::mark_computed(kv::SeqId s, int64_t n) {
  for (Group& gr : groups_) {
    if (Status st = gr.mgr->mark_computed(s, n); !st) return st;
  }
  return {};
}

uint8_t* PagedKvStore::block_data(int g, const kv::BlockTableEntry& e) {
  return manager(g).pool(e.pool).data(e.block.index);
}

bool PagedKvStore::can_migrate_now(int64_t written_rows) const {
  // Whole blocks, and blocks not written yet (store then writes them in the body format), can
  // move at any time; a partly written one only if the body formats store rows independently.
  if (written_rows <= 0 || written_rows >= cfg_.layout.block_size) return true;
  const PoolFormat& f = format(kv::PoolKind::kBody);
  return !planner::is_per_channel(f.k) && !planner::is_per_channel(f.v);
}

std::optional<std::vector<int64_t>> PagedKvStore::plan_append(int g, kv::SeqId s, int64_t written,
                                                              int64_t n, bool migrate,
                                                              uint64_t* budget_bytes) const {
  const kv::BlockManager& mgr = manager(g);
  assert(mgr.has_sequence(s) && n > 0);
  const planner::KvLayout& l = cfg_.layout;
  const int64_t B = l.block_size;
  const int64_t W = groups_[static_cast<size_t>(g)].window;
  const int64_t n0 = mgr.num_tokens(s);
  kv::PoolCapacity cap = mgr.capacity();
  if (cap.budgeted) cap.bytes = std::min(cap.bytes, *budget_bytes);
  std::vector<int64_t> pieces;
  // An unmixed layout has no window to leave: one append, as the manager plans it.
  if (!l.mixed()) {
    if (!mgr.can_append(s, n)) return std::nullopt;
    if (cap.budgeted) {  // the groups before this one charged the shared budget too
      const auto fresh = static_cast<uint64_t>((n0 + n + B - 1) / B - (n0 + B - 1) / B);
      const uint64_t need = fresh * cap.cost[static_cast<int>(kv::PoolKind::kBody)];
      if (need > cap.bytes) return std::nullopt;
      *budget_bytes = cap.bytes - need;
    }
    return std::vector<int64_t>{n};
  }
  for (int64_t x = n0; x < n0 + n;) {
    const int64_t k = std::min(B - x % B, n0 + n - x);  // up to the next block boundary
    pieces.push_back(k);
    x += k;
  }
  // Dry run of append(): where each block lives after every piece and its migrations (nullopt:
  // dropped from a sliding window).
  const kv::BlockTable& t = mgr.table(s);
  std::vector<std::optional<kv::PoolKind>> where;
  where.reserve(t.size() + pieces.size());
  for (const kv::BlockTableEntry& e : t) {
    where.push_back(e.block.index == kv::kNullBlock ? std::nullopt
                                                    : std::optional<kv::PoolKind>(e.pool));
  }
  const auto role = [&](int64_t i, int64_t len) { return kv::block_role(l, W, i, len); };
  const auto migrate_exits_dry = [&](int64_t len, bool after_pass) {
    for (size_t i = 0; i < where.size(); ++i) {
      const int64_t b = static_cast<int64_t>(i);
      if (where[i] != kv::PoolKind::kFp16 || role(b, len) != kv::BlockRole::kBody) continue;
      if (!after_pass && !can_migrate_now(std::clamp<int64_t>(written - b * B, 0, B))) continue;
      if (!cap.take(kv::PoolKind::kBody)) return false;
      cap.give(kv::PoolKind::kFp16);
      where[i] = kv::PoolKind::kBody;
    }
    return true;
  };
  int64_t x = n0;
  for (const int64_t k : pieces) {
    const int64_t x1 = x + k;
    if (x % B == 0) {  // the piece starts a new block, in the pool of its role at x1
      const kv::PoolKind p =
          role(x / B, x1) == kv::BlockRole::kFp16 ? kv::PoolKind::kFp16 : kv::PoolKind::kBody;
      if (!cap.take(p)) return std::nullopt;
      where.push_back(p);
    }
    if (migrate && !migrate_exits_dry(x1, false)) return std::nullopt;
    x = x1;
  }
  // Blocks kept FP16 through the pass move after it (attend -> migrate_exits); blocks a sliding
  // window no longer keeps are dropped then too, but not counted as freed here (a caller may
  // hold draft tokens, and a drop waits for verified tokens).
  if (migrate && !migrate_exits_dry(n0 + n, true)) return std::nullopt;
  if (cap.budgeted) *budget_bytes = cap.bytes;
  return pieces;
}

int64_t PagedKvStore::prefix_hit_blocks(std::span<const int32_t> prompt) const {
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

int64_t PagedKvStore::prefix_hit_tokens(std::span<const int32_t> prompt) const {
  return prefix_hit_blocks(prompt) * cfg_.layout.block_size;
}

bool PagedKvStore::can_start(std::span<const int32_t> tokens) const {
  if (tokens.empty()) return false;
  const int64_t h = prefix_hit_blocks(tokens);
  // Each group places every block by its role at once; with a shared budget the groups' new
  // blocks and pinned hits are charged together.
  uint64_t cost = 0, left = 0;
  bool budgeted = false;
  for (const Group& gr : groups_) {
    if (!gr.mgr->can_allocate(tokens, h)) return false;
    const kv::PoolCapacity cap = gr.mgr->capacity();
    if (!cap.budgeted) continue;
    budgeted = true;
    left = cap.bytes;
    const kv::BlockNeeds nd = gr.mgr->allocation_needs(tokens, h);
    for (int p = 0; p < kv::kPoolKinds; ++p) {
      cost += static_cast<uint64_t>(nd.need[p] + nd.pinned[p]) * cap.cost[p];
    }
  }
  return !budgeted || groups_.size() == 1 || cost <= left;
}

bool PagedKvStore::can_append(kv::SeqId s, int64_t written, int64_t n, bool migrate) const {
  if (n <= 0) return n == 0;
  if (!has_sequence(s)) {
    const std::vector<int32_t> placeholder(static_cast<size_t>(n), 0);
    return can_start(placeholder);
  }
  uint64_t budget_bytes = UINT64_MAX;
  for (int g = 0; g < n_groups(); ++g) {
    if (!plan_append(g, s, written, n, migrate, &budget_bytes)) return false;
  }
  return true;
}

Result<int64_t> PagedKvStore::append_tokens(kv::SeqId s, int64_t written,
                                            std::span<const int32_t> tokens, bool migrate) {
  const auto n = static_cast<int64_t>(tokens.size());
  if (n == 0) return int64_t{0};
  if (!has_sequence(s)) {
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
        if (Status st = move_exits(g, s, cached, false); !st) return Error{st.error()};
      }
    }
    return cached;
  }
  std::vector<std::vector<int64_t>> pieces;
  uint64_t budget_bytes = UINT64_MAX;
  for (int g = 0; g < n_groups(); ++g) {
    std::optional<std::vector<int64_t>> p = plan_append(g, s, written, n, migrate, &budget_bytes);
    if (!p) {
      const kv::BlockPool& f16 = manager(g).pool(kv::PoolKind::kFp16);
      const kv::BlockPool& body = manager(g).pool(kv::PoolKind::kBody);
      return Error{fmt::format(
          "KV cache out of budget: {} tokens held, {} more requested (layer group {}: FP16 pool "
          "{} of {} blocks free, body pool {} of {} free)",
          manager(g).num_tokens(s), n, g, f16.num_available(), f16.n_blocks(), body.num_available(),
          body.n_blocks())};
    }
    pieces.push_back(std::move(*p));
  }
  for (int g = 0; g < n_groups(); ++g) {
    size_t off = 0;
    for (const int64_t k : pieces[static_cast<size_t>(g)]) {
      auto r = manager(g).append(s, tokens.subspan(off, static_cast<size_t>(k)));
      if (!r) return Error{r.error()};  // unreachable after plan_append
      off += static_cast<size_t>(k);
      if (Status st = execute_copies(g, *r); !st) return Error{st.error()};
      if (cfg_.layout.mixed() && migrate) {
        if (Status st = move_exits(g, s, written, false); !st) return Error{st.error()};
      }
    }
  }
  return int64_t{0};
}

Status PagedKvStore::execute_copies(int g, std::span<const kv::KvCopy> copies) {
  if (on_device()) {
    std::vector<KvBlockCopy> jobs;
    for (const kv::KvCopy& c : copies) {
      jobs.push_back({device_ref({c.pool, c.src}), device_ref({c.pool, c.dst})});
    }
    if (jobs.empty()) return {};
    return cfg_.device->copy_blocks(device_pools_[static_cast<size_t>(g)], jobs);
  }
  for (const kv::KvCopy& c : copies) {  // copy-on-write of a shared last block
    kv::BlockPool& p = manager(g).pool(c.pool);
    std::memcpy(p.data(c.dst.index), p.data(c.src.index), p.block_bytes());
  }
  return {};
}

Status PagedKvStore::write(kv::SeqId s, int il, int64_t pos0, const Tensor& k, const Tensor& v,
                           Backend& backend) {
  if (!on_device()) {
    float *kp = nullptr, *vp = nullptr;
    if (Status st = host_rows(backend, k, v, "K/V", &kp, &vp); !st) return st;
    store(s, il, pos0, k.rows, kp, vp);
    return {};
  }
  const LayerSlot slot = slots_[static_cast<size_t>(il)];
  const kv::BlockTable& t = manager(slot.group).table(s);
  const int B = cfg_.layout.block_size;
  slots_buf_.clear();
  for (int64_t p = pos0; p < pos0 + k.rows; ++p) {
    const kv::BlockTableEntry& e = t[static_cast<size_t>(p / B)];
    assert(e.block.index != kv::kNullBlock);
    slots_buf_.push_back({device_ref(e), static_cast<int32_t>(p % B)});
  }
  KvWriteMetadata m;
  m.k = k;
  m.v = v;
  m.layer_in_group = slot.index;
  m.n_head_kv = cfg_.geometry.n_head_kv;
  m.head_dim = cfg_.geometry.head_dim;
  m.block_size = B;
  m.rotate_keys = cfg_.layout.rotate;
  m.pools = device_pools_[static_cast<size_t>(slot.group)];
  m.slots = slots_buf_;
  return cfg_.device->kv_write(m);
}

Status PagedKvStore::attention(kv::SeqId s, int il, int64_t pos0, const Tensor& q, int n_head,
                               float scale, const Tensor& out, Backend& backend, int64_t window) {
  (void)backend;
  if (!on_device()) {
    return Error{
        "paged KV cache in host memory: attention over its blocks runs in the attention runner "
        "(attention::AttentionRunner reads host_blocks)"};
  }
  const LayerSlot slot = slots_[static_cast<size_t>(il)];
  const kv::BlockTable& t = manager(slot.group).table(s);
  const int B = cfg_.layout.block_size;
  const int64_t nb = (pos0 + q.rows + B - 1) / B;
  table_buf_.clear();
  int32_t pool_id = -1;
  for (int64_t b = 0; b < nb; ++b) {
    table_buf_.push_back(device_ref(t[static_cast<size_t>(b)]));
    if (t[static_cast<size_t>(b)].block.index != kv::kNullBlock) pool_id = table_buf_.back().pool;
  }
  // Dropped blocks (never read) name a pool that holds blocks; the others keep their own (a mixed
  // layout's table spans the FP16 and the body pool).
  for (int64_t b = 0; b < nb; ++b) {
    if (t[static_cast<size_t>(b)].block.index == kv::kNullBlock && pool_id >= 0) {
      table_buf_[static_cast<size_t>(b)].pool = pool_id;
    }
  }
  const int32_t query_start[2] = {0, static_cast<int32_t>(q.rows)};
  const int64_t q_pos0[1] = {pos0};
  const int32_t table_start[2] = {0, static_cast<int32_t>(nb)};
  AttnMetadata m;
  m.q = q;
  m.out = out;
  m.layer_in_group = slot.index;
  m.n_layers_in_group = groups_[static_cast<size_t>(slot.group)].n_layers;
  m.n_head = n_head;
  m.n_head_kv = cfg_.geometry.n_head_kv;
  m.head_dim = cfg_.geometry.head_dim;
  m.block_size = B;
  m.scale = scale;
  m.window = window;
  m.rotate_keys = cfg_.layout.rotate;
  m.pools = device_pools_[static_cast<size_t>(slot.group)];
  m.query_start = query_start;
  m.q_pos0 = q_pos0;
  m.block_table_start = table_start;
  m.block_table = table_buf_;
  return cfg_.device->paged_attention(m);
}

void PagedKvStore::store(kv::SeqId s, int il, int64_t pos0, int64_t n, const float* k,
                         const float* v) {
  if (on_device()) {  // staged: host rows -> device tensors -> kv_write
    const int64_t kv_dim = cfg_.geometry.kv_dim();
    auto kt = staging(0, n, kv_dim);
    auto vt = staging(1, n, kv_dim);
    Status st = !kt ? Status{Error{kt.error()}} : !vt ? Status{Error{vt.error()}} : Status{};
    if (st) {
      cfg_.device->upload(*kt, k);
      cfg_.device->upload(*vt, v);
      st = write(s, il, pos0, *kt, *vt, *cfg_.device);
    }
    if (!st) device_error_ = st.error();
    return;
  }
  const LayerSlot slot = slots_[static_cast<size_t>(il)];
  const kv::BlockManager& mgr = manager(slot.group);
  assert(pos0 >= 0 && pos0 + n <= mgr.num_tokens(s));
  const kv::BlockTable& t = mgr.table(s);
  const int B = cfg_.layout.block_size;
  const int d = cfg_.geometry.head_dim;
  const int H = cfg_.geometry.n_head_kv;
  const int64_t kv_dim = cfg_.geometry.kv_dim();
  for (int64_t p = pos0; p < pos0 + n;) {
    const int64_t lb = p / B;
    const int t0 = static_cast<int>(p % B);
    const int cnt = static_cast<int>(std::min<int64_t>(B - t0, pos0 + n - p));
    const kv::BlockTableEntry& e = t[static_cast<size_t>(lb)];
    assert(e.block.index != kv::kNullBlock);
    const PoolFormat& f = format(e.pool);
    uint8_t* layer = block_data(slot.group, e) + static_cast<size_t>(slot.index) * f.layer_bytes;
    // In a mixed layout a body block is quantised from FP16-rounded rows, as if it had passed
    // through the FP16 window: its bytes do not depend on the path (written straight into the
    // body, migrated from the window, or quantised from an FP16 prefix-cache hit).
    const bool round_to_fp16 = cfg_.layout.mixed() && e.pool == kv::PoolKind::kBody;
    // note: per-channel tiles are only ever written whole (check_config).
    assert(!(planner::is_per_channel(f.k) || planner::is_per_channel(f.v)) ||
           (t0 == 0 && cnt == B));
    for (int h = 0; h < H; ++h) {
      for (int pass = 0; pass < 2; ++pass) {
        const float* src = (pass == 0 ? k : v) + (p - pos0) * kv_dim + static_cast<int64_t>(h) * d;
        for (int r = 0; r < cnt; ++r) {
          float* row = rows_.data() + static_cast<size_t>(r) * d;
          std::memcpy(row, src + r * kv_dim, static_cast<size_t>(d) * sizeof(float));
          if (pass == 0 && cfg_.layout.rotate) kv::hadamard_rotate(row, d);
          if (round_to_fp16) {
            for (int i = 0; i < d; ++i) row[i] = quant::fp16_to_fp32(quant::fp32_to_fp16(row[i]));
          }
        }
        if (pass == 0) {
          f.tk->store(kv::kv_row_geom(f.k, d), rows_.data(), layer + h * f.k_tile, t0, cnt);
        } else {
          f.tv->store(kv::kv_row_geom(f.v, d), rows_.data(), layer + H * f.k_tile + h * f.v_tile,
                      t0, cnt);
        }
      }
    }
    p += cnt;
  }
}

kv::HostKvBlocks PagedKvStore::host_blocks(kv::SeqId s, int il, int64_t n_ctx) {
  if (on_device()) return {};
  const int B = cfg_.layout.block_size;
  const int d = cfg_.geometry.head_dim;
  const int H = cfg_.geometry.n_head_kv;
  const int64_t nb = (n_ctx + B - 1) / B;
  const LayerSlot slot = slots_[static_cast<size_t>(il)];
  const kv::BlockTable& t = manager(slot.group).table(s);
  views_.resize(static_cast<size_t>(nb));
  for (int64_t b = 0; b < nb; ++b) {
    const kv::BlockTableEntry& e = t[static_cast<size_t>(b)];
    kv::KvBlockView& bv = views_[static_cast<size_t>(b)];
    if (e.block.index == kv::kNullBlock) {  // dropped: outside every query's window (never read)
      bv = kv::KvBlockView{};
      continue;
    }
    const PoolFormat& f = format(e.pool);
    const uint8_t* layer =
        block_data(slot.group, e) + static_cast<size_t>(slot.index) * f.layer_bytes;
    bv.k = layer;
    bv.v = layer + static_cast<size_t>(H) * f.k_tile;
    bv.k_tile_bytes = f.k_tile;
    bv.v_tile_bytes = f.v_tile;
    bv.tk = f.tk;
    bv.tv = f.tv;
    bv.gk = kv::kv_row_geom(f.k, d);
    bv.gv = kv::kv_row_geom(f.v, d);
    bv.k_f16 = f.k.type == planner::KvType::kF16;
  }
  return kv::HostKvBlocks{views_, B, cfg_.layout.rotate};
}

void PagedKvStore::attend(kv::SeqId s, int il, int64_t pos0, int64_t n, const float* q, int n_head,
                          float scale, float* out, int64_t window) {
  if (on_device()) {  // staged: host queries -> device -> paged_attention -> host output
    const int64_t q_dim = static_cast<int64_t>(n_head) * cfg_.geometry.head_dim;
    auto qt = staging(2, n, q_dim);
    auto ot = staging(3, n, q_dim);
    Status st = !qt ? Status{Error{qt.error()}} : !ot ? Status{Error{ot.error()}} : Status{};
    if (st) {
      cfg_.device->upload(*qt, q);
      st = attention(s, il, pos0, *qt, n_head, scale, *ot, *cfg_.device, window);
      cfg_.device->download(*ot, out);
    }
    if (st) st = cfg_.device->status();
    if (!st) device_error_ = st.error();
    return;
  }
  // A host store runs no attention: the attention runner reads host_blocks instead.
  if (device_error_.empty()) {
    device_error_ = "attend() on a host store (attention::AttentionRunner reads its host_blocks)";
  }
}

Status PagedKvStore::quantise_block(int g, const kv::Migration& m, int rows) {
  if (on_device()) {
    const KvBlockQuantise job{device_ref({kv::PoolKind::kFp16, m.src}),
                              device_ref({kv::PoolKind::kBody, m.dst}), rows};
    return cfg_.device->quantise_blocks(
        device_pools_[static_cast<size_t>(g)], {&job, 1}, groups_[static_cast<size_t>(g)].n_layers,
        cfg_.geometry.n_head_kv, cfg_.geometry.head_dim, cfg_.layout.block_size);
  }
  const PoolFormat& src_f = format(kv::PoolKind::kFp16);
  const PoolFormat& dst_f = format(kv::PoolKind::kBody);
  const uint8_t* src = manager(g).pool(kv::PoolKind::kFp16).data(m.src.index);
  uint8_t* dst = manager(g).pool(kv::PoolKind::kBody).data(m.dst.index);
  const int d = cfg_.geometry.head_dim;
  const int H = cfg_.geometry.n_head_kv;
  const kv::KvRowGeom g16 = kv::kv_row_geom(planner::kKvF16, d);
  for (int il = 0; il < groups_[static_cast<size_t>(g)].n_layers; ++il) {
    const uint8_t* s = src + static_cast<size_t>(il) * src_f.layer_bytes;
    uint8_t* t = dst + static_cast<size_t>(il) * dst_f.layer_bytes;
    for (int h = 0; h < H; ++h) {
      // FP16 rows -> fp32 staging -> body format (load is the reference decoder; this is storage
      // work, not attention).
      src_f.tk->load(g16, s + h * src_f.k_tile, 0, rows, rows_.data());
      dst_f.tk->store(kv::kv_row_geom(dst_f.k, d), rows_.data(), t + h * dst_f.k_tile, 0, rows);
      src_f.tv->load(g16, s + H * src_f.k_tile + h * src_f.v_tile, 0, rows, rows_.data());
      dst_f.tv->store(kv::kv_row_geom(dst_f.v, d), rows_.data(),
                      t + H * dst_f.k_tile + h * dst_f.v_tile, 0, rows);
    }
  }
  return {};
}

Status PagedKvStore::move_exits(int g, kv::SeqId s, int64_t written, bool drop) {
  kv::BlockManager& mgr = manager(g);
  if (!mgr.has_sequence(s)) return {};
  const int64_t B = cfg_.layout.block_size;
  const int64_t W = groups_[static_cast<size_t>(g)].window;
  for (const kv::WindowExit& x : mgr.blocks_leaving_window(s)) {
    if (x.drop) {
      // Dropped only once no query to come can reach it: outside the window at the `written`
      // tokens stored (the sequence may hold more, e.g. a whole prompt of which a chunk ran).
      if (drop && kv::block_role(cfg_.layout, W, x.logical, written) == kv::BlockRole::kDropped) {
        auto r = mgr.drop(s, x.logical);
        if (!r) return Error{r.error()};
      }
      continue;
    }
    const int64_t rows = std::clamp<int64_t>(written - x.logical * B, 0, B);
    if (!can_migrate_now(rows)) continue;  // partly written per-channel tile: after the pass
    auto m = mgr.begin_migration(s, x.logical);
    if (!m) return Error{m.error()};
    if (m->needs_quantise && rows > 0) {
      if (Status st = quantise_block(g, *m, static_cast<int>(rows)); !st) return st;
    }
    auto r = mgr.migrate(s, x.logical, m->dst);
    if (!r) return Error{r.error()};
  }
  return {};
}

Status PagedKvStore::migrate_exits(kv::SeqId s, int64_t written) {
  for (int g = 0; g < n_groups(); ++g) {
    if (Status st = move_exits(g, s, written, true); !st) return st;
  }
  return {};
}

uint64_t PagedKvStore::held_bytes() const {
  uint64_t sum = 0;
  for (const Group& gr : groups_) {
    for (const kv::PoolKind p : {kv::PoolKind::kFp16, kv::PoolKind::kBody}) {
      const kv::BlockPool& pool = gr.mgr->pool(p);
      sum += static_cast<uint64_t>(pool.num_active()) * pool.block_bytes();
    }
  }
  return sum;
}

Status PagedKvStore::check_integrity() const {
  if (!device_error_.empty()) return Error{"paged KV cache on the device: " + device_error_};
  const kv::BlockManager& lead = manager();
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const kv::BlockManager& m = *groups_[gi].mgr;
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

}  // namespace bie
