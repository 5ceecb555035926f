// How one layer's K/V of one logical block lie in host memory, and the blocks of a sequence as
// the CPU backend's attention runner (and the attention-entropy probe) read them, from a KV pool
// in host-visible backend memory (KvPoolDesc).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "bie/backend/backend.h"
#include "bie/backend/kv_format.h"

namespace bie::kv {

// One logical block of one layer: where its tiles are and how to read them.
struct KvBlockView {
  const uint8_t* k = nullptr;  // K tile of KV head 0 of this layer; head h at k + h * k_tile_bytes
  const uint8_t* v = nullptr;  // V tile of KV head 0; head h at v + h * v_tile_bytes
  size_t k_tile_bytes = 0;
  size_t v_tile_bytes = 0;
  const KvFormatTraits* tk = nullptr;
  const KvFormatTraits* tv = nullptr;
  KvRowGeom gk;
  KvRowGeom gv;
  bool k_f16 = false;  // round the query to fp16 before dot (dense_attention's arithmetic)
};

// A sequence's blocks of one layer in host memory, logical order; a block a sliding window
// dropped is a view of a block no query reads. Empty: the K/V are not in
// host-visible memory (a device's pools, a contiguous cache).
struct HostKvBlocks {
  std::span<const KvBlockView> blocks;
  int block_size = 0;
  // K rows were stored Hadamard-rotated per head (kv::hadamard_rotate): queries must be too.
  bool rotate_keys = false;

  [[nodiscard]] bool empty() const { return blocks.empty(); }
};

// The view of every block of `pool` at head_dim: formats, tiles and their geometry; k and v unset.
[[nodiscard]] inline KvBlockView kv_pool_view(const KvPoolDesc& pool, int head_dim) {
  KvBlockView v;
  v.k_tile_bytes = pool.k_tile_bytes;
  v.v_tile_bytes = pool.v_tile_bytes;
  v.tk = kv_traits(planner::KvType(pool.k_type));
  v.tv = kv_traits(planner::KvType(pool.v_type));
  v.gk = KvRowGeom{head_dim, pool.k_group};
  v.gv = KvRowGeom{head_dim, pool.v_group};
  v.k_f16 = planner::KvType(pool.k_type) == planner::KvType::kF16;
  return v;
}

// Layer `layer` (of the pool's layer group) of block `block` of a host-visible pool: `tmpl`
// (kv_pool_view of the same pool) with its tiles set.
[[nodiscard]] inline KvBlockView kv_block_view(const KvBlockView& tmpl, const KvPoolDesc& pool,
                                               int32_t block, int layer, int n_head_kv) {
  const auto [part, b] = pool.locate(block);
  const Tensor& mem = pool.part(part);
  const size_t layer_bytes =
      static_cast<size_t>(n_head_kv) * (tmpl.k_tile_bytes + tmpl.v_tile_bytes);
  KvBlockView v = tmpl;
  v.k = static_cast<const uint8_t*>(mem.host()) + static_cast<size_t>(b) * mem.row_bytes +
        static_cast<size_t>(layer) * layer_bytes;
  v.v = v.k + static_cast<size_t>(n_head_kv) * tmpl.k_tile_bytes;
  return v;
}

// The views of a block table's blocks (refs into host-visible pools) at layer `layer` of their
// group, into out (resized); pool_views is scratch for the pools' kv_pool_view.
inline void kv_block_views(std::span<const KvPoolDesc> pools, std::span<const KvBlockRef> refs,
                           int layer, int n_head_kv, int head_dim,
                           std::vector<KvBlockView>& pool_views, std::vector<KvBlockView>& out) {
  pool_views.clear();
  for (const KvPoolDesc& p : pools) pool_views.push_back(kv_pool_view(p, head_dim));
  out.resize(refs.size());
  for (size_t b = 0; b < refs.size(); ++b) {
    const auto pool = static_cast<size_t>(refs[b].pool);
    out[b] = kv_block_view(pool_views[pool], pools[pool], refs[b].block, layer, n_head_kv);
  }
}

}  // namespace bie::kv
