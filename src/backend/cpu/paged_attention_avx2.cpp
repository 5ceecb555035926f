// AVX2+FMA+F16C kernels of the fused paged attention: a block's K (V) rows are decoded once into
// fp32 lanes and used by up to 4 tile rows (query heads of the group, queries of a prefill tile)
// at once, with q, partial sums and accumulators in registers. Nibbles are widened straight from
// memory (vpmovzxbd: 8 bytes -> low nibbles with one AND, high nibbles with one shift), so an
// int4 row costs a few shuffles and FMAs per 16 values. Formats or head widths not covered here
// (head_dim % 16 != 0) use the generic per-row traits kernels.
// note: everything here runs only after has_avx2().
#include <immintrin.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "backend/cpu/paged_attention.h"
#include "backend/cpu/paged_attention_x86_inl.h"
#include "bie/backend/kv_layout.h"
#include "bie/common/simd_avx2.h"

namespace bie::attention {

// scores[j] = q . row j of an f16 tile, summed exactly as attend_one_head_avx2 sums: one 8-lane
// FMA accumulator over head_dim, then the same horizontal sum. Keeps the f16 K dot in
// ContiguousKvCache's order (kv::f16_dot's two accumulators move SmolLM2's logits by up to 0.8,
// past the golden bar).
// note: call only if head_dim % 8 == 0 and the CPU has AVX2+FMA+F16C
void f16_dot_dense_order_avx2(int head_dim, const float* q, const uint8_t* tile, int n,
                              float* scores);

namespace {

using planner::KvType;

using simd::hsum;

inline __m256 load8_f16(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load8_i8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
// 8 e4m3 codes -> values / 256 (kv_format_avx2.cpp's identity; the caller folds 256 in).
inline __m256 load8_e4m3_div256(const uint8_t* p) {
  const __m128i c = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(c, _mm_set1_epi16(0x80)), 8),
                                 _mm_slli_epi16(_mm_and_si128(c, _mm_set1_epi16(0x7F)), 7));
  return _mm256_cvtph_ps(h);
}
// 8 bytes of nibbles -> low nibbles (lo) and high nibbles (hi) as 8 fp32 each.
inline void load8_nibbles(const uint8_t* p, __m256* lo, __m256* hi) {
  const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  *lo = _mm256_cvtepi32_ps(_mm256_and_si256(x, _mm256_set1_epi32(0x0F)));
  *hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(x, 4));
}
// ---- scores: s[r * ss + j] = q[r] . K row j, R rows of the tile at once ----------------------

// s[r * ss] = mul[r] * (sum of v[r]'s lanes) + add[r] for r < R, the R horizontal sums done
// together (3 vhaddps for 4 vectors instead of 4 separate reductions). Not for FP16 K tiles,
// whose sums must keep dense_attention's order.
template <int R>
inline void store_sums(const __m256* v, const float* mul, const float* add, float* s, int ss) {
  const __m256 z = _mm256_setzero_ps();
  for (int r0 = 0; r0 < R; r0 += 4) {
    const __m256 a = v[r0], b = r0 + 1 < R ? v[r0 + 1] : z;
    const __m256 c = r0 + 2 < R ? v[r0 + 2] : z, e = r0 + 3 < R ? v[r0 + 3] : z;
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, e));
    alignas(16) float t[4];
    _mm_store_ps(t, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
    for (int k = 0; k < 4 && r0 + k < R; ++k) {
      s[(r0 + k) * ss] = mul[r0 + k] * t[k] + add[r0 + k];
    }
  }
}

// The horizontal sums of 4 vectors at once, each in hsum's order ((x0 + x4) + (x2 + x6)) +
// ((x1 + x5) + (x3 + x7)), so bit for bit hsum(v[i]) in lane i: fp addition is commutative, and
// every add below pairs the same two partial sums as hsum does.
inline __m128 hsum4_dense(__m256 v0, __m256 v1, __m256 v2, __m256 v3) {
  // [v0.lo + v0.hi | v1.lo + v1.hi], [v2 | v3]
  const __m256 t0 =
      _mm256_add_ps(_mm256_permute2f128_ps(v0, v1, 0x20), _mm256_permute2f128_ps(v0, v1, 0x31));
  const __m256 t1 =
      _mm256_add_ps(_mm256_permute2f128_ps(v2, v3, 0x20), _mm256_permute2f128_ps(v2, v3, 0x31));
  // [v0: y0 + y2, y1 + y3, v2: ..., ... | v1: ..., v3: ...]
  const __m256 u = _mm256_add_ps(_mm256_shuffle_ps(t0, t1, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm256_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 2, 3, 2)));
  // [v0, v2, v0, v2 | v1, v3, v1, v3] -> [v0, v1, v2, v3]
  const __m256 h = _mm256_hadd_ps(u, u);
  return _mm_unpacklo_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// The score loop shared by all formats: rows j0 .. j0 + J - 1 of a K tile against R query rows,
// one 8-lane accumulator per (query, row) = R * J independent FMA chains (one row's R chains of
// head_dim / 8 FMAs would leave the FMA units waiting on latency). Per step t < steps,
// decode(i, t, v) writes row i's N decoded vectors and chan(t, n) is the query channel of
// vector n. The horizontal sums are batched four rows at a time (hsum4_dense: hsum's order).
// out(r, sums) gets query r's J sums in the low lanes of `sums`.
template <int R, int J, int N, class Decode, class Chan, class Out>
inline void dot_rows(int steps, const float* const* q, Decode decode, Chan chan, Out out) {
  static_assert(J >= 1 && J <= 4);
  __m256 a[R][4];
  BIE_UNROLL
  for (int r = 0; r < R; ++r) {
    BIE_UNROLL
    for (int i = 0; i < 4; ++i) a[r][i] = _mm256_setzero_ps();
  }
  for (int t = 0; t < steps; ++t) {
    // Decode the J rows first, so that each query vector is loaded once for all of them (loads,
    // not FMAs, were the limit with q reloaded per row).
    __m256 v[J][N];
    BIE_UNROLL
    for (int i = 0; i < J; ++i) decode(i, t, v[i]);
    BIE_UNROLL
    for (int n = 0; n < N; ++n) {
      const int c = chan(t, n);
      BIE_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m256 qv = _mm256_loadu_ps(q[r] + c);
        BIE_UNROLL
        for (int i = 0; i < J; ++i) a[r][i] = _mm256_fmadd_ps(qv, v[i][n], a[r][i]);
      }
    }
  }
  BIE_UNROLL
  for (int r = 0; r < R; ++r) out(r, hsum4_dense(a[r][0], a[r][1], a[r][2], a[r][3]));
}

// Runs dot_rows over all `rows` rows, J at a time, the tail with fewer. body(j0, J-tag) calls
// dot_rows<R, J, ...> for rows j0 .. j0 + J - 1.
template <int R, class Body>
inline void for_row_groups(int rows, Body body) {
  // R * J accumulators, J * N decoded vectors and one query vector within 16 registers.
  constexpr int J = R <= 2 ? 4 : (R == 3 ? 3 : 2);
  int j = 0;
  for (; j + J <= rows; j += J) body(j, std::integral_constant<int, J>{});
  switch (rows - j) {
    case 1:
      return body(j, std::integral_constant<int, 1>{});
    case 2:
      return body(j, std::integral_constant<int, 2>{});
    case 3:
      if constexpr (J > 3) return body(j, std::integral_constant<int, 3>{});
      break;
    default:
      break;
  }
}

// Stores the low J lanes of x at s[0 .. J).
template <int J>
inline void store_lanes(float* s, __m128 x) {
  if constexpr (J == 4) {
    _mm_storeu_ps(s, x);
  } else {
    alignas(16) float t[4];
    _mm_store_ps(t, x);
    for (int i = 0; i < J; ++i) s[i] = t[i];
  }
}

// FP16: per row and query one 8-lane accumulator in channel order, then hsum's order
// (dense_attention's arithmetic, bit for bit).
template <int R>
void f16_score(int d, const uint8_t* tile, int rows, const float* const* q, float* s, int ss) {
  const size_t rb = kv::row_bytes_f16(d);
  for_row_groups<R>(rows, [&](int j0, auto jt) {
    constexpr int J = decltype(jt)::value;
    const uint8_t* row = tile + j0 * rb;
    dot_rows<R, J, 1>(
        d / 8, q, [&](int i, int t, __m256* v) { v[0] = load8_f16(row + i * rb + 16 * t); },
        [](int t, int) { return 8 * t; },
        [&](int r, __m128 x) { store_lanes<J>(s + r * ss + j0, x); });
  });
}

// int8 / fp8: codes times q, then the row scale.
template <int R, bool kFp8>
void scaled_score(int d, const uint8_t* tile, int rows, const float* const* q, float* s, int ss) {
  const size_t rb = kv::row_bytes_scaled(d);
  const __m128 unit = _mm_set1_ps(kFp8 ? 256.0f : 1.0f);
  for_row_groups<R>(rows, [&](int j0, auto jt) {
    constexpr int J = decltype(jt)::value;
    const uint8_t* row = tile + j0 * rb;
    const __m128 sc = _mm_mul_ps(load4_f16_strided<J>(row, rb), unit);
    dot_rows<R, J, 1>(
        d / 8, q,
        [&](int i, int t, __m256* v) {
          const uint8_t* codes = row + i * rb + 2 + 8 * t;
          v[0] = kFp8 ? load8_e4m3_div256(codes) : load8_i8(codes);
        },
        [](int t, int) { return 8 * t; },
        [&](int r, __m128 x) { store_lanes<J>(s + r * ss + j0, _mm_mul_ps(x, sc)); });
  });
}

// int4_asym gG: per group s * sum(q n) + z * sum(q); sum(q) per group is shared by all rows.
template <int R>
void int4_score(int d, int G, const uint8_t* tile, int rows, const float* const* q, float* s,
                int ss) {
  const int half = G / 2, ng = d / G;
  const size_t gb = kv::group_bytes_int4(G), rb = kv::row_bytes_int4(d, G);
  float qsum[R][kMaxHeadDim / 32];
  BIE_UNROLL
  for (int r = 0; r < R; ++r) {
    for (int b = 0; b < ng; ++b) {
      __m256 t = _mm256_setzero_ps();
      for (int c = 0; c < G; c += 8) t = _mm256_add_ps(t, _mm256_loadu_ps(q[r] + b * G + c));
      qsum[r][b] = hsum(t);
    }
  }
  if (ng == 1) {
    // One group per row (head_dim == G, SmolLM2's d 64 with g64): the scale and zero apply after
    // the horizontal sum, s = scale * sum(q n) + zero * sum(q).
    for_row_groups<R>(rows, [&](int j0, auto jt) {
      constexpr int J = decltype(jt)::value;
      const uint8_t* row = tile + j0 * rb;
      const __m128 sc = load4_f16_strided<J>(row, rb), zz = load4_f16_strided<J>(row + 2, rb);
      dot_rows<R, J, 2>(
          half / 8, q,
          [&](int i, int t, __m256* v) { load8_nibbles(row + i * rb + 4 + 8 * t, v, v + 1); },
          [&](int t, int n) { return 8 * t + n * half; },
          [&](int r, __m128 x) {
            store_lanes<J>(s + r * ss + j0,
                           _mm_fmadd_ps(x, sc, _mm_mul_ps(zz, _mm_set1_ps(qsum[r][0]))));
          });
    });
    return;
  }
  for (int j = 0; j < rows; ++j) {
    const uint8_t* row = tile + j * rb;
    __m256 tot[R];
    float z[R];
    BIE_UNROLL
    for (int r = 0; r < R; ++r) {
      tot[r] = _mm256_setzero_ps();
      z[r] = 0.0f;
    }
    for (int b = 0; b < ng; ++b) {
      const uint8_t* grp = row + b * gb;
      __m256 a[R], c2[R];
      BIE_UNROLL
      for (int r = 0; r < R; ++r) a[r] = c2[r] = _mm256_setzero_ps();
      for (int k = 0; k < half; k += 8) {
        __m256 lo, hi;
        load8_nibbles(grp + 4 + k, &lo, &hi);
        BIE_UNROLL
        for (int r = 0; r < R; ++r) {
          const float* qg = q[r] + b * G;
          a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(qg + k), lo, a[r]);
          c2[r] = _mm256_fmadd_ps(_mm256_loadu_ps(qg + half + k), hi, c2[r]);
        }
      }
      const __m256 sc = _mm256_set1_ps(f16c(grp));
      const float zz = f16c(grp + 2);
      BIE_UNROLL
      for (int r = 0; r < R; ++r) {
        tot[r] = _mm256_fmadd_ps(_mm256_add_ps(a[r], c2[r]), sc, tot[r]);
        z[r] += zz * qsum[r][b];
      }
    }
    float mul[R];
    BIE_UNROLL
    for (int r = 0; r < R; ++r) mul[r] = 1.0f;
    store_sums<R>(tot, mul, z, s + j, ss);
  }
}

// int4_channel: per tile, fold the channel scales into the queries (qs = q * scale) and the zero
// points into one constant per query; a row is then a plain dot of qs with its nibbles.
template <int R>
void chan_score(int d, const uint8_t* tile, int rows, const float* const* q, float* s, int ss) {
  const int half = d / 2;
  alignas(32) float qs[R][kMaxHeadDim];
  float zt[R];
  fold_channel_params<R>(d, tile, q, qs, zt);
  const float* qp[R];
  BIE_UNROLL
  for (int r = 0; r < R; ++r) qp[r] = qs[r];
  const size_t rb = static_cast<size_t>(half);
  for_row_groups<R>(rows, [&](int j0, auto jt) {
    constexpr int J = decltype(jt)::value;
    const uint8_t* row = tile + kv::chan_row_offset(d, j0);
    dot_rows<R, J, 2>(
        half / 8, qp,
        [&](int i, int t, __m256* v) { load8_nibbles(row + i * rb + 8 * t, v, v + 1); },
        [&](int t, int n) { return 8 * t + n * half; },
        [&](int r, __m128 x) {
          store_lanes<J>(s + r * ss + j0, _mm_add_ps(x, _mm_set1_ps(zt[r])));
        });
  });
}

// int4_channel by the int8-query method (quantise_queries), one row at a time: each 32 code bytes
// are one block; per block, digit and query row a pmaddubsw per nibble half and a pmaddwd, then
// the R rows' sums reduced together.
template <int R>
void chan_score_i8q(int d, const uint8_t* tile, int rows, const float* const* q, float* s, int ss) {
  static_assert(R <= 4);
  const int half = d / 2, nb = half / kI8qBlockBytes;
  const I8qQueries<R> iq(d, tile, q);
  // The scales per block, the R query rows in lanes 0 .. R - 1.
  alignas(16) float sqt[kMaxHeadDim / 64][4] = {};
  alignas(16) float z4[4] = {};
  BIE_UNROLL
  for (int r = 0; r < R; ++r) {
    z4[r] = iq.zt[r];
    for (int k = 0; k < nb; ++k) sqt[k][r] = iq.sq[r][k];
  }
  const uint8_t* codes = tile + kv::chan_row_offset(d, 0);
  const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const auto ld = [](const int8_t* p) {
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
  };
  // pmaddubsw sums pairs of products (|2 * 15 * 127| fits int16), pmaddwd widens to int32.
  const auto dot = [&](__m256i lo, __m256i hi, const int8_t* ql, const int8_t* qh) {
    return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, ld(ql)), ones),
                            _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ld(qh)), ones));
  };
  for (int j = 0; j < rows; ++j) {
    const uint8_t* row = codes + static_cast<size_t>(j) * half;
    __m128 f = _mm_load_ps(z4);
    for (int k = 0; k < nb; ++k) {
      const int cl = kI8qBlockBytes * k, ch = half + cl;
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + cl));
      const __m256i lo = _mm256_and_si256(x, low4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), low4);
      __m256i a[4];
      for (__m256i& v : a) v = _mm256_setzero_si256();
      BIE_UNROLL
      for (int r = 0; r < R; ++r) {
        a[r] = _mm256_add_epi32(_mm256_slli_epi32(dot(lo, hi, iq.q1[r] + cl, iq.q1[r] + ch), 7),
                                dot(lo, hi, iq.q2[r] + cl, iq.q2[r] + ch));
      }
      // [sum a0, sum a1, sum a2, sum a3] (integers: any order is exact).
      const __m256i h =
          _mm256_hadd_epi32(_mm256_hadd_epi32(a[0], a[1]), _mm256_hadd_epi32(a[2], a[3]));
      const __m128i t = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
      f = _mm_fmadd_ps(_mm_cvtepi32_ps(t), _mm_load_ps(sqt[k]), f);
    }
    alignas(16) float out[4];
    _mm_store_ps(out, f);
    BIE_UNROLL
    for (int r = 0; r < R; ++r) s[r * ss + j] = out[r];
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
  const size_t rb = static_cast<size_t>(d);
  for_row_groups<R>(rows, [&](int j0, auto jt) {
    constexpr int J = decltype(jt)::value;
    const uint8_t* row = tile + kv::chan8_row_offset(d, j0);
    dot_rows<R, J, 1>(
        d / 8, qp,
        [&](int i, int t, __m256* v) {
          v[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + i * rb + 8 * t))));
        },
        [](int t, int) { return 8 * t; },
        [&](int r, __m128 x) {
          store_lanes<J>(s + r * ss + j0, _mm_add_ps(x, _mm_set1_ps(zt[r])));
        });
  });
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
    case KvType::kInt4Asym:
      return int4_score<R>(d, bv.gk.group, tile, rows, q, s, ss);
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

// N 8-channel vectors at channels c[n] of R accumulators over all rows: decode(j, p, v) gives
// row j's vectors 2p and 2p + 1, w(r, j) the weight. R * N independent FMA chains of `rows`
// FMAs each. Decoding pair by pair (and broadcasting each weight per pair) keeps R * N
// accumulators + 2 vectors + 1 weight within 16 registers; with all N vectors decoded up front,
// GCC spilled two accumulators to the stack (a store-forwarding round trip in their chains).
// kPairs: the rows in int4_pair_order.
template <int R, int N, bool kPairs = false, class Decode, class Weight>
inline void accum_vecs(int rows, float* const* acc, const int* c, Decode decode, Weight w) {
  static_assert(N % 2 == 0);
  __m256 a[R][N];
  BIE_UNROLL
  for (int r = 0; r < R; ++r) {
    BIE_UNROLL
    for (int n = 0; n < N; ++n) a[r][n] = _mm256_loadu_ps(acc[r] + c[n]);
  }
  for (int jo = 0; jo < rows; ++jo) {
    const int j = kPairs ? int4_pair_order(jo, rows) : jo;
    BIE_UNROLL
    for (int p = 0; p < N / 2; ++p) {
      __m256 v[2];
      decode(j, p, v);
      BIE_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m256 wr = _mm256_set1_ps(w(r, j));
        a[r][2 * p] = _mm256_fmadd_ps(wr, v[0], a[r][2 * p]);
        a[r][2 * p + 1] = _mm256_fmadd_ps(wr, v[1], a[r][2 * p + 1]);
      }
    }
  }
  BIE_UNROLL
  for (int r = 0; r < R; ++r) {
    BIE_UNROLL
    for (int n = 0; n < N; ++n) _mm256_storeu_ps(acc[r] + c[n], a[r][n]);
  }
}

// Vectors per pass: 4 (32 channels) for up to 3 rows (12 chains, one row's decode and the
// weights in the remaining registers), 2 for 4 rows.
template <int R>
constexpr int kAccVecs = R >= 4 ? 2 : 4;

template <int R>
void f16_accum(int d, const uint8_t* tile, int rows, const float* p, int ps, float* const* acc) {
  constexpr int N = kAccVecs<R>;
  const size_t rb = kv::row_bytes_f16(d);
  for (int c0 = 0; c0 < d; c0 += 8 * N) {
    int c[N];
    for (int n = 0; n < N; ++n) c[n] = c0 + 8 * n;
    if (c0 + 8 * N > d) {  // d % 32 == 16: the last 16 channels in a pair
      accum_vecs<R, 2>(
          rows, acc, c,
          [&](int j, int, __m256* v) {
            for (int n = 0; n < 2; ++n) v[n] = load8_f16(tile + j * rb + 2 * (c0 + 8 * n));
          },
          [&](int r, int j) { return p[r * ps + j]; });
      break;
    }
    accum_vecs<R, N>(
        rows, acc, c,
        [&](int j, int pr, __m256* v) {
          for (int n = 0; n < 2; ++n) v[n] = load8_f16(tile + j * rb + 2 * (c0 + 16 * pr + 8 * n));
        },
        [&](int r, int j) { return p[r * ps + j]; });
  }
}

template <int R, bool kFp8>
void scaled_accum(int d, const uint8_t* tile, int rows, const float* p, int ps, float* const* acc) {
  const size_t rb = kv::row_bytes_scaled(d);
  const float unit = kFp8 ? 256.0f : 1.0f;
  float w[R][64];  // p times the row scale, for the block's rows (block_size <= 64 fused)
  scaled_weights<R>(tile, rows, rb, unit, p, ps, w);
  const auto weight = [&](int r, int j) { return w[r][j]; };
  const auto decode = [&](int c0) {
    return [=](int j, int pr, __m256* v) {
      for (int n = 0; n < 2; ++n) {
        const uint8_t* codes = tile + j * rb + 2 + c0 + 16 * pr + 8 * n;
        v[n] = kFp8 ? load8_e4m3_div256(codes) : load8_i8(codes);
      }
    };
  };
  constexpr int N = kAccVecs<R>;
  for (int c0 = 0; c0 < d; c0 += 8 * N) {
    int c[N];
    for (int n = 0; n < N; ++n) c[n] = c0 + 8 * n;
    if (c0 + 8 * N > d) {
      accum_vecs<R, 2>(rows, acc, c, decode(c0), weight);
      break;
    }
    accum_vecs<R, N>(rows, acc, c, decode(c0), weight);
  }
}

// int4_asym: acc += (p s) n per channel (bf16 weights, rows in int4_pair_order), plus sum_j p z
// once per group.
template <int R>
void int4_accum(int d, int G, const uint8_t* tile, int rows, const float* p, int ps,
                float* const* acc) {
  const int half = G / 2, ng = d / G;
  const size_t gb = kv::group_bytes_int4(G), rb = kv::row_bytes_int4(d, G);
  float w[R][64];
  for (int b = 0; b < ng; ++b) {
    int4_group_weights<R>(tile, rows, rb, gb, b, G, p, ps, acc, w);
    // N / 2 x 8 bytes of nibbles per pass: channels k.. (low nibbles) and half + k.. (high).
    constexpr int N = kAccVecs<R>;
    const auto weight = [&](int r, int j) { return w[r][j]; };
    int k = 0;
    for (; k + 4 * N <= half; k += 4 * N) {
      int c[N];
      for (int n = 0; n < N / 2; ++n) {
        c[2 * n] = b * G + k + 8 * n;
        c[2 * n + 1] = b * G + half + k + 8 * n;
      }
      accum_vecs<R, N, true>(
          rows, acc, c,
          [&](int j, int pr, __m256* v) {
            load8_nibbles(tile + j * rb + b * gb + 4 + k + 8 * pr, v, v + 1);
          },
          weight);
    }
    for (; k < half; k += 8) {
      const int c[2] = {b * G + k, b * G + half + k};
      accum_vecs<R, 2, true>(
          rows, acc, c,
          [&](int j, int, __m256* v) { load8_nibbles(tile + j * rb + b * gb + 4 + k, v, v + 1); },
          weight);
    }
  }
}

// int4_channel V (not a configured regime, kept for completeness): acc_c += scale_c *
// sum_j p n + zero_c * sum_j p.
template <int R>
void chan_accum(int d, const uint8_t* tile, int rows, const float* p, int ps, float* const* acc) {
  const int half = d / 2;
  alignas(32) float tmp[R][kMaxHeadDim];
  float* t[R];
  float psum[R] = {};
  BIE_UNROLL
  for (int r = 0; r < R; ++r) {
    t[r] = tmp[r];
    std::memset(tmp[r], 0, sizeof(float) * static_cast<size_t>(d));
    for (int j = 0; j < rows; ++j) psum[r] += p[r * ps + j];
  }
  for (int k = 0; k < half; k += 8) {
    const int c[2] = {k, half + k};
    accum_vecs<R, 2>(
        rows, t, c,
        [&](int j, int, __m256* v) {
          load8_nibbles(tile + kv::chan_row_offset(d, j) + k, v, v + 1);
        },
        [&](int r, int j) { return p[r * ps + j]; });
  }
  for (int c = 0; c < d; c += 8) {
    __m256 sc, zc;
    load8_params(tile + 4 * c, &sc, &zc);
    BIE_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m256 base = _mm256_fmadd_ps(zc, _mm256_set1_ps(psum[r]), _mm256_loadu_ps(acc[r] + c));
      _mm256_storeu_ps(acc[r] + c, _mm256_fmadd_ps(sc, _mm256_load_ps(tmp[r] + c), base));
    }
  }
}

template <int R>
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
      return int4_accum<R>(d, bv.gv.group, tile, rows, p, ps, acc);
    case KvType::kInt4Channel:
      return chan_accum<R>(d, tile, rows, p, ps, acc);
    case KvType::kInt8Channel:  // a key format (resolve_kv_layout refuses it for V): reference
      return detail::generic_kernels().accum(bv, tile, rows, p, ps, acc, R);
    default:
      assert(false);
  }
}

void avx2_score(const PagedBlockView& bv, const uint8_t* tile, int rows, const float* const* q,
                int n_rows, float* s, int ss) {
  if (!fused_ok(bv.gk, rows)) {
    return detail::generic_kernels().score(bv, tile, rows, q, n_rows, s, ss);
  }
  for_fused_rows(n_rows, [&](int r0, auto rt) {
    score_r<decltype(rt)::value>(bv, tile, rows, q + r0, s + r0 * ss, ss);
  });
}

void avx2_accum(const PagedBlockView& bv, const uint8_t* tile, int rows, const float* p, int ps,
                float* const* acc, int n_rows) {
  if (!fused_ok(bv.gv, rows)) {
    return detail::generic_kernels().accum(bv, tile, rows, p, ps, acc, n_rows);
  }
  for_fused_rows(n_rows, [&](int r0, auto rt) {
    accum_r<decltype(rt)::value>(bv, tile, rows, p + r0 * ps, ps, acc + r0);
  });
}

// exp on 8 lanes (Cephes expf: range reduction by ln 2 in two parts, degree-5 polynomial,
// exponent by integer add); ~1 ulp on [-87, 88], 0 below.
inline __m256 exp8(__m256 x) {
  const __m256 lo_lim = _mm256_set1_ps(-87.33654f);
  const __m256 below = _mm256_cmp_ps(x, lo_lim, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo_lim), _mm256_set1_ps(88.3762626647949f));
  const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(fx), 23);
  y = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(y), e));
  return _mm256_andnot_ps(below, y);
}

// generic_update in 8 lanes (the caller adds the weights to l); the partial last vector is padded
// with -inf (exp8 gives 0).
void avx2_update(float* sr, int rows, int lim, float scale, float* m, float* l, float* acc, int d) {
  const int full = lim & ~7;
  const __m256 vs = _mm256_set1_ps(scale);
  __m256 vmax = _mm256_set1_ps(-INFINITY);
  for (int j = 0; j < full; j += 8) {
    const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(sr + j), vs);
    _mm256_storeu_ps(sr + j, x);
    vmax = _mm256_max_ps(vmax, x);
  }
  alignas(32) float tail[8];
  if (full < lim) {
    for (int t = 0; t < 8; ++t) tail[t] = full + t < lim ? sr[full + t] * scale : -INFINITY;
    vmax = _mm256_max_ps(vmax, _mm256_load_ps(tail));
  }
  const float m_old = *m;
  const float m_new = std::max(m_old, simd::hmax(vmax));
  const __m256 vm = _mm256_set1_ps(m_new);
  for (int j = 0; j < full; j += 8) {
    _mm256_storeu_ps(sr + j, exp8(_mm256_sub_ps(_mm256_loadu_ps(sr + j), vm)));
  }
  if (full < lim) {
    _mm256_store_ps(tail, exp8(_mm256_sub_ps(_mm256_load_ps(tail), vm)));
    std::memcpy(sr + full, tail, sizeof(float) * static_cast<size_t>(lim - full));
  }
  for (int j = lim; j < rows; ++j) sr[j] = 0.0f;
  if (m_new > m_old) {  // rescale what was accumulated against the old max
    const float alpha = std::exp(m_old - m_new);  // 0 when m_old = -inf
    *l *= alpha;
    const __m256 va = _mm256_set1_ps(alpha);
    int c = 0;
    for (; c + 8 <= d; c += 8)
      _mm256_storeu_ps(acc + c, _mm256_mul_ps(_mm256_loadu_ps(acc + c), va));
    for (; c < d; ++c) acc[c] *= alpha;
  }
  *m = m_new;
}

// F16C's conversions round to nearest even, as quant::fp32_to_fp16 does.
void avx2_round_fp16(const float* x, int n, float* out) {
  int c = 0;
  for (; c + 8 <= n; c += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + c), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_ps(out + c, _mm256_cvtph_ps(h));
  }
  for (; c < n; ++c) out[c] = _cvtsh_ss(_cvtss_sh(x[c], _MM_FROUND_TO_NEAREST_INT));
}

// Eight rows at a time, one row per lane: 8x8 blocks of s transposed so that column j of the
// block is one vector, added in index order (the scalar loop's order for every row).
void avx2_add_row_sums(const float* s, int n_rows, int stride, int cols, float* l) {
  int r0 = 0;
  for (; r0 + 8 <= n_rows; r0 += 8) {
    __m256 sum = _mm256_setzero_ps();
    int j0 = 0;
    for (; j0 + 8 <= cols; j0 += 8) {
      __m256 v[8];
      for (int i = 0; i < 8; ++i) v[i] = _mm256_loadu_ps(s + (r0 + i) * stride + j0);
      transpose8_ps(v);
      for (int j = 0; j < 8; ++j) sum = _mm256_add_ps(sum, v[j]);
    }
    alignas(32) float part[8];
    _mm256_store_ps(part, sum);
    for (int i = 0; i < 8; ++i) {
      const float* row = s + (r0 + i) * stride;
      for (int j = j0; j < cols; ++j) part[i] += row[j];
      l[r0 + i] += part[i];
    }
  }
  for (; r0 < n_rows; ++r0) {
    float sum = 0.0f;
    for (int j = 0; j < cols; ++j) sum += s[r0 * stride + j];
    l[r0] += sum;
  }
}

}  // namespace

void f16_dot_dense_order_avx2(int head_dim, const float* q, const uint8_t* tile, int n,
                              float* scores) {
  for (int j = 0; j < n; ++j) {
    const auto* kr = reinterpret_cast<const uint16_t*>(tile) + static_cast<size_t>(j) * head_dim;
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < head_dim; i += 8) {
      const __m256 kf = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kr + i)));
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), kf, acc);
    }
    scores[j] = hsum(acc);
  }
}

namespace detail {
TileKernels avx2_kernels() {
  return TileKernels{avx2_score, avx2_accum, avx2_update, avx2_round_fp16, avx2_add_row_sums};
}
}  // namespace detail

}  // namespace bie::attention
