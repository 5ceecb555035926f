#include "bie/kv/paged_kv_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>

#include "bie/planner/kv_bytes.h"
#include "bie/planner/kv_layout_flags.h"
#include "bie/planner/model_geometry.h"

namespace bie {

namespace {

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
  if (Status s = planner::check_kv_layout(kv::planner_geometry(cfg.geometry), l); !s) return s;
  const int d = cfg.geometry.head_dim;
  if (l.rotate && (d & (d - 1)) != 0) {
    return Error{
        fmt::format("--kv-rotate needs a power-of-two head_dim, got {}; use --no-kv-rotate", d)};
  }
  std::vector<planner::KvFormat> formats;
  for (int il = 0; il < cfg.geometry.n_layer; ++il) {
    const planner::KvLayerFormats b = l.body(static_cast<size_t>(il));
    for (const planner::KvFormat f : {b.k, b.v}) {
      if (std::find(formats.begin(), formats.end(), f) == formats.end()) formats.push_back(f);
    }
  }
  for (const planner::KvFormat f : formats) {
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
  const planner::KvPoolPlan plan = planner::kv_pool_plan(kv::planner_geometry(geometry), layout,
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
  std::unique_ptr<PagedKvStore> c(new PagedKvStore(cfg));
  if (cfg.backend == nullptr) {
    auto own = create_backend(BackendConfig{});
    if (!own) return Error{own.error()};
    c->own_backend_ = std::move(own).value();
  }
  c->backend_ = cfg.backend != nullptr ? cfg.backend : c->own_backend_.get();
  auto coord = kv::KvCoordinator::create(cfg);
  if (!coord) return Error{coord.error()};
  c->coord_ = std::move(coord).value();
  c->set_formats();
  const kv::KvCoordinator& co = *c->coord_;
  for (int g = 0; g < co.n_groups(); ++g) {
    for (int p = 0; p < kv::kPoolKinds; ++p) {
      const PoolFormat& f = c->format(g, kv::PoolKind(p));
      const uint64_t want = static_cast<uint64_t>(co.group_layers(g)) * f.layer_bytes;
      const kv::BlockPool& pool = co.manager(g).pool(kv::PoolKind(p));
      if (pool.n_blocks() > 0 && pool.block_bytes() != want) {
        return Error{fmt::format("paged KV cache: planner block bytes {} != layout bytes {}",
                                 pool.block_bytes(), want)};
      }
    }
  }
  if (Status st = c->alloc_pools(); !st) return Error{st.error()};
  return c;
}

Status PagedKvStore::alloc_pools() {
  Backend& be = *backend_;
  const planner::KvLayout& l = cfg_.layout;
  for (const auto& group : fmt_) {
    for (const PoolFormat& f : group) {
      if (be.supports_paged_kv() &&
          be.supports_kv_types(static_cast<uint8_t>(f.k.type), static_cast<uint8_t>(f.v.type))) {
        continue;
      }
      return Error{fmt::format(
          "KV regime {} does not run on the {} backend yet (a device holds f16, fp8_e4m3, int8, "
          "int4_asym_gN and the per-channel formats: --kv-cache-dtype int4_asym, int8, "
          "int4_asym_g64, fp8_e4m3 or f16; or --device cpu)",
          planner::kv_layout_label(l), be.name())};
    }
  }
  pools_.resize(static_cast<size_t>(coord_->n_groups()));
  for (size_t g = 0; g < pools_.size(); ++g) {
    for (int p = 0; p < kv::kPoolKinds; ++p) {
      kv::BlockPool& pool = coord_->manager(static_cast<int>(g)).pool(kv::PoolKind(p));
      const PoolFormat& f = format(static_cast<int>(g), kv::PoolKind(p));
      KvPoolDesc& d = pools_[g][static_cast<size_t>(p)];
      d.k_type = static_cast<uint8_t>(f.k.type);
      d.v_type = static_cast<uint8_t>(f.v.type);
      d.k_group = f.k.group;
      d.v_group = f.v.group;
      d.k_tile_bytes = f.k_tile;
      d.v_tile_bytes = f.v_tile;
      // In a mixed layout a body block is quantised from FP16-rounded rows, as if it had passed
      // through the FP16 window: its bytes do not depend on the path (written straight into the
      // body, migrated from the window, or quantised from an FP16 prefix-cache hit).
      d.round_rows_to_fp16 = l.mixed() && kv::PoolKind(p) == kv::PoolKind::kBody;
      if (pool.n_blocks() == 0) continue;
      if (be.reserves_on_demand()) {
        // Address space for every block, committed block by block by the block pool as it fills
        // (the budget counts committed pages; blocks lie stride() apart).
        auto buf = be.reserve(pool.reserved_bytes());
        if (!buf) {
          return Error{fmt::format("KV block pool of {} blocks: {}", pool.n_blocks(), buf.error())};
        }
        if (Status st = pool.attach_memory(**buf); !st) return st;
        d.memory = Tensor{buf->get(),
                          0,
                          quant::GgmlType::I8,
                          pool.n_blocks(),
                          static_cast<int64_t>(pool.stride()),
                          pool.stride()};
        pool_buffers_.push_back(std::move(buf).value());
        continue;
      }
      const size_t bytes = static_cast<size_t>(pool.n_blocks()) * pool.block_bytes();
      // A pool larger than one binding is allocated in parts of whole blocks (KvPoolDesc).
      const uint64_t part_bytes = be.kv_pool_part_bytes();
      const auto part_blocks = static_cast<int64_t>(
          std::min<uint64_t>(part_bytes / pool.block_bytes(), static_cast<uint64_t>(INT32_MAX)));
      const int64_t n_parts =
          part_blocks > 0 ? (pool.n_blocks() + part_blocks - 1) / part_blocks : kMaxKvPoolParts + 1;
      if (n_parts > kMaxKvPoolParts) {
        return Error{fmt::format(
            "a KV pool of {} blocks ({} MiB) is larger than the {} device binds in {} parts "
            "({} MiB); lower --max-model-len or --kv-cache-memory",
            pool.n_blocks(), bytes >> 20, be.name(), kMaxKvPoolParts,
            be.max_kv_pool_bytes() >> 20)};
      }
      d.part_blocks = n_parts > 1 ? static_cast<int32_t>(part_blocks) : 0;
      for (int64_t i = 0; i < n_parts; ++i) {
        const int64_t rows = n_parts > 1 ? std::min(part_blocks, pool.n_blocks() - i * part_blocks)
                                         : pool.n_blocks();
        auto buf = be.alloc(static_cast<size_t>(rows) * pool.block_bytes());
        if (!buf) {
          return Error{fmt::format("KV pool of {} blocks ({} bytes) on the {} device: {}",
                                   pool.n_blocks(), bytes, be.name(), buf.error())};
        }
        const Tensor t{buf->get(),
                       0,
                       quant::GgmlType::I8,
                       rows,
                       static_cast<int64_t>(pool.block_bytes()),
                       pool.block_bytes()};
        if (i == 0) {
          d.memory = t;
        } else {
          d.more_parts[static_cast<size_t>(i - 1)] = t;
        }
        pool_buffers_.push_back(std::move(buf).value());
      }
    }
  }
  return {};
}

KvBlockRef PagedKvStore::block_ref(const kv::BlockTableEntry& e) {
  // Pool blocks are numbered from 1 (0 is the null block, which has no storage); a null entry
  // (a block a sliding window dropped) names block 0, which attention never reads.
  return KvBlockRef{static_cast<int32_t>(e.pool),
                    e.block.index == kv::kNullBlock ? 0 : static_cast<int32_t>(e.block.index) - 1};
}

Result<Tensor> PagedKvStore::staging(int slot, int64_t rows, int64_t cols) {
  const size_t bytes = static_cast<size_t>(rows) * static_cast<size_t>(cols) * sizeof(float);
  std::unique_ptr<DeviceBuffer>& b = staging_[static_cast<size_t>(slot)];
  if (b == nullptr || b->size() < bytes) {
    auto nb = backend_->alloc(std::max<size_t>(bytes, 4096));
    if (!nb) return Error{nb.error()};
    b = std::move(nb).value();
  }
  return tensor_of(*b, quant::GgmlType::F32, rows, cols);
}

PagedKvStore::~PagedKvStore() = default;

PagedKvStore::PagedKvStore(const PagedKvStoreConfig& cfg) : cfg_(cfg) {}

void PagedKvStore::set_formats() {
  const int d = cfg_.geometry.head_dim;
  const int B = cfg_.layout.block_size;
  fmt_.resize(static_cast<size_t>(coord_->n_groups()));
  for (int g = 0; g < coord_->n_groups(); ++g) {
    const planner::KvLayerFormats body = coord_->group_body(g);
    const std::array<planner::KvFormat, kv::kPoolKinds> ks = {planner::kKvF16, body.k};
    const std::array<planner::KvFormat, kv::kPoolKinds> vs = {planner::kKvF16, body.v};
    for (int p = 0; p < kv::kPoolKinds; ++p) {
      PoolFormat& f = fmt_[static_cast<size_t>(g)][static_cast<size_t>(p)];
      f.k = ks[p];
      f.v = vs[p];
      f.k_tile = kv::kv_tile_bytes(f.k, d, B);
      f.v_tile = kv::kv_tile_bytes(f.v, d, B);
      f.layer_bytes = static_cast<size_t>(cfg_.geometry.n_head_kv) * (f.k_tile + f.v_tile);
    }
  }
}

Result<int64_t> PagedKvStore::append_tokens(kv::SeqId s, int64_t written,
                                            std::span<const int32_t> tokens, bool migrate) {
  kv::KvWork work;
  auto r = coord_->append(s, written, tokens, migrate, work);
  if (Status st = execute(work); !st) return Error{st.error()};  // what was decided, done
  return r;
}

Status PagedKvStore::finish_pass(kv::SeqId s, int64_t written) {
  kv::KvWork work;
  const Status decided = coord_->finish_pass(s, written, work);
  if (Status st = execute(work); !st) return st;
  return decided;
}

Status PagedKvStore::execute(const kv::KvWork& work) {
  Status st;
  for (const kv::KvWorkItem& w : work) {
    st = w.kind == kv::KvWorkItem::Kind::kCopy ? copy_block(w.group, w.copy)
                                               : quantise_block(w.group, w.src, w.dst, w.rows);
    if (!st) break;
  }
  coord_->unpin_all();  // the sources have been read
  return st;
}

Status PagedKvStore::copy_block(int g, const kv::KvCopy& c) {
  // Copy-on-write of a shared last block.
  const KvBlockCopy job{block_ref({c.pool, c.src}), block_ref({c.pool, c.dst})};
  return backend_->copy_blocks(pools_[static_cast<size_t>(g)], {&job, 1});
}

Status PagedKvStore::quantise_block(int g, kv::BlockRef src_block, kv::BlockRef dst_block,
                                    int rows) {
  const KvBlockQuantise job{block_ref({kv::PoolKind::kFp16, src_block}),
                            block_ref({kv::PoolKind::kBody, dst_block}), rows};
  return backend_->quantise_blocks(pools_[static_cast<size_t>(g)], {&job, 1},
                                   coord_->group_layers(g), cfg_.geometry.n_head_kv,
                                   cfg_.geometry.head_dim, cfg_.layout.block_size);
}

Status PagedKvStore::write(kv::SeqId s, int il, int64_t pos0, const Tensor& k, const Tensor& v,
                           Backend& backend) {
  if (&backend != backend_) backend.synchronize();
  const int group = coord_->layer_group(il);
  const kv::BlockTable& t = coord_->manager(group).table(s);
  const int B = cfg_.layout.block_size;
  slots_buf_.clear();
  for (int64_t p = pos0; p < pos0 + k.rows; ++p) {
    const kv::BlockTableEntry& e = t[static_cast<size_t>(p / B)];
    assert(e.block.index != kv::kNullBlock);
    slots_buf_.push_back({block_ref(e), static_cast<int32_t>(p % B)});
  }
  KvWriteMetadata m;
  m.k = k;
  m.v = v;
  m.layer_in_group = coord_->layer_index(il);
  m.n_head_kv = cfg_.geometry.n_head_kv;
  m.head_dim = cfg_.geometry.head_dim;
  m.block_size = B;
  m.rotate_keys = cfg_.layout.rotate;
  m.pools = pools_[static_cast<size_t>(group)];
  m.slots = slots_buf_;
  return backend_->kv_write(m);
}

kv::PagedKvLayer PagedKvStore::paged_layer(kv::SeqId s, int il, int64_t n_ctx) {
  const int group = coord_->layer_group(il);
  const kv::BlockTable& t = coord_->manager(group).table(s);
  const int B = cfg_.layout.block_size;
  const int64_t nb = (n_ctx + B - 1) / B;
  table_buf_.clear();
  int32_t pool_id = -1;
  for (int64_t b = 0; b < nb; ++b) {
    table_buf_.push_back(block_ref(t[static_cast<size_t>(b)]));
    if (t[static_cast<size_t>(b)].block.index != kv::kNullBlock) pool_id = table_buf_.back().pool;
  }
  // Dropped blocks (never read) name a pool that holds blocks; the others keep their own (a mixed
  // layout's table spans the FP16 and the body pool).
  for (int64_t b = 0; b < nb; ++b) {
    if (t[static_cast<size_t>(b)].block.index == kv::kNullBlock && pool_id >= 0) {
      table_buf_[static_cast<size_t>(b)].pool = pool_id;
    }
  }
  kv::PagedKvLayer l;
  l.backend = backend_;
  l.pools = pools_[static_cast<size_t>(group)];
  l.blocks = table_buf_;
  l.layer_in_group = coord_->layer_index(il);
  l.n_layers_in_group = coord_->group_layers(group);
  l.n_head_kv = cfg_.geometry.n_head_kv;
  l.head_dim = cfg_.geometry.head_dim;
  l.block_size = B;
  l.rotate_keys = cfg_.layout.rotate;
  return l;
}

void PagedKvStore::store(kv::SeqId s, int il, int64_t pos0, int64_t n, const float* k,
                         const float* v) {
  assert(pos0 >= 0 && pos0 + n <= coord_->manager(coord_->layer_group(il)).num_tokens(s));
  const int64_t kv_dim = cfg_.geometry.kv_dim();
  auto kt = staging(0, n, kv_dim);
  auto vt = staging(1, n, kv_dim);
  Status st = !kt ? Status{Error{kt.error()}} : !vt ? Status{Error{vt.error()}} : Status{};
  if (st) {
    backend_->upload(*kt, k);
    backend_->upload(*vt, v);
    st = write(s, il, pos0, *kt, *vt, *backend_);
  }
  if (st) st = backend_->status();
  if (!st && error_.empty()) error_ = st.error();
}

kv::HostKvBlocks PagedKvStore::host_blocks(kv::SeqId s, int il, int64_t n_ctx) {
  const kv::PagedKvLayer l = paged_layer(s, il, n_ctx);
  for (const KvPoolDesc& d : l.pools) {
    if (!d.memory.empty() && d.memory.host() == nullptr) return {};  // device memory
  }
  kv::kv_block_views(l.pools, l.blocks, l.layer_in_group, l.n_head_kv, l.head_dim, pool_views_,
                     views_);
  return kv::HostKvBlocks{views_, l.block_size, l.rotate_keys};
}

Status PagedKvStore::check_integrity() const {
  if (!error_.empty()) return Error{"paged KV cache: " + error_};
  return coord_->check_integrity();
}

}  // namespace bie
