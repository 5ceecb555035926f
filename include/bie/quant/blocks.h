// GGUF/ggml block layouts, byte for byte: these structs are overlaid on mmapped file data.
// Half-precision fields are raw IEEE-754 binary16 bits (see fp16.h). Pure data.
#pragma once

#include <cstdint>

namespace bie::quant {

inline constexpr int kQK32 = 32;  // values per block of the legacy formats (Q4_0 .. Q8_1)
inline constexpr int kQKK = 256;  // values per super-block of the K-quants

using half_bits = uint16_t;

// 4.5 bits/weight. x = d * (q - 8), q in [0, 15]; qs[j] holds x[j] (low nibble), x[j+16] (high).
struct BlockQ4_0 {
  half_bits d;
  uint8_t qs[kQK32 / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

// 5 bits/weight. x = d * q + m, q in [0, 15]; same nibble order as Q4_0.
struct BlockQ4_1 {
  half_bits d;
  half_bits m;
  uint8_t qs[kQK32 / 2];
};
static_assert(sizeof(BlockQ4_1) == 20);

// 5.5 bits/weight. x = d * (q - 16), q in [0, 31]; bit 4 of x[j] is bit j of qh (little endian),
// of x[j+16] bit j+16.
struct BlockQ5_0 {
  half_bits d;
  uint8_t qh[4];
  uint8_t qs[kQK32 / 2];
};
static_assert(sizeof(BlockQ5_0) == 22);

// 6 bits/weight. x = d * q + m, q in [0, 31]; layout as Q5_0.
struct BlockQ5_1 {
  half_bits d;
  half_bits m;
  uint8_t qh[4];
  uint8_t qs[kQK32 / 2];
};
static_assert(sizeof(BlockQ5_1) == 24);

// 8.5 bits/weight. x = d * q.
struct BlockQ8_0 {
  half_bits d;
  int8_t qs[kQK32];
};
static_assert(sizeof(BlockQ8_0) == 34);

// 9 bits/weight; activation format for Q4_1/Q5_1. x = d * q; s = d * sum(q) (for the min term).
struct BlockQ8_1 {
  half_bits d;
  half_bits s;
  int8_t qs[kQK32];
};
static_assert(sizeof(BlockQ8_1) == 36);

// 2.625 bits/weight. 16 groups of 16: x = d * (scales[g] & 15) * q - dmin * (scales[g] >> 4),
// q in [0, 3]; value e is bits 2*((e%128)/32) of qs[32*(e/128) + e%32].
struct BlockQ2_K {
  uint8_t scales[kQKK / 16];
  uint8_t qs[kQKK / 4];
  half_bits d;
  half_bits dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

// 3.4375 bits/weight. 16 groups of 16: x = d * (s[g] - 32) * q, q in [-4, 3]; the low two bits of
// q + 4 are placed as in Q2_K, the third in hmask[e%32] bit e/32; s[g] 6-bit, packed in scales[12].
struct BlockQ3_K {
  uint8_t hmask[kQKK / 8];
  uint8_t qs[kQKK / 4];
  uint8_t scales[12];
  half_bits d;
};
static_assert(sizeof(BlockQ3_K) == 110);

// 4.5 bits/weight. 8 groups of 32: x = d * sc[g] * q - dmin * m[g], q in [0, 15], sc/m 6-bit
// packed in scales[12]; group g is the low (g even) or high nibble of qs[32*(g/2) ..].
struct BlockQ4_K {
  half_bits d;
  half_bits dmin;
  uint8_t scales[12];
  uint8_t qs[kQKK / 2];
};
static_assert(sizeof(BlockQ4_K) == 144);

// 5.5 bits/weight. As Q4_K with a fifth bit per value: qh[e%32] bit g.
struct BlockQ5_K {
  half_bits d;
  half_bits dmin;
  uint8_t scales[12];
  uint8_t qh[kQKK / 8];
  uint8_t qs[kQKK / 2];
};
static_assert(sizeof(BlockQ5_K) == 176);

// 6.5625 bits/weight. 16 groups of 16: x = d * scales[g] * (q - 32), q in [0, 63]; low nibbles in
// ql, high two bits in qh (see the dequantiser for the exact interleave).
struct BlockQ6_K {
  uint8_t ql[kQKK / 2];
  uint8_t qh[kQKK / 4];
  int8_t scales[kQKK / 16];
  half_bits d;
};
static_assert(sizeof(BlockQ6_K) == 210);

// 9.125 bits/weight; activation format of the K-quants. x = d * q (float d); bsums[g] is the sum
// of qs over group g of 16 (used for the K-quants' min terms).
struct BlockQ8_K {
  float d;
  int8_t qs[kQKK];
  int16_t bsums[kQKK / 16];
};
static_assert(sizeof(BlockQ8_K) == 292);

}  // namespace bie::quant
