// How one layer's K/V of one logical block lie in host memory, and the blocks of a sequence as
// the attention runner (attention/) reads them. kv/ describes where the bytes are; it never runs
// attention over them (docs/architecture.md, "The dependency rule").
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

#include "bie/kv/kv_format.h"

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
// dropped is a view with null tiles (no query reads it). Empty: the cache does not hold its K/V
// as host blocks (a device store, a contiguous cache) and runs attention itself.
struct HostKvBlocks {
  std::span<const KvBlockView> blocks;
  int block_size = 0;
  // K rows were stored Hadamard-rotated per head (kv::hadamard_rotate): queries must be too.
  bool rotate_keys = false;

  [[nodiscard]] bool empty() const { return blocks.empty(); }
};

}  // namespace bie::kv
