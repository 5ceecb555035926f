// Internal to src/quant and src/backend/cpu/matmul*: the per-ISA trait tables and the
// "unified K" form that every K-quant block unpacks to (used by the scalar dot and by the
// matmul tiles). Stateless; thread-safe.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "bie/quant/blocks.h"
#include "bie/quant/traits.h"

namespace bie::quant {

// Table indexed by type id, kGgmlTypeIdLimit entries; entries with to_float == nullptr are
// unsupported.
const TypeTraits* scalar_table();
const TypeTraits* avx2_table();  // defined only when the AVX2 file is built

// A K-quant super-block rewritten so that every format has the same shape:
//   x[e] = d * sc[g] * qu[e] - dmin * m[g],  g = e / 16,  qu[e] in [0, 63].
// Q3_K and Q6_K are symmetric (q - 4, q - 32): their offset becomes m = 4*sc or 32*sc with
// dmin = d, and `sym` is set so callers can subtract the two integer sums before scaling.
struct KUnified {
  uint8_t qu[kQKK];
  int16_t sc[kQKK / 16];
  int16_t m[kQKK / 16];
  float d;
  float dmin;
  bool sym;
  uint8_t zero;  // symmetric formats: x = d * sc * (qu - zero); 0 otherwise
};

void unify_q2_k(const BlockQ2_K& b, KUnified& u);
void unify_q3_k(const BlockQ3_K& b, KUnified& u);
void unify_q4_k(const BlockQ4_K& b, KUnified& u);
void unify_q5_k(const BlockQ5_K& b, KUnified& u);
void unify_q6_k(const BlockQ6_K& b, KUnified& u);

// 6-bit scale j and min j (j < 8) of Q4_K/Q5_K's packed scales[12].
inline void k4_scale_min(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q3_K's 16 six-bit scales, already minus 32.
inline void q3k_scales(const uint8_t* packed, int8_t out[16]) {
  for (int i = 0; i < 16; ++i) {
    const int low = i < 8 ? (packed[i] & 0xF) : (packed[i - 8] >> 4);
    const int high = (packed[8 + (i % 4)] >> (2 * (i / 4))) & 3;
    out[i] = static_cast<int8_t>((low | (high << 4)) - 32);
  }
}

// Round to nearest, ties to even, for |x| < 2^22 (ggml's nearest_int; matches cvtps2dq).
inline int nearest_int(float x) {
  const float v = x + 12582912.f;
  int32_t i;
  std::memcpy(&i, &v, sizeof(i));
  return (i & 0x007FFFFF) - 0x00400000;
}

}  // namespace bie::quant
