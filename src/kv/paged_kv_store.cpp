#include "bie/kv/paged_kv_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cstring>

#include "bie/kv/kv_format_rotate.h"
#include "bie/planner/kv_bytes.h"
#include "bie/planner/model_geometry.h"

namespace bie {

namespace {

planner::ModelGeometry planner_geometry(const KvGeometry& geo) {
  planner::ModelGeometry g;
  g.n_layer = geo.n_layer;
  g.layers.assign(static_cast<size_t>(geo.n_layer),
                  planner::LayerKv{geo.n_head_kv, geo.head_dim, geo.head_dim, 0});
  return g;
}

Status check_config(const PagedKvStoreConfig& cfg) {
  const planner::KvLayout& l = cfg.layout;
  if (cfg.geometry.n_layer < 1 || cfg.geometry.n_head_kv < 1 || cfg.geometry.head_dim < 1 ||
      cfg.fp16_blocks < 0 || cfg.body_blocks < 0) {
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
    if (f.type == planner::KvType::kInt4Channel) {
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
                                                        int64_t max_tokens, int64_t max_num_seqs) {
  if (max_tokens < 1 || max_num_seqs < 1) return Error{"paged KV cache: max_tokens < 1"};
  const planner::KvPoolPlan plan =
      planner::kv_pool_plan(planner_geometry(geometry), layout, max_tokens, max_num_seqs);
  if (plan.groups.size() != 1) return Error{"paged KV cache: expected one layer group"};
  PagedKvStoreConfig c;
  c.geometry = geometry;
  c.layout = layout;
  c.fp16_blocks = plan.groups[0].fp16_blocks;
  c.body_blocks = plan.groups[0].body_blocks;
  return c;
}

Result<std::unique_ptr<PagedKvStore>> PagedKvStore::create(const PagedKvStoreConfig& cfg) {
  if (Status s = check_config(cfg); !s) return Error{s.error()};
  const planner::KvPoolPlan plan =
      planner::kv_pool_plan(planner_geometry(cfg.geometry), cfg.layout, 1, 1);
  if (plan.groups.size() != 1) return Error{"paged KV cache: expected one layer group"};
  kv::BlockManagerConfig mc;
  mc.layout = cfg.layout;
  mc.model_id = cfg.model_id;
  mc.enable_prefix_caching = cfg.enable_prefix_caching;
  mc.fp16_blocks = cfg.fp16_blocks;
  mc.body_blocks = cfg.body_blocks;
  mc.fp16_block_bytes = plan.groups[0].fp16_block_bytes;
  mc.body_block_bytes = plan.groups[0].body_block_bytes;
  mc.reserve_memory = true;  // the store writes into the pools' memory
  mc.budget = cfg.budget;
  auto m = kv::BlockManager::create(mc);
  if (!m) return Error{m.error()};
  std::unique_ptr<PagedKvStore> c(new PagedKvStore(cfg, std::move(m).value()));
  for (int p = 0; p < kv::kPoolKinds; ++p) {
    const PoolFormat& f = c->fmt_[p];
    const uint64_t want = static_cast<uint64_t>(cfg.geometry.n_layer) * f.layer_bytes;
    const kv::BlockPool& pool = c->mgr_->pool(kv::PoolKind(p));
    if (pool.n_blocks() > 0 && pool.block_bytes() != want) {
      return Error{fmt::format("paged KV cache: planner block bytes {} != layout bytes {}",
                               pool.block_bytes(), want)};
    }
    if (f.tk == nullptr || f.tv == nullptr) return Error{"paged KV cache: missing kernels"};
  }
  return c;
}

PagedKvStore::PagedKvStore(const PagedKvStoreConfig& cfg, kv::BlockManager mgr)
    : cfg_(cfg), mgr_(std::make_unique<kv::BlockManager>(std::move(mgr))) {
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

uint8_t* PagedKvStore::block_data(const kv::BlockTableEntry& e) {
  return mgr_->pool(e.pool).data(e.block.index);
}

bool PagedKvStore::can_migrate_now(int64_t written_rows) const {
  // Whole blocks, and blocks not written yet (store then writes them in the body format), can
  // move at any time; a partly written one only if the body formats store rows independently.
  if (written_rows <= 0 || written_rows >= cfg_.layout.block_size) return true;
  const PoolFormat& f = format(kv::PoolKind::kBody);
  return !f.tk->per_channel && !f.tv->per_channel;
}

std::optional<std::vector<int64_t>> PagedKvStore::plan_append(kv::SeqId s, int64_t written,
                                                              int64_t n, bool migrate) const {
  assert(mgr_->has_sequence(s) && n > 0);
  const planner::KvLayout& l = cfg_.layout;
  const int64_t B = l.block_size;
  const int64_t n0 = mgr_->num_tokens(s);
  // An unmixed layout has no window to leave: one append, as the manager plans it.
  if (!l.mixed()) {
    if (!mgr_->can_append(s, n)) return std::nullopt;
    return std::vector<int64_t>{n};
  }
  std::vector<int64_t> pieces;
  for (int64_t x = n0; x < n0 + n;) {
    const int64_t k = std::min(B - x % B, n0 + n - x);  // up to the next block boundary
    pieces.push_back(k);
    x += k;
  }
  // Dry run of append(): where each block lives after every piece and its migrations.
  const kv::BlockTable& t = mgr_->table(s);
  std::vector<kv::PoolKind> where;
  where.reserve(t.size() + pieces.size());
  for (const kv::BlockTableEntry& e : t) where.push_back(e.pool);
  kv::PoolCapacity cap = mgr_->capacity();
  const auto role_is_fp16 = [&](int64_t i, int64_t len) {
    return kv::block_role(l, 0, i, len) == kv::BlockRole::kFp16;
  };
  const auto migrate_exits_dry = [&](int64_t len, bool after_pass) {
    for (size_t i = 0; i < where.size(); ++i) {
      const int64_t b = static_cast<int64_t>(i);
      if (where[i] != kv::PoolKind::kFp16 || role_is_fp16(b, len)) continue;
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
      const kv::PoolKind p = role_is_fp16(x / B, x1) ? kv::PoolKind::kFp16 : kv::PoolKind::kBody;
      if (!cap.take(p)) return std::nullopt;
      where.push_back(p);
    }
    if (migrate && !migrate_exits_dry(x1, false)) return std::nullopt;
    x = x1;
  }
  // Blocks kept FP16 through the pass move after it (attend -> migrate_window_exits).
  if (migrate && !migrate_exits_dry(n0 + n, true)) return std::nullopt;
  return pieces;
}

bool PagedKvStore::can_append(kv::SeqId s, int64_t written, int64_t n, bool migrate) const {
  if (n <= 0) return n == 0;
  if (!mgr_->has_sequence(s)) {
    // The first tokens: the manager places every block by its role at once.
    std::vector<int32_t> placeholder(static_cast<size_t>(n), 0);
    return mgr_->can_allocate(placeholder);
  }
  return plan_append(s, written, n, migrate).has_value();
}

Result<int64_t> PagedKvStore::append_tokens(kv::SeqId s, int64_t written,
                                            std::span<const int32_t> tokens, bool migrate) {
  const auto n = static_cast<int64_t>(tokens.size());
  if (n == 0) return int64_t{0};
  if (!mgr_->has_sequence(s)) {
    auto r = mgr_->allocate(s, tokens);
    if (!r) return Error{r.error()};
    // FP16 prefix hits the prompt needs in the body format are quantised now.
    if (cfg_.layout.mixed() && *r > 0) {
      if (Status st = migrate_exits(s, *r); !st) return Error{st.error()};
    }
    return *r;
  }
  const std::optional<std::vector<int64_t>> pieces = plan_append(s, written, n, migrate);
  if (!pieces) {
    const kv::BlockPool& f16 = mgr_->pool(kv::PoolKind::kFp16);
    const kv::BlockPool& body = mgr_->pool(kv::PoolKind::kBody);
    return Error{fmt::format(
        "KV cache out of budget: {} tokens held, {} more requested (FP16 pool {} of {} blocks "
        "free, body pool {} of {} free)",
        mgr_->num_tokens(s), n, f16.num_available(), f16.n_blocks(), body.num_available(),
        body.n_blocks())};
  }
  size_t off = 0;
  for (const int64_t k : *pieces) {
    auto r = mgr_->append(s, tokens.subspan(off, static_cast<size_t>(k)));
    if (!r) return Error{r.error()};  // unreachable after plan_append
    off += static_cast<size_t>(k);
    execute_copies(*r);
    if (cfg_.layout.mixed() && migrate) {
      if (Status st = migrate_exits(s, written); !st) return Error{st.error()};
    }
  }
  return int64_t{0};
}

void PagedKvStore::execute_copies(std::span<const kv::KvCopy> copies) {
  for (const kv::KvCopy& c : copies) {  // copy-on-write of a shared last block
    kv::BlockPool& p = mgr_->pool(c.pool);
    std::memcpy(p.data(c.dst.index), p.data(c.src.index), p.block_bytes());
  }
}

void PagedKvStore::store(kv::SeqId s, int il, int64_t pos0, int64_t n, const float* k,
                         const float* v) {
  assert(pos0 >= 0 && pos0 + n <= mgr_->num_tokens(s));
  const kv::BlockTable& t = mgr_->table(s);
  const int B = cfg_.layout.block_size;
  const int d = cfg_.geometry.head_dim;
  const int H = cfg_.geometry.n_head_kv;
  const int64_t kv_dim = cfg_.geometry.kv_dim();
  for (int64_t p = pos0; p < pos0 + n;) {
    const int64_t lb = p / B;
    const int t0 = static_cast<int>(p % B);
    const int cnt = static_cast<int>(std::min<int64_t>(B - t0, pos0 + n - p));
    const kv::BlockTableEntry& e = t[static_cast<size_t>(lb)];
    const PoolFormat& f = format(e.pool);
    uint8_t* layer = block_data(e) + static_cast<size_t>(il) * f.layer_bytes;
    // note: per-channel tiles are only ever written whole (check_config).
    assert(!(f.tk->per_channel || f.tv->per_channel) || (t0 == 0 && cnt == B));
    for (int h = 0; h < H; ++h) {
      for (int pass = 0; pass < 2; ++pass) {
        const float* src = (pass == 0 ? k : v) + (p - pos0) * kv_dim + static_cast<int64_t>(h) * d;
        for (int r = 0; r < cnt; ++r) {
          float* row = rows_.data() + static_cast<size_t>(r) * d;
          std::memcpy(row, src + r * kv_dim, static_cast<size_t>(d) * sizeof(float));
          if (pass == 0 && cfg_.layout.rotate) kv::hadamard_rotate(row, d);
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

void PagedKvStore::build_views(kv::SeqId s, int il, int64_t n_ctx) {
  const int B = cfg_.layout.block_size;
  const int d = cfg_.geometry.head_dim;
  const int H = cfg_.geometry.n_head_kv;
  const int64_t nb = (n_ctx + B - 1) / B;
  const kv::BlockTable& t = mgr_->table(s);
  views_.resize(static_cast<size_t>(nb));
  for (int64_t b = 0; b < nb; ++b) {
    const kv::BlockTableEntry& e = t[static_cast<size_t>(b)];
    const PoolFormat& f = format(e.pool);
    const uint8_t* layer = block_data(e) + static_cast<size_t>(il) * f.layer_bytes;
    attention::PagedBlockView& bv = views_[static_cast<size_t>(b)];
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
}

void PagedKvStore::attend(kv::SeqId s, int il, int64_t pos0, int64_t n, const float* q, int n_head,
                          float scale, float* out, ThreadPool& pool, int64_t window) {
  const int B = cfg_.layout.block_size;
  const int d = cfg_.geometry.head_dim;
  const int H = cfg_.geometry.n_head_kv;
  const int group = n_head / H;
  const int64_t n_ctx = pos0 + n;
  const int64_t q_stride = static_cast<int64_t>(n_head) * d;
  build_views(s, il, n_ctx);
  if (cfg_.layout.rotate) {
    // Scores against rotated keys need rotated queries: (Hq).(Hk) = q.k.
    q_rot_.assign(q, q + n * q_stride);
    for (int64_t r = 0; r < n * n_head; ++r) kv::hadamard_rotate(q_rot_.data() + r * d, d);
    q = q_rot_.data();
  }
  // Tasks: (query tile x KV heads x context part). A tile of up to kMaxTileQ queries reads each
  // block once for all its rows. Parts lie on a fixed grid of absolute block indices
  // (attention::kSplitGridTokens), so a query's partial sums and their merge order depend only on
  // its own position: the same bits whether it runs alone (decode), in a prefill chunk of any
  // size, or with speculative drafts. Parts also let one decode token fill every thread.
  const int tile_q =
      static_cast<int>(std::min<int64_t>({attention::kMaxTileQ, n, std::max(1, 128 / group)}));
  const int64_t n_tiles = (n + tile_q - 1) / tile_q;
  const int64_t grid = std::max<int64_t>(1, attention::kSplitGridTokens / B);  // blocks per part
  const int64_t nb_all = (n_ctx + B - 1) / B;
  const int splits = static_cast<int>((nb_all + grid - 1) / grid);
  const int hpt =
      tile_q * H * group > 256
          ? 1
          : attention::plan_paged_tasks(n_tiles * splits, H, 0, pool.size()).heads_per_task;
  const int head_tasks = H / hpt;
  const int64_t n_tasks = n_tiles * head_tasks * splits;
  const int rows = tile_q * hpt * group;
  const size_t part_floats = attention::paged_partial_floats(rows, d);
  partials_.resize(static_cast<size_t>(n_tasks) * part_floats);
  const size_t per_thread = attention::paged_attn_scratch_floats(rows, d, B);
  scratch_.resize(static_cast<size_t>(pool.size()) * per_thread);
  const auto partial = [&](int64_t task) {
    return attention::partial_at(partials_.data() + static_cast<size_t>(task) * part_floats, rows,
                                 d);
  };
  pool.parallel_for(n_tasks, [&](int64_t begin, int64_t end, int ith) {
    float* sc = scratch_.data() + static_cast<size_t>(ith) * per_thread;
    for (int64_t task = begin; task < end; ++task) {
      const int sp = static_cast<int>(task % splits);
      const int ht = static_cast<int>(task / splits % head_tasks);
      const int64_t tile = task / splits / head_tasks;
      attention::PagedAttnTile a;
      a.blocks = views_.data();
      a.block_size = B;
      a.q_pos0 = pos0 + tile * tile_q;
      a.n_q = static_cast<int>(std::min<int64_t>(tile_q, n - tile * tile_q));
      const int64_t nb = (a.q_pos0 + a.n_q + B - 1) / B;  // blocks the tile can see
      // With a window, blocks before the first query's window hold no key any query here sees.
      const int64_t nb_skip = window > 0 ? std::max<int64_t>(0, a.q_pos0 - window + 1) / B : 0;
      a.block_begin = std::min<int64_t>(nb, std::max<int64_t>(nb_skip, sp * grid));
      a.block_end = std::min<int64_t>(nb, (sp + 1) * grid);  // empty part: m = -inf, skipped
      a.kv_head = ht * hpt;
      a.n_kv = hpt;
      a.group = group;
      a.head_dim = d;
      a.scale = scale;
      a.window = window;
      a.q = q + (a.q_pos0 - pos0) * q_stride + static_cast<int64_t>(a.kv_head) * group * d;
      a.q_stride = q_stride;
      attention::attend_paged_tile(a, sc, partial(task));
    }
  });
  // Merge each (tile, KV heads)'s splits into out.
  pool.parallel_for(n_tiles * head_tasks, [&](int64_t begin, int64_t end, int) {
    std::vector<attention::PagedAttnPartial> parts(static_cast<size_t>(splits));
    for (int64_t th = begin; th < end; ++th) {
      const int64_t tile = th / head_tasks;
      const int ht = static_cast<int>(th % head_tasks);
      for (int sp = 0; sp < splits; ++sp) {
        parts[static_cast<size_t>(sp)] = partial(th * splits + sp);
      }
      const int n_q = static_cast<int>(std::min<int64_t>(tile_q, n - tile * tile_q));
      attention::merge_paged_partials(
          parts.data(), splits, n_q, hpt, group, d,
          out + tile * tile_q * q_stride + static_cast<int64_t>(ht * hpt) * group * d, q_stride);
    }
  });
}

void PagedKvStore::quantise_block(const kv::Migration& m, int rows) {
  const PoolFormat& src_f = format(kv::PoolKind::kFp16);
  const PoolFormat& dst_f = format(kv::PoolKind::kBody);
  const uint8_t* src = mgr_->pool(kv::PoolKind::kFp16).data(m.src.index);
  uint8_t* dst = mgr_->pool(kv::PoolKind::kBody).data(m.dst.index);
  const int d = cfg_.geometry.head_dim;
  const int H = cfg_.geometry.n_head_kv;
  const kv::KvRowGeom g16 = kv::kv_row_geom(planner::kKvF16, d);
  for (int il = 0; il < cfg_.geometry.n_layer; ++il) {
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
}

Status PagedKvStore::migrate_exits(kv::SeqId s, int64_t written) {
  if (!mgr_->has_sequence(s)) return {};
  const int64_t B = cfg_.layout.block_size;
  for (const kv::WindowExit& x : mgr_->blocks_leaving_window(s)) {
    if (x.drop) {  // sliding windows are not used by this cache (one global group)
      auto r = mgr_->drop(s, x.logical);
      if (!r) return Error{r.error()};
      continue;
    }
    const int64_t rows = std::clamp<int64_t>(written - x.logical * B, 0, B);
    if (!can_migrate_now(rows)) continue;  // partly written per-channel tile: after the pass
    auto m = mgr_->begin_migration(s, x.logical);
    if (!m) return Error{m.error()};
    if (m->needs_quantise && rows > 0) quantise_block(*m, static_cast<int>(rows));
    auto r = mgr_->migrate(s, x.logical, m->dst);
    if (!r) return Error{r.error()};
  }
  return {};
}

uint64_t PagedKvStore::held_bytes() const {
  uint64_t sum = 0;
  for (const kv::PoolKind p : {kv::PoolKind::kFp16, kv::PoolKind::kBody}) {
    const kv::BlockPool& pool = mgr_->pool(p);
    sum += static_cast<uint64_t>(pool.num_active()) * pool.block_bytes();
  }
  return sum;
}

Status PagedKvStore::check_integrity() const {
  return mgr_->check_integrity();
}

}  // namespace bie
