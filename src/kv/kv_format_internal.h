// Shared between the scalar and AVX2 KV format kernels: byte-level accessors for the layouts of
// bie/kv/kv_format.h. Header-only, stateless.
#pragma once

#include <cstdint>
#include <cstring>

#include "bie/kv/kv_format.h"
#include "bie/quant/fp16.h"

namespace bie::kv::detail {

inline float load_fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return quant::fp16_to_fp32(h);
}

inline void store_fp16(uint8_t* p, uint16_t h) {
  std::memcpy(p, &h, sizeof h);
}

// Bytes of one row of a per-token format.
inline size_t row_bytes_f16(int d) {
  return 2 * static_cast<size_t>(d);
}
inline size_t row_bytes_scaled(int d) {
  return sizeof(KvScaleHeader) + static_cast<size_t>(d);
}
inline size_t group_bytes_int4(int g) {
  return 4 + static_cast<size_t>(g) / 2;
}
inline size_t row_bytes_int4(int d, int g) {
  return static_cast<size_t>(d / g) * group_bytes_int4(g);
}
// int4_channel: offset of row t inside a tile, and the tile size.
inline size_t chan_row_offset(int d, int t) {
  return 4 * static_cast<size_t>(d) + static_cast<size_t>(t) * static_cast<size_t>(d / 2);
}
inline size_t chan_tile_bytes(int d, int T) {
  return chan_row_offset(d, T);
}
// int8_channel: the same, with d code bytes per row.
inline size_t chan8_row_offset(int d, int t) {
  return 4 * static_cast<size_t>(d) + static_cast<size_t>(t) * static_cast<size_t>(d);
}
inline size_t chan8_tile_bytes(int d, int T) {
  return chan8_row_offset(d, T);
}

// The AVX2 table (defined in kv_format_avx2.cpp); nullptr for unsupported types.
const KvFormatTraits* kv_traits_avx2_table(planner::KvType type);

}  // namespace bie::kv::detail
