// Shared between the scalar and AVX2 KV format kernels: byte-level accessors for the layouts of
// bie/backend/kv_format.h. Header-only, stateless.
#pragma once

#include <cstdint>
#include <cstring>

#include "bie/backend/kv_format.h"
#include "bie/backend/kv_layout.h"
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

// Row and tile layouts: the public bie/backend/kv_layout.h (the attention kernels read them too).
using kv::chan_row_offset;
using kv::chan_tile_bytes;
using kv::group_bytes_int4;
using kv::row_bytes_f16;
using kv::row_bytes_int4;
using kv::row_bytes_scaled;
using kv::chan8_row_offset;
using kv::chan8_tile_bytes;

// The AVX2 table (defined in kv_format_avx2.cpp); nullptr for unsupported types.
const KvFormatTraits* kv_traits_avx2_table(planner::KvType type);

}  // namespace bie::kv::detail
