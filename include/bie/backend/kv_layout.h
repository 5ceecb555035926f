// Byte layout of the KV storage formats' rows and tiles (bie/backend/kv_format.h describes them):
// the part of the format table that readers outside kv/ (the attention kernels) need to walk a
// tile. Header-only, stateless.
#pragma once

#include <cstddef>

#include "bie/backend/kv_format.h"

namespace bie::kv {

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

}  // namespace bie::kv
