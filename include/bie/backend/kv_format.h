// KV storage formats: the byte layout of one KV head's rows in a paged block, and the kernels that
// write them (store), read them back for tests (load) and — the two attention calls — score a
// query against packed K rows (dot) and accumulate weighted packed V rows (axpy) without ever
// materialising a dequantised copy. One trait table per format (kv_traits*), no switches.
// Sizes agree byte for byte with planner::bytes_per_head_token (docs/kv-formats.md, tests).
// Tables are immutable after static init; every function is thread-safe and allocates nothing.
#pragma once

#include <cstddef>
#include <cstdint>

#include "bie/planner/kv_format.h"

namespace bie::kv {

// ---- layouts -------------------------------------------------------------------------------
// A *tile* is the storage of one KV head over a run of consecutive tokens (normally one paged
// block). For the per-token formats a tile is just rows back to back, row t at
// tile + t * kv_row_bytes(); for int4_channel it is the fixed structure below.
// All metadata scalars are IEEE fp16 (bie/quant/fp16.h). Every format stores what the planner
// counts and nothing more (static_asserts below, tests/test_kv_format.cpp).

// f16: head_dim x fp16.                                                      2*d bytes per row
// fp8_e4m3 and int8: one header, then head_dim bytes (e4m3 codes / int8).    d + 2 bytes per row
//   value = scale * decode(code); int8 is symmetric, codes in [-127, 127];
//   fp8 codes are OCP E4M3 (bias 7, no infinities, |x| <= 448, 0x7F/0xFF NaN never written).
struct KvScaleHeader {
  uint16_t scale;  // fp16
};
static_assert(sizeof(KvScaleHeader) == 2);

// int4_asym_gG: head_dim / G groups back to back, each { scale, zero, G/2 bytes of nibbles }.
//   value[i] = scale * n[i] + zero, n in [0, 15] (zero is the group minimum, an fp16 offset —
//   not an integer zero point). Nibble order inside a group ("split halves", as ggml q4_0):
//   byte j holds element j in its low nibble and element j + G/2 in its high nibble.
template <int G>
struct KvInt4Group {
  uint16_t scale;  // fp16
  uint16_t zero;   // fp16
  uint8_t qs[G / 2];
};
static_assert(sizeof(KvInt4Group<32>) == 20);  // 4.0 + 1.0 bits/value of metadata
static_assert(sizeof(KvInt4Group<64>) == 36);  // d=128: 2 groups = 72 B (DESIGN.md)
static_assert(sizeof(KvInt4Group<128>) == 68);

// int4_channel_tT (KIVI-style keys): a tile of exactly T tokens x d channels is
//   KvChannelParams params[d];      // per channel c: value = scale[c] * n + zero[c]
//   uint8_t rows[T][d / 2];         // row t: byte j = channel j (low nibble), j + d/2 (high)
// = 4*d + T*d/2 bytes = T * planner::bytes_per_head_token (the planner requires T | 4d).
struct KvChannelParams {
  uint16_t scale;  // fp16
  uint16_t zero;   // fp16
};
static_assert(sizeof(KvChannelParams) == 4);

// int8_channel_tT (8-bit KIVI keys): a tile of exactly T tokens x d channels is
//   KvChannelParams params[d];      // per channel c: value = scale[c] * n + zero[c], n in 0..255
//   uint8_t rows[T][d];             // row t: byte c = channel c
// = 4*d + T*d bytes = T * planner::bytes_per_head_token (the planner requires T | 4d).

// ---- geometry ------------------------------------------------------------------------------

// What the kernels need to walk a tile: head width and the format's group
// (int4_asym: values per group; int4_channel / int8_channel: tokens per tile; others: unused).
struct KvRowGeom {
  int head_dim = 0;
  int group = 0;
};

// Whether this module implements `f` (f16, fp8_e4m3, int8, int4_asym g32/64/128, int4_channel,
// int8_channel);
// q8_0 / q4_0 are the planner's llama.cpp comparison entries and have no kernels here.
[[nodiscard]] bool kv_format_supported(planner::KvFormat f);

// Bytes of a tile of n_tokens rows. Per-token formats: n_tokens * row bytes. Per-channel:
// n_tokens must be a multiple of T. Equals n_tokens * planner::bytes_per_head_token(f, d).
// note: call only if kv_format_supported(f) and planner::check_kv_format(f, head_dim).ok()
[[nodiscard]] size_t kv_tile_bytes(planner::KvFormat f, int head_dim, int n_tokens);

// ---- kernels -------------------------------------------------------------------------------
// `tile` points at the first row of the tile (per-token formats) or the tile's params
// (int4_channel, int8_channel); t0, n select rows [t0, t0 + n) of it.

// Quantises x[n, head_dim] (fp32) into rows [t0, t0 + n).
// Per-channel formats: only whole tiles (t0 == 0, n == T): their scales span the tile.
using KvStoreFn = void (*)(const KvRowGeom& g, const float* x, void* tile, int t0, int n);
// Dequantises rows [t0, t0 + n) into y[n, head_dim]. Reference for tests and tools only;
// attention must use dot/axpy.
using KvLoadFn = void (*)(const KvRowGeom& g, const void* tile, int t0, int n, float* y);
// scores[j] = dot(q[head_dim], row t0 + j) for j in [0, n).
using KvDotFn = void (*)(const KvRowGeom& g, const float* q, const void* tile, int t0, int n,
                         float* scores);
// acc[head_dim] += sum_j p[j] * row(t0 + j) for j in [0, n).
using KvAxpyFn = void (*)(const KvRowGeom& g, const float* p, const void* tile, int t0, int n,
                          float* acc);

struct KvFormatTraits {
  planner::KvType type;  // its name, sizes and per-channel flag: planner::kv_format_spec(type)
  KvStoreFn store;
  KvLoadFn load;
  KvDotFn dot;
  KvAxpyFn axpy;
};

// Scalar reference table; nullptr for q8_0 / q4_0.
[[nodiscard]] const KvFormatTraits* kv_traits_scalar(planner::KvType type);
// AVX2+FMA+F16C table; nullptr when the CPU lacks the ISA or the type is unsupported.
[[nodiscard]] const KvFormatTraits* kv_traits_avx2(planner::KvType type);
// Best table for this machine.
[[nodiscard]] const KvFormatTraits* kv_traits(planner::KvType type);

// Geometry for format f at head_dim.
[[nodiscard]] inline KvRowGeom kv_row_geom(planner::KvFormat f, int head_dim) {
  return KvRowGeom{head_dim, f.group};
}

// ---- FP8 E4M3 scalar codec (exposed for tests) ---------------------------------------------
// Round to nearest even; |x| beyond 448 saturates to +-448; NaN maps to 0.
[[nodiscard]] uint8_t fp32_to_e4m3(float x);
[[nodiscard]] float e4m3_to_fp32(uint8_t code);

}  // namespace bie::kv
