// Helpers shared by the AVX2 and AVX-512 paged-attention kernels (paged_attention_avx2.cpp,
// paged_attention_avx512.cpp): the parts whose arithmetic both must do the same way, so that the
// AVX-512 kernels give the AVX2 kernels' bits. Internal linkage: each including file (compiled
// with its own ISA flags) gets its own copy.
// note: include only from *_avx2.cpp / *_avx512.cpp files.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "bie/backend/kv_layout.h"
#include "bie/common/simd_avx2.h"

namespace bie::attention {
namespace {  // NOLINT(cert-dcl59-cpp): one copy per ISA-specific file, never shared across them

constexpr int kMaxHeadDim = 512;

// In-place 8x8 transpose of floats: afterwards v[j] lane i = the old v[i] lane j.
inline void transpose8_ps(__m256 v[8]) {
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
  }
  __m256 u[8];
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    v[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}
constexpr int kFuse = 4;  // tile rows per pass over a block

// Whether a block's K or V tiles take the fused kernels (else the generic per-row ones).
inline bool fused_ok(const kv::KvRowGeom& g, int rows) {
  return g.head_dim % 16 == 0 && g.head_dim <= kMaxHeadDim && rows <= 64;
}

// f(K-tag) for the count n, 1 <= n <= kMax, as a compile-time constant.
template <int kMax, class F>
inline void with_count(int n, F f) {
  if constexpr (kMax > 1) {
    if (n < kMax) return with_count<kMax - 1>(n, f);
  }
  f(std::integral_constant<int, kMax>{});
}

// body(r0, R-tag) for the tile rows [0, n_rows) in runs of R <= kMax (the rows a kernel fuses).
template <int kMax = kFuse, class Body>
inline void for_fused_rows(int n_rows, Body body) {
  for (int r0 = 0; r0 < n_rows; r0 += kMax) {
    with_count<kMax>(std::min(kMax, n_rows - r0), [&](auto rt) { body(r0, rt); });
  }
}

// Loops over the R fused rows must be unrolled so that their accumulators live in registers
// (GCC at -O2 keeps a[R] on the stack otherwise).
#define BIE_UNROLL _Pragma("GCC unroll 8")

inline float f16c(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return _cvtsh_ss(h);
}

// Interleaved (scale, zero) fp16 pairs of 8 channels -> 8 scales and 8 zeros.
inline void load8_params(const uint8_t* p, __m256* scale, __m256* zero) {
  const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
  const __m256 s = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
  const __m256 z = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
  *scale = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(s), _MM_SHUFFLE(3, 1, 2, 0)));
  *zero = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(z), _MM_SHUFFLE(3, 1, 2, 0)));
}

// 4 fp16 values at p, p + stride, p + 2 stride, p + 3 stride (the first J of them; the rest 0).
template <int J>
inline __m128 load4_f16_strided(const uint8_t* p, size_t stride) {
  // Inserted lane by lane: a vector load of halves just stored to the stack stalls on store
  // forwarding (it was a quarter of int4_score's time).
  __m128i h = _mm_setzero_si128();
  uint16_t x;
  std::memcpy(&x, p, 2);
  h = _mm_insert_epi16(h, x, 0);
  if constexpr (J > 1) {
    std::memcpy(&x, p + stride, 2);
    h = _mm_insert_epi16(h, x, 1);
  }
  if constexpr (J > 2) {
    std::memcpy(&x, p + 2 * stride, 2);
    h = _mm_insert_epi16(h, x, 2);
  }
  if constexpr (J > 3) {
    std::memcpy(&x, p + 3 * stride, 2);
    h = _mm_insert_epi16(h, x, 3);
  }
  return _mm_cvtph_ps(h);
}

// Per-channel tiles (int4_channel, int8_channel): folds the tile's per-channel scales into the
// queries (qs[r][c] = q[r][c] * scale[c]) and its zero points into one constant per query
// (zt[r] = sum_c q[r][c] * zero[c]), so a row's score is qs . codes + zt.
template <int R>
void fold_channel_params(int d, const uint8_t* tile, const float* const* q,
                         float (&qs)[R][kMaxHeadDim], float (&zt)[R]) {
  __m256 vz[R];
  BIE_UNROLL
  for (int r = 0; r < R; ++r) vz[r] = _mm256_setzero_ps();
  for (int c = 0; c < d; c += 8) {
    __m256 sc, zc;
    load8_params(tile + 4 * c, &sc, &zc);
    BIE_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m256 qc = _mm256_loadu_ps(q[r] + c);
      _mm256_store_ps(qs[r] + c, _mm256_mul_ps(qc, sc));
      vz[r] = _mm256_fmadd_ps(qc, zc, vz[r]);
    }
  }
  BIE_UNROLL
  for (int r = 0; r < R; ++r) zt[r] = simd::hsum(vz[r]);
}

// The int8-query method of the int4_channel scores (AVX2 and AVX-512 alike, the same bits; the
// scalar twin is detail::int4_channel_scores_i8q). A row's 32 code bytes at 32k .. 32k + 31 hold
// channels 32k.. (low nibbles) and half + 32k.. (high nibbles): block k, 64 channels. Per block,
// with u = 127 / (the block's largest |qs|) for the tile's folded queries qs (above), each channel
// gets two int8 digits, q1 = round(qs * u) and q2 = round((qs * u - q1) * 128) (|q2| <= 64), and
// sq[r][k] = (1 / u) / 128. A row's score starts at zt[r] and takes, block by block,
// fma(float(128 * sum q1 * code + sum q2 * code), sq[r][k], score). The integer sums are exact in
// any order (|128 * 64 * 15 * 127 + 64 * 15 * 64| < 2^24, so the float conversion is exact too),
// so the vector width does not matter; they take byte dot products (vpdpbusd, pmaddubsw) instead
// of a float FMA per channel. Per channel the query moves by at most (1 / u) / 256, the block's
// largest |qs| / 32512 (the error this adds: docs/kv-quality.md, "The int8-query method").
constexpr int kI8qBlockBytes = 32;  // code bytes per block: 64 channels
// True where the kernels use it: whole 32-byte runs of codes per row.
inline bool int8_query_ok(int d) {
  return d % 64 == 0 && d <= kMaxHeadDim;
}
// qi1 / qi2[r][c]: the digits of channel c (channel order); sq[r][k]: block k's scale.
template <int R>
inline void quantise_queries(int d, const float (&qs)[R][kMaxHeadDim],
                             int8_t (&qi1)[R][kMaxHeadDim], int8_t (&qi2)[R][kMaxHeadDim],
                             float (&sq)[R][kMaxHeadDim / 64]) {
  const int half = d / 2;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  // packs_epi32 / packs_epi16 interleave the 128-bit lanes: this puts the 8 dwords back in order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const auto store32 = [&](int8_t* dst, const __m256i(&x)[4]) {
    const __m256i w =
        _mm256_packs_epi16(_mm256_packs_epi32(x[0], x[1]), _mm256_packs_epi32(x[2], x[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm256_permutevar8x32_epi32(w, order));
  };
  BIE_UNROLL
  for (int r = 0; r < R; ++r) {
    for (int k = 0; k < half / kI8qBlockBytes; ++k) {
      const int c0[2] = {kI8qBlockBytes * k, half + kI8qBlockBytes * k};
      __m256 x[2][4];
      __m256 m = _mm256_setzero_ps();
      for (int h = 0; h < 2; ++h) {
        for (int i = 0; i < 4; ++i) {
          x[h][i] = _mm256_load_ps(qs[r] + c0[h] + 8 * i);
          m = _mm256_max_ps(m, _mm256_and_ps(x[h][i], abs_mask));
        }
      }
      const float amax = simd::hmax(m);
      sq[r][k] = amax / 127.0f * 0.0078125f;
      const __m256 u = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
      const __m256 base = _mm256_set1_ps(128.0f);
      for (int h = 0; h < 2; ++h) {
        __m256i d1[4], d2[4];
        for (int i = 0; i < 4; ++i) {
          const __m256 t = _mm256_mul_ps(x[h][i], u);
          const __m256 t1 = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
          d1[i] = _mm256_cvtps_epi32(t1);
          // t - t1 is exact (|t| <= 127), and so is its product by 128.
          d2[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(t, t1), base));
        }
        store32(qi1[r] + c0[h], d1);
        store32(qi2[r] + c0[h], d2);
      }
    }
  }
}

// A tile's queries for the int8-query scores: folded (fold_channel_params), then in digits.
template <int R>
struct I8qQueries {
  alignas(32) int8_t q1[R][kMaxHeadDim];
  alignas(32) int8_t q2[R][kMaxHeadDim];
  float sq[R][kMaxHeadDim / 64];
  float zt[R];
  I8qQueries(int d, const uint8_t* tile, const float* const* q) {
    alignas(32) float qs[R][kMaxHeadDim];
    fold_channel_params<R>(d, tile, q, qs, zt);
    quantise_queries<R>(d, qs, q1, q2, sq);
  }
};

// int4_asym V sums its rows in pairs, the odd row of each pair first: acc += w_{2i+1} n_{2i+1},
// then acc += w_{2i} n_{2i}, each add rounded once. That is what one AVX512_BF16 pair dot product
// (vdpbf16ps) does with bf16 weights and codes, exactly: a bf16 weight times a 4-bit code is exact
// in fp32, so an FMA per row in this order gives the same bits. Every x86 kernel of the format
// sums in this order, so a token's bits do not depend on whether the machine has AVX512_BF16.
// Row `j`'s place in that order: pairs swapped, a last unpaired row in place.
inline int int4_pair_order(int j, int rows) {
  return (j ^ 1) < rows ? j ^ 1 : j;
}

// A weight as vdpbf16ps reads it: fp32 rounded to bf16 (nearest, ties to even), below the
// smallest normal float flushed to zero (the instruction treats denormal inputs as zero). The
// weights are >= 0 and finite.
inline float bf16_weight(float x) {
  if (!(x >= 0x1p-126f)) return 0.0f;
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&x, &u, 4);
  return x;
}
inline __m256 bf16_weights8(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r =
      _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), odd),
                       _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)));
  const __m256 normal = _mm256_cmp_ps(x, _mm256_set1_ps(0x1p-126f), _CMP_GE_OQ);
  return _mm256_and_ps(_mm256_castsi256_ps(r), normal);
}

// int4_asym V, group b of a tile's `rows` rows: w[r][j] = p[r][j] * scale_j, rounded to bf16
// (bf16_weight) if kRound (else the caller rounds them so), and acc[r]'s G channels of the group
// get sum_j p[r][j] * zero_j added in fp32 (8 rows per vector step, the tail padded with zeros
// so that row j always lands in lane j % 8: batch invariance).
template <int R, bool kRound = true>
inline void int4_group_weights(const uint8_t* tile, int rows, size_t rb, size_t gb, int b, int G,
                               const float* p, int ps, float* const* acc, float (&w)[R][64]) {
  __m256 zacc[R];
  BIE_UNROLL
  for (int r = 0; r < R; ++r) zacc[r] = _mm256_setzero_ps();
  int j = 0;
  for (; j + 8 <= rows; j += 8) {
    // 8 x (scale | zero << 16) -> 8 scales, 8 zeros.
    const uint8_t* g0 = tile + j * rb + b * gb;
    const auto ld = [&](int i) {
      int32_t v;
      std::memcpy(&v, g0 + i * rb, 4);
      return v;
    };
    const __m256i g = _mm256_setr_epi32(ld(0), ld(1), ld(2), ld(3), ld(4), ld(5), ld(6), ld(7));
    const __m256i sz =
        _mm256_permute4x64_epi64(_mm256_packus_epi32(_mm256_and_si256(g, _mm256_set1_epi32(0xFFFF)),
                                                     _mm256_srli_epi32(g, 16)),
                                 _MM_SHUFFLE(3, 1, 2, 0));
    const __m256 sc = _mm256_cvtph_ps(_mm256_castsi256_si128(sz));
    const __m256 zz = _mm256_cvtph_ps(_mm256_extracti128_si256(sz, 1));
    BIE_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m256 pv = _mm256_loadu_ps(p + r * ps + j);
      const __m256 wv = _mm256_mul_ps(pv, sc);
      _mm256_storeu_ps(w[r] + j, kRound ? bf16_weights8(wv) : wv);
      zacc[r] = _mm256_fmadd_ps(pv, zz, zacc[r]);
    }
  }
  if (j < rows) {
    // The tail as one more 8-row step with zeros past `rows`: every row j lands in lane j % 8
    // whatever `rows` is, so a query's sum does not depend on how many keys its tile sees
    // (batch invariance; masked rows add exact zeros).
    alignas(32) float pt[R][8] = {};
    alignas(32) float zt[8] = {};
    for (int jj = j; jj < rows; ++jj) {
      const uint8_t* grp = tile + jj * rb + b * gb;
      const float sc = f16c(grp);
      zt[jj - j] = f16c(grp + 2);
      BIE_UNROLL
      for (int r = 0; r < R; ++r) {
        w[r][jj] = kRound ? bf16_weight(p[r * ps + jj] * sc) : p[r * ps + jj] * sc;
        pt[r][jj - j] = p[r * ps + jj];
      }
    }
    const __m256 zz = _mm256_load_ps(zt);
    BIE_UNROLL
    for (int r = 0; r < R; ++r) zacc[r] = _mm256_fmadd_ps(_mm256_load_ps(pt[r]), zz, zacc[r]);
  }
  float zsum[R];
  BIE_UNROLL
  for (int r = 0; r < R; ++r) zsum[r] = simd::hsum(zacc[r]);
  BIE_UNROLL
  for (int r = 0; r < R; ++r) {
    const __m256 z = _mm256_set1_ps(zsum[r]);
    float* a = acc[r] + b * G;
    for (int c = 0; c < G; c += 8)
      _mm256_storeu_ps(a + c, _mm256_add_ps(_mm256_loadu_ps(a + c), z));
  }
}

// int8 / fp8 V: w[r][j] = p[r][j] times row j's scale (fp8: the 256 of its codes folded in).
template <int R>
inline void scaled_weights(const uint8_t* tile, int rows, size_t rb, float unit, const float* p,
                           int ps, float (&w)[R][64]) {
  for (int j = 0; j < rows; ++j) {
    const float sc = f16c(tile + j * rb) * unit;
    BIE_UNROLL
    for (int r = 0; r < R; ++r) w[r][j] = p[r * ps + j] * sc;
  }
}

}  // namespace
}  // namespace bie::attention
