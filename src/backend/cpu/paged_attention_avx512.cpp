// AVX-512 kernels of the fused paged attention, with the AVX2 kernels' arithmetic
// (paged_attention_avx2.cpp) on twice the lanes, so that their outputs equal the AVX2 kernels' bit
// for bit and a token's bits do not depend on which of the two the machine runs:
//  - scores: two K rows per 512-bit vector, each row's 8-lane accumulator in its own half (the same
//    FMAs in the same order), the four row sums of two vectors taken in hsum's order;
//  - values: 16 channels per vector, each channel's sum over the rows in row order, the weights and
//    zero-point sums computed by the shared helpers (paged_attention_x86_inl.h).
// Covered: K f16, int8, fp8_e4m3, int4_channel, int8_channel; V f16, int8, fp8_e4m3, int4_asym.
// Other formats (int4_asym K, int4_channel V) and the softmax step run the AVX2 kernels.
// note: everything here runs only after has_avx512().
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*, which -Wmaybe-uninitialized reports
// once they are inlined into a kernel.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstring>
#include <type_traits>

#include "backend/cpu/paged_attention.h"
#include "backend/cpu/paged_attention_x86_inl.h"
#include "bie/backend/kv_layout.h"

namespace bie::attention {

namespace {

using planner::KvType;

const detail::TileKernels& avx2() {
  static const detail::TileKernels k = detail::avx2_kernels();
  return k;
}

// Query rows one pass over a tile fuses: a GQA group of up to 8 heads (Qwen2.5's 6 or 7) decodes
// each K/V tile once instead of once per 4 heads. Each row's arithmetic does not depend on the
// rows beside it, so the bits are those of any other grouping (the AVX2 kernels fuse 4).
constexpr int kFuse512 = 8;
// Vector registers the fused loops may hold live (of 32): the rest is left to the compiler.
constexpr int kLiveZmm = 30;
// K row pairs per score pass for R query rows and N decoded vectors per pair: R * P accumulators
// plus P * N decoded vectors and one query broadcast fit in kLiveZmm.
constexpr int score_pairs(int R, int N) {
  int p = 4;
  while (p > 1 && R * p + p * N + 1 > kLiveZmm) --p;
  return p;
}
// 16-channel vectors per value pass for R rows: R * N accumulators, N decoded, one weight.
constexpr int accum_vectors(int R) {
  int n = 4;
  while (n > 1 && R * n + n + 1 > kLiveZmm) --n;
  return n;
}

// ---- decoding two rows' 8 values into one vector: [row a | row b] ---------------------------

inline __m128i load2x8(const uint8_t* a, const uint8_t* b) {
  return _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)),
                            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b)));
}
inline __m512 load2x8_f16(const uint8_t* a, const uint8_t* b) {
  const __m128i ha = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
  const __m128i hb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(ha), hb, 1));
}
inline __m512 load2x8_i8(const uint8_t* a, const uint8_t* b) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load2x8(a, b)));
}
inline __m512 load2x8_u8(const uint8_t* a, const uint8_t* b) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(load2x8(a, b)));
}
// 16 e4m3 codes -> values / 256 (the AVX2 kernels' identity: sign and the 7 low bits moved into
// an fp16's sign, exponent and mantissa).
inline __m512 e4m3_div256(__m128i codes) {
  const __m256i c = _mm256_cvtepu8_epi16(codes);
  const __m256i h =
      _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(c, _mm256_set1_epi16(0x80)), 8),
                      _mm256_slli_epi16(_mm256_and_si256(c, _mm256_set1_epi16(0x7F)), 7));
  return _mm512_cvtph_ps(h);
}
// 16 bytes of nibbles -> low nibbles (lo) and high nibbles (hi), 16 fp32 each.
inline void nibbles16(__m128i bytes, __m512* lo, __m512* hi) {
  const __m512i x = _mm512_cvtepu8_epi32(bytes);
  *lo = _mm512_cvtepi32_ps(_mm512_and_si512(x, _mm512_set1_epi32(0x0F)));
  *hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(x, 4));
}

// ---- scores: s[r * ss + j] = q[r] . K row j ---------------------------------------------------

// The sums of four 8-lane accumulators held two per vector (z0 = [a | b], z1 = [c | e]), each in
// hsum's order ((x0 + x4) + (x2 + x6)) + ((x1 + x5) + (x3 + x7)), as [a, b, c, e].
inline __m128 hsum4_pairs(__m512 z0, __m512 z1) {
  // Per 128-bit chunk (x_i + x_{i+4}), i < 4: [a, a, b, b] and [c, c, e, e].
  const __m512 t0 = _mm512_add_ps(z0, _mm512_shuffle_f32x4(z0, z0, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512 t1 = _mm512_add_ps(z1, _mm512_shuffle_f32x4(z1, z1, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512 w = _mm512_shuffle_f32x4(t0, t1, _MM_SHUFFLE(2, 0, 2, 0));  // [a, b, c, e]
  // Lane 0 of each chunk: (s0 + s2) + (s1 + s3).
  const __m512 u = _mm512_add_ps(w, _mm512_permute_ps(w, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 v = _mm512_add_ps(u, _mm512_permute_ps(u, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512i lane0 = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(lane0, v));
}

// The score loop: P pairs of K rows against R query rows, one accumulator per (query, pair) whose
// halves are the AVX2 kernels' per-(query, row) accumulators. Per step t < steps, decode(i, t, v)
// writes pair i's N decoded vectors and chan(t, n) is the query channel of vector n (the same
// 8 query values for both rows). out(r, k, sums) gets query r's sums of rows k .. k + 3.
template <int R, int P, int N, class Decode, class Chan, class Out>
inline void dot_pairs(int steps, const float* const* q, Decode decode, Chan chan, Out out) {
  __m512 a[R][P];
  BIE_UNROLL
  for (int r = 0; r < R; ++r) {
    BIE_UNROLL
    for (int i = 0; i < P; ++i) a[r][i] = _mm512_setzero_ps();
  }
  for (int t = 0; t < steps; ++t) {
    __m512 v[P][N];
    BIE_UNROLL
    for (int i = 0; i < P; ++i) decode(i, t, v[i]);
    BIE_UNROLL
    for (int n = 0; n < N; ++n) {
      const int c = chan(t, n);
      BIE_UNROLL
      for (int r = 0; r < R; ++r) {
        // The 8 query values in both halves (vbroadcastf64x4: AVX-512 F, no DQ needed).
        const __m512 qv =
            _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(q[r] + c))));
        BIE_UNROLL
        for (int i = 0; i < P; ++i) a[r][i] = _mm512_fmadd_ps(qv, v[i][n], a[r][i]);
      }
    }
  }
  BIE_UNROLL
  for (int r = 0; r < R; ++r) {
    BIE_UNROLL
    for (int i = 0; i < P; i += 2) {
      out(r, 2 * i, hsum4_pairs(a[r][i], i + 1 < P ? a[r][i + 1] : _mm512_setzero_ps()));
    }
  }
}

// Runs body(j0, n, P-tag) over all `rows` rows, 2 * PM at a time (PM pairs), then the n < 2 * PM
// left in (n + 1) / 2 pairs; rows(j0, n, k) names the tile row of the k-th row of a group (an odd
// group's last pair reads its last row twice and keeps one sum).
template <int PM, class Body>
inline void for_pairs(int rows, Body body) {
  int j = 0;
  for (; j + 2 * PM <= rows; j += 2 * PM) body(j, 2 * PM, std::integral_constant<int, PM>{});
  if (j < rows) with_count<PM>((rows - j + 1) / 2, [&](auto pt) { body(j, rows - j, pt); });
}
inline int group_row(int j0, int n, int k) {
  return j0 + std::min(k, n - 1);
}

// Stores lanes k .. min(k + 4, n) - 1 of x (sums of rows j0 + k ...) at s[k ..].
inline void store_sums(float* s, int k, int n, __m128 x) {
  alignas(16) float t[4];
  _mm_store_ps(t, x);
  for (int i = 0; i < 4 && k + i < n; ++i) s[k + i] = t[i];
}

// Scores of the formats whose rows decode 8 values per step from one place: pair i of a group
// reads row_at(row) + step_bytes * t for its two rows, decoded by dec8(a, b); mul(row) and
// add(r) finish a sum as sum * mul + add (the AVX2 kernels' order).
template <int R, int N, class Row, class Dec, class Chan, class Finish>
void score_rows(int steps, int rows, const float* const* q, float* s, int ss, Row row_at,
                int step_bytes, Dec dec, Chan chan, Finish finish) {
  for_pairs<score_pairs(R, N)>(rows, [&](int j0, int n, auto pt) {
    constexpr int P = decltype(pt)::value;
    const uint8_t* rp[2 * P];
    for (int k = 0; k < 2 * P; ++k) rp[k] = row_at(group_row(j0, n, k));
    dot_pairs<R, P, N>(
        steps, q,
        [&](int i, int t, __m512* v) {
          dec(rp[2 * i] + step_bytes * t, rp[2 * i + 1] + step_bytes * t, v);
        },
        chan,
        [&](int r, int k, __m128 x) { store_sums(s + r * ss + j0, k, n, finish(r, j0 + k, x)); });
  });
}

template <int R>
void f16_score(int d, const uint8_t* tile, int rows, const float* const* q, float* s, int ss) {
  const size_t rb = kv::row_bytes_f16(d);
  score_rows<R, 1>(
      d / 8, rows, q, s, ss, [&](int j) { return tile + j * rb; }, 16,
      [](const uint8_t* a, const uint8_t* b, __m512* v) { v[0] = load2x8_f16(a, b); },
      [](int t, int) { return 8 * t; }, [](int, int, __m128 x) { return x; });
}

// int8 / fp8 rows: codes times q, then the row scale (fp8: times 256), the tile's row scales
// converted once (as the AVX2 kernel converts them: fp16 -> fp32, then times 1 or 256).
template <int R, bool kFp8>
void scaled_score(int d, const uint8_t* tile, int rows, const float* const* q, float* s, int ss) {
  const size_t rb = kv::row_bytes_scaled(d);
  const float unit = kFp8 ? 256.0f : 1.0f;
  alignas(16) float sc[64 + 4] = {};  // fused tiles have at most 64 rows
  for (int j = 0; j < rows; ++j) sc[j] = f16c(tile + j * rb) * unit;
  score_rows<R, 1>(
      d / 8, rows, q, s, ss, [&](int j) { return tile + j * rb + 2; }, 8,
      [](const uint8_t* a, const uint8_t* b, __m512* v) {
        v[0] = kFp8 ? e4m3_div256(load2x8(a, b)) : load2x8_i8(a, b);
      },
      [](int t, int) { return 8 * t; },
      [&](int, int j, __m128 x) { return _mm_mul_ps(x, _mm_loadu_ps(sc + j)); });
}

// int4_channel: the tile's channel scales folded into the queries and its zero points into one
// constant per query (fold_channel_params); a row is a plain dot of those with its nibbles.
template <int R>
void chan_score(int d, const uint8_t* tile, int rows, const float* const* q, float* s, int ss) {
  const int half = d / 2;
  alignas(32) float qs[R][kMaxHeadDim];
  float zt[R];
  fold_channel_params<R>(d, tile, q, qs, zt);
  const float* qp[R];
  BIE_UNROLL
  for (int r = 0; r < R; ++r) qp[r] = qs[r];
  score_rows<R, 2>(
      half / 8, rows, qp, s, ss, [&](int j) { return tile + kv::chan_row_offset(d, j); }, 8,
      [](const uint8_t* a, const uint8_t* b, __m512* v) { nibbles16(load2x8(a, b), v, v + 1); },
      [&](int t, int n) { return 8 * t + n * half; },
      [&](int r, int, __m128 x) { return _mm_add_ps(x, _mm_set1_ps(zt[r])); });
}

// In-place transpose of a 16 x 16 dword matrix: afterwards t[c] lane i = the old t[i] lane c.
inline void transpose16_epi32(__m512i t[16]) {
  __m512i u[16];
  for (int i = 0; i < 16; i += 2) {
    u[i] = _mm512_unpacklo_epi32(t[i], t[i + 1]);
    u[i + 1] = _mm512_unpackhi_epi32(t[i], t[i + 1]);
  }
  // Per 128-bit lane L, v[4 * g + k] holds dword 4 L + k of rows 4 g .. 4 g + 3.
  __m512i v[16];
  for (int g = 0; g < 4; ++g) {
    v[4 * g] = _mm512_unpacklo_epi64(u[4 * g], u[4 * g + 2]);
    v[4 * g + 1] = _mm512_unpackhi_epi64(u[4 * g], u[4 * g + 2]);
    v[4 * g + 2] = _mm512_unpacklo_epi64(u[4 * g + 1], u[4 * g + 3]);
    v[4 * g + 3] = _mm512_unpackhi_epi64(u[4 * g + 1], u[4 * g + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    const __m512i x0 = _mm512_shuffle_i32x4(v[k], v[4 + k], 0x88);
    const __m512i x1 = _mm512_shuffle_i32x4(v[k], v[4 + k], 0xDD);
    const __m512i y0 = _mm512_shuffle_i32x4(v[8 + k], v[12 + k], 0x88);
    const __m512i y1 = _mm512_shuffle_i32x4(v[8 + k], v[12 + k], 0xDD);
    t[k] = _mm512_shuffle_i32x4(x0, y0, 0x88);
    t[8 + k] = _mm512_shuffle_i32x4(x0, y0, 0xDD);
    t[4 + k] = _mm512_shuffle_i32x4(x1, y1, 0x88);
    t[12 + k] = _mm512_shuffle_i32x4(x1, y1, 0xDD);
  }
}

// int4_channel by the int8-query method (quantise_queries): 16 rows per vector. Each 64-byte
// window of 16 rows' codes is transposed so that lane i of vector c holds row i's bytes
// 4c .. 4c + 3 (channels w + 4c.. in the low nibbles, half + w + 4c.. in the high ones); one
// vpdpbusd per nibble half, digit and query row then adds 4 channels to all 16 rows' sums.
// Vectors 0-7 and 8-15 of a window are one block each.
template <int R>
void chan_score_i8q(int d, const uint8_t* tile, int rows, const float* const* q, float* s, int ss) {
  const int half = d / 2;
  const I8qQueries<R> iq(d, tile, q);
  const uint8_t* codes = tile + kv::chan_row_offset(d, 0);
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const auto bcast = [](const int8_t* p) {
    int32_t x;
    std::memcpy(&x, p, 4);
    return _mm512_set1_epi32(x);
  };
  for (int j0 = 0; j0 < rows; j0 += 16) {
    const int n = std::min(16, rows - j0);
    __m512 f[R];
    BIE_UNROLL
    for (int r = 0; r < R; ++r) f[r] = _mm512_set1_ps(iq.zt[r]);
    // Windows of 64 code bytes per row; half = 32 (head_dim 64) loads 32 into the low half.
    for (int w = 0; w < half; w += 64) {
      const bool whole = half - w >= 64;
      __m512i t[16];
      for (int i = 0; i < 16; ++i) {
        t[i] = _mm512_maskz_loadu_epi32(whole ? 0xFFFF : 0x00FF,
                                        codes + (j0 + std::min(i, n - 1)) * half + w);
      }
      transpose16_epi32(t);
      for (int c0 = 0; c0 < (whole ? 16 : 8); c0 += 8) {
        __m512i a1[R], a2[R];
        BIE_UNROLL
        for (int r = 0; r < R; ++r) a1[r] = a2[r] = _mm512_setzero_si512();
        BIE_UNROLL
        for (int c = 0; c < 8; ++c) {
          const __m512i x = t[c0 + c];
          const __m512i lo = _mm512_and_si512(x, low4);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), low4);
          const int cl = w + 4 * (c0 + c), ch = half + cl;
          BIE_UNROLL
          for (int r = 0; r < R; ++r) {
            a1[r] = _mm512_dpbusd_epi32(a1[r], lo, bcast(iq.q1[r] + cl));
            a1[r] = _mm512_dpbusd_epi32(a1[r], hi, bcast(iq.q1[r] + ch));
            a2[r] = _mm512_dpbusd_epi32(a2[r], lo, bcast(iq.q2[r] + cl));
            a2[r] = _mm512_dpbusd_epi32(a2[r], hi, bcast(iq.q2[r] + ch));
          }
        }
        const int k = (w + 4 * c0) / kI8qBlockBytes;
        BIE_UNROLL
        for (int r = 0; r < R; ++r) {
          const __m512i isum = _mm512_add_epi32(_mm512_slli_epi32(a1[r], 7), a2[r]);
          f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(iq.sq[r][k]), f[r]);
        }
      }
    }
    const __mmask16 sm = static_cast<__mmask16>((1u << n) - 1);
    BIE_UNROLL
    for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(s + r * ss + j0, sm, f[r]);
  }
}

// int8_channel: as int4_channel, with one code byte per channel.
template <int R>
void chan8_score(int d, const uint8_t* tile, int rows, const float* const* q, float* s, int ss) {
  alignas(32) float qs[R][kMaxHeadDim];
  float zt[R];
  fold_channel_params<R>(d, tile, q, qs, zt);
  const float* qp[R];
  BIE_UNROLL
  for (int r = 0; r < R; ++r) qp[r] = qs[r];
  score_rows<R, 1>(
      d / 8, rows, qp, s, ss, [&](int j) { return tile + kv::chan8_row_offset(d, j); }, 8,
      [](const uint8_t* a, const uint8_t* b, __m512* v) { v[0] = load2x8_u8(a, b); },
      [](int t, int) { return 8 * t; },
      [&](int r, int, __m128 x) { return _mm_add_ps(x, _mm_set1_ps(zt[r])); });
}

bool covered_k(KvType t) {
  return t == KvType::kF16 || t == KvType::kInt8 || t == KvType::kFp8E4M3 ||
         t == KvType::kInt4Channel || t == KvType::kInt8Channel;
}

template <int R>
void score_r(const PagedBlockView& bv, const uint8_t* tile, int rows, const float* const* q,
             float* s, int ss) {
  const int d = bv.gk.head_dim;
  switch (bv.tk->type) {
    case KvType::kF16:
      return f16_score<R>(d, tile, rows, q, s, ss);
    case KvType::kInt8:
      return scaled_score<R, false>(d, tile, rows, q, s, ss);
    case KvType::kFp8E4M3:
      return scaled_score<R, true>(d, tile, rows, q, s, ss);
    case KvType::kInt4Channel:
      if (int8_query_ok(d)) return chan_score_i8q<R>(d, tile, rows, q, s, ss);
      return chan_score<R>(d, tile, rows, q, s, ss);
    case KvType::kInt8Channel:
      return chan8_score<R>(d, tile, rows, q, s, ss);
    default:
      assert(false);
  }
}

// ---- values: acc[r][c] += sum_j p[r * ps + j] * V row j ---------------------------------------

// N 16-channel vectors at channels c[n] of R accumulators over all rows: decode(j, v) gives row
// j's N vectors, w(r, j) the weight. Each channel's FMAs in row order (kPairs: in
// int4_pair_order), as the AVX2 kernels'.
template <int R, int N, bool kPairs = false, class Decode, class Weight>
inline void accum16(int rows, float* const* acc, const int* c, Decode decode, Weight w) {
  __m512 a[R][N];
  BIE_UNROLL
  for (int r = 0; r < R; ++r) {
    BIE_UNROLL
    for (int n = 0; n < N; ++n) a[r][n] = _mm512_loadu_ps(acc[r] + c[n]);
  }
  for (int jo = 0; jo < rows; ++jo) {
    const int j = kPairs ? int4_pair_order(jo, rows) : jo;
    __m512 v[N];
    decode(j, v);
    BIE_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m512 wr = _mm512_set1_ps(w(r, j));
      BIE_UNROLL
      for (int n = 0; n < N; ++n) a[r][n] = _mm512_fmadd_ps(wr, v[n], a[r][n]);
    }
  }
  BIE_UNROLL
  for (int r = 0; r < R; ++r) {
    BIE_UNROLL
    for (int n = 0; n < N; ++n) _mm512_storeu_ps(acc[r] + c[n], a[r][n]);
  }
}

// Row-wise V formats: channels [0, d) 16 * accum_vectors(R) at a time (the last pass fewer), row
// j's 16 channels from c decoded by dec16(j, c).
template <int R, int N, class Dec, class Weight>
inline void accum_pass(int c0, int rows, float* const* acc, Dec dec16, Weight w) {
  int c[N];
  BIE_UNROLL
  for (int n = 0; n < N; ++n) c[n] = c0 + 16 * n;
  accum16<R, N>(
      rows, acc, c,
      [&](int j, __m512* v) {
        BIE_UNROLL
        for (int n = 0; n < N; ++n) v[n] = dec16(j, c0 + 16 * n);
      },
      w);
}
template <int R, class Dec, class Weight>
void accum_rows(int d, int rows, float* const* acc, Dec dec16, Weight w) {
  constexpr int kN = accum_vectors(R);
  for (int c0 = 0; c0 < d; c0 += 16 * kN) {
    with_count<kN>(std::min(kN, (d - c0) / 16),
                   [&](auto nt) { accum_pass<R, decltype(nt)::value>(c0, rows, acc, dec16, w); });
  }
}

template <int R>
void f16_accum(int d, const uint8_t* tile, int rows, const float* p, int ps, float* const* acc) {
  const size_t rb = kv::row_bytes_f16(d);
  accum_rows<R>(
      d, rows, acc,
      [&](int j, int c) {
        return _mm512_cvtph_ps(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + j * rb + 2 * c)));
      },
      [&](int r, int j) { return p[r * ps + j]; });
}

template <int R, bool kFp8>
void scaled_accum(int d, const uint8_t* tile, int rows, const float* p, int ps, float* const* acc) {
  const size_t rb = kv::row_bytes_scaled(d);
  float w[R][64];  // p times the row scale, for the block's rows (block_size <= 64 fused)
  scaled_weights<R>(tile, rows, rb, kFp8 ? 256.0f : 1.0f, p, ps, w);
  accum_rows<R>(
      d, rows, acc,
      [&](int j, int c) {
        const __m128i codes =
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(tile + j * rb + 2 + c));
        return kFp8 ? e4m3_div256(codes) : _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes));
      },
      [&](int r, int j) { return w[r][j]; });
}

// int4_asym: per group, the weights and zero-point sums as the AVX2 kernel computes them, then
// 16 bytes of nibbles per vector pair: channels k.. (low nibbles) and half + k.. (high).
template <int R>
void int4_accum(int d, int G, const uint8_t* tile, int rows, const float* p, int ps,
                float* const* acc) {
  const int half = G / 2, ng = d / G;
  const size_t gb = kv::group_bytes_int4(G), rb = kv::row_bytes_int4(d, G);
  float w[R][64];
  const auto weight = [&](int r, int j) { return w[r][j]; };
  for (int b = 0; b < ng; ++b) {
    int4_group_weights<R>(tile, rows, rb, gb, b, G, p, ps, acc, w);
    const uint8_t* grp = tile + b * gb + 4;
    int k = 0;
    // 32 bytes (4 vectors) per pass while their accumulators fit, else 16.
    for (; accum_vectors(R) == 4 && k + 32 <= half; k += 32) {
      const int c[4] = {b * G + k, b * G + half + k, b * G + k + 16, b * G + half + k + 16};
      accum16<R, 4, true>(
          rows, acc, c,
          [&](int j, __m512* v) {
            const uint8_t* x = grp + j * rb + k;
            nibbles16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)), v, v + 1);
            nibbles16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 16)), v + 2, v + 3);
          },
          weight);
    }
    for (; k < half; k += 16) {
      const int c[2] = {b * G + k, b * G + half + k};
      accum16<R, 2, true>(
          rows, acc, c,
          [&](int j, __m512* v) {
            nibbles16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(grp + j * rb + k)), v,
                      v + 1);
          },
          weight);
    }
  }
}

// ---- int4_asym V by AVX512_BF16 pair dot products (vdpbf16ps) -------------------------------
// One instruction adds two rows' products to 16 channels: lane c holds (row 2i's code, row
// 2i+1's code) of channel c as bf16, the broadcast pair (w_2i, w_2i+1) the bf16 weights. It adds
// the odd row's product, then the even row's, each rounded once: int4_pair_order, so these give
// the FMA kernels' bits (the weights already bf16, int4_group_weights) at half the instructions.
// Only the functions that use the instruction carry its target; lambdas would not inherit it.
#define BIE_TARGET_BF16 __attribute__((target("avx512bf16")))

// bf16 bits of the codes 0..15, the word table vpermw looks them up in (indices 16..31 repeat
// them, unused). Built at compile time: the kernel loads it once per call.
struct Bf16CodeTable {
  alignas(64) uint16_t bits[32];
};
constexpr Bf16CodeTable kBf16Codes = [] {
  Bf16CodeTable t{};
  for (int i = 0; i < 32; ++i) {
    t.bits[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(static_cast<float>(i & 15)) >> 16);
  }
  return t;
}();

// Rows a and b's 16 code bytes as bf16 pairs per channel: lo lane c = (a's, b's) low nibble of
// byte c, hi the high nibbles.
inline void code_pairs16(__m128i a, __m128i b, __m512i table, __m512i* lo, __m512i* hi) {
  const __m512i w =
      _mm512_cvtepu8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(a, b), _mm_unpacklo_epi8(a, b)));
  *lo = _mm512_permutexvar_epi16(_mm512_and_si512(w, _mm512_set1_epi16(15)), table);
  *hi = _mm512_permutexvar_epi16(_mm512_srli_epi16(w, 4), table);
}

// One pair of rows into R accumulators of N vectors: x0, x1 the rows' bytes (x1 null: an odd
// last row, paired with code 0), wp the pair's weights per accumulator row (stride 32).
template <int R, int N>
BIE_TARGET_BF16 inline void int4_pair_bf16(__m512 (&a)[R][N], const uint8_t* x0, const uint8_t* x1,
                                           const uint32_t* wp, __m512i table) {
  BIE_UNROLL
  for (int h = 0; h < N / 2; ++h) {
    const __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x0 + 16 * h));
    const __m128i b1 =
        x1 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(x1 + 16 * h)) : _mm_setzero_si128();
    __m512i lo, hi;
    code_pairs16(b0, b1, table, &lo, &hi);
    BIE_UNROLL
    for (int r = 0; r < R; ++r) {
      const auto wb = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(wp[32 * r])));
      a[r][2 * h] = _mm512_dpbf16_ps(a[r][2 * h], reinterpret_cast<__m512bh>(lo), wb);
      a[r][2 * h + 1] = _mm512_dpbf16_ps(a[r][2 * h + 1], reinterpret_cast<__m512bh>(hi), wb);
    }
  }
}

// Channels [c_lo, c_lo + 8N) (low nibbles of bytes x..x + 8N) and [c_hi, c_hi + 8N) (their high
// nibbles) of R accumulators over the tile's rows (row j's bytes at x + j * rb); wp[r][i] the
// weight pair of rows 2i, 2i + 1 (an odd last row paired with weight 0).
template <int R, int N>
BIE_TARGET_BF16 inline void int4_pass_bf16(const uint8_t* x, size_t rb, int rows, int c_lo,
                                           int c_hi, const uint32_t (*wp)[32], __m512i table,
                                           float* const* acc) {
  constexpr int H = N / 2;  // 16-byte loads per row
  __m512 a[R][N];
  BIE_UNROLL
  for (int r = 0; r < R; ++r) {
    BIE_UNROLL
    for (int h = 0; h < H; ++h) {
      a[r][2 * h] = _mm512_loadu_ps(acc[r] + c_lo + 16 * h);
      a[r][2 * h + 1] = _mm512_loadu_ps(acc[r] + c_hi + 16 * h);
    }
  }
  int i = 0;
  for (; 2 * i + 1 < rows; ++i) {
    int4_pair_bf16<R, N>(a, x + 2 * i * rb, x + (2 * i + 1) * rb, &wp[0][i], table);
  }
  if (2 * i < rows) int4_pair_bf16<R, N>(a, x + 2 * i * rb, nullptr, &wp[0][i], table);
  BIE_UNROLL
  for (int r = 0; r < R; ++r) {
    BIE_UNROLL
    for (int h = 0; h < H; ++h) {
      _mm512_storeu_ps(acc[r] + c_lo + 16 * h, a[r][2 * h]);
      _mm512_storeu_ps(acc[r] + c_hi + 16 * h, a[r][2 * h + 1]);
    }
  }
}

// int4_accum's arithmetic by pair dot products: per group the same weights and zero-point sums,
// then 32 bytes (4 vectors) per pass while their accumulators, two decoded vectors and R weights
// fit, else 16.
template <int R>
BIE_TARGET_BF16 void int4_accum_bf16(int d, int G, const uint8_t* tile, int rows, const float* p,
                                     int ps, float* const* acc) {
  const int half = G / 2, ng = d / G;
  const size_t gb = kv::group_bytes_int4(G), rb = kv::row_bytes_int4(d, G);
  const __m512i table = _mm512_load_si512(kBf16Codes.bits);
  float w[R][64];
  alignas(64) uint32_t wp[R][32];
  for (int b = 0; b < ng; ++b) {
    // vcvtne2ps2bf16 rounds as bf16_weight does (nearest even; denormals to zero): 32 weights
    // in row order per instruction, i.e. the pairs (w_2i, w_2i+1) as dwords. Past `rows`, zeros.
    int4_group_weights<R, false>(tile, rows, rb, gb, b, G, p, ps, acc, w);
    for (int r = 0; r < R; ++r) {
      for (int j = 0; j < rows; j += 32) {
        const __mmask16 m0 = rows - j >= 16 ? 0xFFFF : (1u << (rows - j)) - 1;
        const __mmask16 m1 = rows - j >= 32   ? 0xFFFF
                             : rows - j <= 16 ? 0
                                              : (1u << (rows - j - 16)) - 1;
        const __m512 lo = _mm512_maskz_loadu_ps(m0, w[r] + j);
        const __m512 hi = _mm512_maskz_loadu_ps(m1, w[r] + j + 16);
        _mm512_store_si512(&wp[r][j / 2], reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
      }
    }
    const uint8_t* grp = tile + b * gb + 4;
    int k = 0;
    if constexpr (4 * R + 2 + R + 2 <= kLiveZmm) {
      for (; k + 32 <= half; k += 32) {
        int4_pass_bf16<R, 4>(grp + k, rb, rows, b * G + k, b * G + half + k, wp, table, acc);
      }
    }
    for (; k < half; k += 16) {
      int4_pass_bf16<R, 2>(grp + k, rb, rows, b * G + k, b * G + half + k, wp, table, acc);
    }
  }
}

bool covered_v(KvType t) {
  return t == KvType::kF16 || t == KvType::kInt8 || t == KvType::kFp8E4M3 || t == KvType::kInt4Asym;
}

template <int R, bool kBf16>
void accum_r(const PagedBlockView& bv, const uint8_t* tile, int rows, const float* p, int ps,
             float* const* acc) {
  const int d = bv.gv.head_dim;
  switch (bv.tv->type) {
    case KvType::kF16:
      return f16_accum<R>(d, tile, rows, p, ps, acc);
    case KvType::kInt8:
      return scaled_accum<R, false>(d, tile, rows, p, ps, acc);
    case KvType::kFp8E4M3:
      return scaled_accum<R, true>(d, tile, rows, p, ps, acc);
    case KvType::kInt4Asym:
      if constexpr (kBf16) return int4_accum_bf16<R>(d, bv.gv.group, tile, rows, p, ps, acc);
      return int4_accum<R>(d, bv.gv.group, tile, rows, p, ps, acc);
    default:
      assert(false);
  }
}

void avx512_score(const PagedBlockView& bv, const uint8_t* tile, int rows, const float* const* q,
                  int n_rows, float* s, int ss) {
  if (!fused_ok(bv.gk, rows) || !covered_k(bv.tk->type)) {
    return avx2().score(bv, tile, rows, q, n_rows, s, ss);
  }
  for_fused_rows<kFuse512>(n_rows, [&](int r0, auto rt) {
    score_r<decltype(rt)::value>(bv, tile, rows, q + r0, s + r0 * ss, ss);
  });
}

template <bool kBf16>
void avx512_accum(const PagedBlockView& bv, const uint8_t* tile, int rows, const float* p, int ps,
                  float* const* acc, int n_rows) {
  const bool int4_small = bv.tv->type == KvType::kInt4Asym && bv.gv.group < 32;
  if (!fused_ok(bv.gv, rows) || !covered_v(bv.tv->type) || int4_small) {
    return avx2().accum(bv, tile, rows, p, ps, acc, n_rows);
  }
  for_fused_rows<kFuse512>(n_rows, [&](int r0, auto rt) {
    accum_r<decltype(rt)::value, kBf16>(bv, tile, rows, p + r0 * ps, ps, acc + r0);
  });
}

}  // namespace

namespace detail {
TileKernels avx512_kernels(bool bf16) {
  const TileKernels narrow = avx2();
  return TileKernels{avx512_score, bf16 ? avx512_accum<true> : avx512_accum<false>, narrow.update,
                     narrow.round_fp16, narrow.add_row_sums};
}
}  // namespace detail

}  // namespace bie::attention
