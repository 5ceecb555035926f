// AVX2+FMA+F16C kernels of the KV storage formats. Dequantisation happens in registers: codes are
// widened to fp32 lanes and fed straight into FMAs; no dequantised row is written anywhere.
// dot keeps one accumulator per row and folds per-group scales into it; axpy keeps a 32-channel
// slice of acc in registers across all rows of the run. Layouts the vector loops do not cover
// (head_dim not a multiple of 8, or 32 for int4_channel) go to the scalar twin. Stores of fp8,
// int4_asym and int4_channel, and all loads, reuse the scalar code (off the attention hot path).
// note: everything here runs only after has_avx2() (kv_traits_avx2).
#include <immintrin.h>

#include <cassert>
#include <cstring>

#include "bie/common/simd_avx2.h"
#include "backend/cpu/kv_format_internal.h"

namespace bie::kv::detail {

namespace {

using planner::KvType;

using simd::hsum;

// 8 fp16 -> 8 fp32.
inline __m256 load8_f16(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// 8 e4m3 codes -> 8 fp32 values / 256 (the exponent bias difference; callers fold 256 into the
// row scale). Same bit identity as e4m3_to_fp32.
inline __m256 load8_e4m3_div256(const uint8_t* p) {
  const __m128i c = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(c, _mm_set1_epi16(0x80)), 8),
                                 _mm_slli_epi16(_mm_and_si128(c, _mm_set1_epi16(0x7F)), 7));
  return _mm256_cvtph_ps(h);
}
// 8 uint8 codes -> 8 fp32.
inline __m256 load8_u8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
// 8 int8 codes -> 8 fp32.
inline __m256 load8_i8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// 16 bytes of nibbles -> the 16 low nibbles and the 16 high nibbles as 4 x 8 fp32:
// out[0], out[1] = low nibbles of bytes 0..7, 8..15; out[2], out[3] = high nibbles.
inline void load16_nibbles(const uint8_t* p, __m256 out[4]) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i m = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(b, m);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
  out[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
  out[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
  out[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
  out[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
}

// One fp16 scalar via F16C (the portable load_fp16 is a branchy software conversion).
inline float f16c(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return _cvtsh_ss(h);
}

// Interleaved (scale, zero) fp16 pairs of 8 consecutive channels -> 8 scales and 8 zeros.
inline void load8_params(const uint8_t* p, __m256* scale, __m256* zero) {
  const __m256 a =
      _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));  // s0 z0 .. s3 z3
  const __m256 b =
      _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));  // s4 z4 .. s7 z7
  // Per 128-bit lane: s0 s1 s4 s5 | s2 s3 s6 s7; the 64-bit permute restores channel order.
  const __m256 s = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
  const __m256 z = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
  *scale = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(s), _MM_SHUFFLE(3, 1, 2, 0)));
  *zero = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(z), _MM_SHUFFLE(3, 1, 2, 0)));
}

const KvFormatTraits& scalar_of(KvType t) {
  return *kv_traits_scalar(t);
}

// ---- f16 -----------------------------------------------------------------------------------

void f16_store(const KvRowGeom& g, const float* x, void* tile, int t0, int n) {
  if (g.head_dim % 8 != 0) return scalar_of(KvType::kF16).store(g, x, tile, t0, n);
  auto* dst = static_cast<uint8_t*>(tile) + static_cast<size_t>(t0) * row_bytes_f16(g.head_dim);
  for (int64_t i = 0; i < static_cast<int64_t>(n) * g.head_dim; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  }
}

void f16_dot(const KvRowGeom& g, const float* q, const void* tile, int t0, int n, float* scores) {
  const int d = g.head_dim;
  if (d % 8 != 0) return scalar_of(KvType::kF16).dot(g, q, tile, t0, n, scores);
  for (int j = 0; j < n; ++j) {
    const auto* row =
        static_cast<const uint8_t*>(tile) + static_cast<size_t>(t0 + j) * row_bytes_f16(d);
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= d; i += 16) {
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8_f16(row + 2 * i), a0);
      a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), load8_f16(row + 2 * i + 16), a1);
    }
    if (i < d) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8_f16(row + 2 * i), a0);
    scores[j] = hsum(_mm256_add_ps(a0, a1));
  }
}

// acc[c0, c0 + 8 * W) += sum_j w(j) * decode8(row(j) + byte offset of channel c0 + 8k), k < W.
// `weight(j)` gives the row's multiplier, `decode(row, c)` 8 channels from c.
template <int W, class Row, class Weight, class Decode>
inline void axpy_slice(int n, int c0, float* acc, Row row, Weight weight, Decode decode) {
  __m256 a[W];
  for (int k = 0; k < W; ++k) a[k] = _mm256_loadu_ps(acc + c0 + 8 * k);
  for (int j = 0; j < n; ++j) {
    const uint8_t* r = row(j);
    const __m256 w = _mm256_set1_ps(weight(j, r));
    for (int k = 0; k < W; ++k) a[k] = _mm256_fmadd_ps(w, decode(r, c0 + 8 * k), a[k]);
  }
  for (int k = 0; k < W; ++k) _mm256_storeu_ps(acc + c0 + 8 * k, a[k]);
}

template <class Row, class Weight, class Decode>
inline void axpy_rows(int d, int n, float* acc, Row row, Weight weight, Decode decode) {
  int c = 0;
  for (; c + 32 <= d; c += 32) axpy_slice<4>(n, c, acc, row, weight, decode);
  for (; c + 8 <= d; c += 8) axpy_slice<1>(n, c, acc, row, weight, decode);
}

void f16_axpy(const KvRowGeom& g, const float* p, const void* tile, int t0, int n, float* acc) {
  const int d = g.head_dim;
  if (d % 8 != 0) return scalar_of(KvType::kF16).axpy(g, p, tile, t0, n, acc);
  const auto* base = static_cast<const uint8_t*>(tile) + static_cast<size_t>(t0) * row_bytes_f16(d);
  axpy_rows(
      d, n, acc, [&](int j) { return base + static_cast<size_t>(j) * row_bytes_f16(d); },
      [&](int j, const uint8_t*) { return p[j]; },
      [](const uint8_t* r, int c) { return load8_f16(r + 2 * c); });
}

// ---- fp8 e4m3 / int8 -----------------------------------------------------------------------

void int8_store(const KvRowGeom& g, const float* x, void* tile, int t0, int n) {
  const int d = g.head_dim;
  if (d % 8 != 0) return scalar_of(KvType::kInt8).store(g, x, tile, t0, n);
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  for (int j = 0; j < n; ++j) {
    const float* xr = x + static_cast<int64_t>(j) * d;
    auto* row = static_cast<uint8_t*>(tile) + static_cast<size_t>(t0 + j) * row_bytes_scaled(d);
    __m256 vmax = _mm256_setzero_ps();
    for (int i = 0; i < d; i += 8)
      vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign_mask, _mm256_loadu_ps(xr + i)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const uint16_t sh = quant::fp32_to_fp16(amax / 127.0f);
    store_fp16(row, sh);
    const float s = quant::fp16_to_fp32(sh);
    const __m256 inv = _mm256_set1_ps(s > 0.0f ? 1.0f / s : 0.0f);
    const __m256 lim = _mm256_set1_ps(127.0f), nlim = _mm256_set1_ps(-127.0f);
    for (int i = 0; i < d; i += 8) {
      __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i), inv),
                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      v = _mm256_min_ps(_mm256_max_ps(v, nlim), lim);
      const __m256i i32 = _mm256_cvtps_epi32(v);
      const __m128i i16 =
          _mm_packs_epi32(_mm256_castsi256_si128(i32), _mm256_extracti128_si256(i32, 1));
      const __m128i i8 = _mm_packs_epi16(i16, i16);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(row + 2 + i), i8);
    }
  }
}

template <bool kFp8>
void scaled_dot(const KvRowGeom& g, const float* q, const void* tile, int t0, int n,
                float* scores) {
  const int d = g.head_dim;
  constexpr KvType kType = kFp8 ? KvType::kFp8E4M3 : KvType::kInt8;
  if (d % 8 != 0) return scalar_of(kType).dot(g, q, tile, t0, n, scores);
  const float unit = kFp8 ? 256.0f : 1.0f;
  for (int j = 0; j < n; ++j) {
    const auto* row =
        static_cast<const uint8_t*>(tile) + static_cast<size_t>(t0 + j) * row_bytes_scaled(d);
    const uint8_t* codes = row + 2;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    auto dec = [&](int i) { return kFp8 ? load8_e4m3_div256(codes + i) : load8_i8(codes + i); };
    int i = 0;
    for (; i + 16 <= d; i += 16) {
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), dec(i), a0);
      a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), dec(i + 8), a1);
    }
    if (i < d) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), dec(i), a0);
    scores[j] = hsum(_mm256_add_ps(a0, a1)) * (f16c(row) * unit);
  }
}

template <bool kFp8>
void scaled_axpy(const KvRowGeom& g, const float* p, const void* tile, int t0, int n, float* acc) {
  const int d = g.head_dim;
  constexpr KvType kType = kFp8 ? KvType::kFp8E4M3 : KvType::kInt8;
  if (d % 8 != 0) return scalar_of(kType).axpy(g, p, tile, t0, n, acc);
  const float unit = kFp8 ? 256.0f : 1.0f;
  const auto* base =
      static_cast<const uint8_t*>(tile) + static_cast<size_t>(t0) * row_bytes_scaled(d);
  axpy_rows(
      d, n, acc, [&](int j) { return base + static_cast<size_t>(j) * row_bytes_scaled(d); },
      [&](int j, const uint8_t* r) { return p[j] * (f16c(r) * unit); },
      [](const uint8_t* r, int c) {
        return kFp8 ? load8_e4m3_div256(r + 2 + c) : load8_i8(r + 2 + c);
      });
}

// ---- int4_asym -----------------------------------------------------------------------------

constexpr int kMaxHeadDim = 4096;

void int4_dot(const KvRowGeom& g, const float* q, const void* tile, int t0, int n, float* scores) {
  const int d = g.head_dim, G = g.group, half = G / 2, n_groups = d / G;
  assert(G % 32 == 0 && d <= kMaxHeadDim);
  const size_t gb = group_bytes_int4(G), rb = row_bytes_int4(d, G);
  // sum(q) per group, shared by every row: sum q (s n + z) = s sum(q n) + z sum(q).
  float qsum[kMaxHeadDim / 32];
  for (int b = 0; b < n_groups; ++b) {
    __m256 s = _mm256_setzero_ps();
    for (int i = 0; i < G; i += 8) s = _mm256_add_ps(s, _mm256_loadu_ps(q + b * G + i));
    qsum[b] = hsum(s);
  }
  for (int j = 0; j < n; ++j) {
    const auto* row = static_cast<const uint8_t*>(tile) + static_cast<size_t>(t0 + j) * rb;
    __m256 total = _mm256_setzero_ps();
    float zterm = 0.0f;
    for (int b = 0; b < n_groups; ++b) {
      const uint8_t* grp = row + b * gb;
      const float* qg = q + b * G;
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
      for (int k = 0; k < half; k += 16) {
        __m256 nib[4];
        load16_nibbles(grp + 4 + k, nib);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qg + k), nib[0], a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qg + k + 8), nib[1], a1);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qg + half + k), nib[2], a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qg + half + k + 8), nib[3], a1);
      }
      total = _mm256_fmadd_ps(_mm256_add_ps(a0, a1), _mm256_set1_ps(f16c(grp)), total);
      zterm += f16c(grp + 2) * qsum[b];
    }
    scores[j] = hsum(total) + zterm;
  }
}

void int4_axpy(const KvRowGeom& g, const float* p, const void* tile, int t0, int n, float* acc) {
  const int d = g.head_dim, G = g.group, half = G / 2, n_groups = d / G;
  assert(G % 32 == 0);
  const size_t gb = group_bytes_int4(G), rb = row_bytes_int4(d, G);
  const auto* base = static_cast<const uint8_t*>(tile) + static_cast<size_t>(t0) * rb;
  for (int b = 0; b < n_groups; ++b) {
    float* ag = acc + b * G;
    // The zero-point term sum_j p_j z_j is the same for every channel of the group.
    float zterm = 0.0f;
    for (int j = 0; j < n; ++j) zterm += p[j] * f16c(base + j * rb + b * gb + 2);
    const __m256 vz = _mm256_set1_ps(zterm);
    for (int k = 0; k < half; k += 16) {
      // 32 channels: [k, k + 16) from low nibbles, [half + k, half + k + 16) from high ones.
      __m256 a0 = _mm256_add_ps(_mm256_loadu_ps(ag + k), vz);
      __m256 a1 = _mm256_add_ps(_mm256_loadu_ps(ag + k + 8), vz);
      __m256 a2 = _mm256_add_ps(_mm256_loadu_ps(ag + half + k), vz);
      __m256 a3 = _mm256_add_ps(_mm256_loadu_ps(ag + half + k + 8), vz);
      for (int j = 0; j < n; ++j) {
        const uint8_t* grp = base + j * rb + b * gb;
        const __m256 w = _mm256_set1_ps(p[j] * f16c(grp));
        __m256 nib[4];
        load16_nibbles(grp + 4 + k, nib);
        a0 = _mm256_fmadd_ps(w, nib[0], a0);
        a1 = _mm256_fmadd_ps(w, nib[1], a1);
        a2 = _mm256_fmadd_ps(w, nib[2], a2);
        a3 = _mm256_fmadd_ps(w, nib[3], a3);
      }
      _mm256_storeu_ps(ag + k, a0);
      _mm256_storeu_ps(ag + k + 8, a1);
      _mm256_storeu_ps(ag + half + k, a2);
      _mm256_storeu_ps(ag + half + k + 8, a3);
    }
  }
}

// ---- int4_channel --------------------------------------------------------------------------

void chan_dot(const KvRowGeom& g, const float* q, const void* tile, int t0, int n, float* scores) {
  const int d = g.head_dim, half = d / 2;
  if (d % 32 != 0 || d > kMaxHeadDim)
    return scalar_of(KvType::kInt4Channel).dot(g, q, tile, t0, n, scores);
  const auto* base = static_cast<const uint8_t*>(tile);
  // Per tile: fold the channel scales into the query (qs = q * scale) and the zero points into
  // one constant; each row is then a plain dot of qs with its nibbles.
  alignas(32) float qs[kMaxHeadDim];
  __m256 vz = _mm256_setzero_ps();
  for (int c = 0; c < d; c += 8) {
    __m256 sc, zc;
    load8_params(base + 4 * c, &sc, &zc);
    const __m256 qc = _mm256_loadu_ps(q + c);
    _mm256_store_ps(qs + c, _mm256_mul_ps(qc, sc));
    vz = _mm256_fmadd_ps(qc, zc, vz);
  }
  const float zterm = hsum(vz);
  for (int j = 0; j < n; ++j) {
    const uint8_t* row = base + chan_row_offset(d, t0 + j);
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (int k = 0; k < half; k += 16) {
      __m256 nib[4];
      load16_nibbles(row + k, nib);
      a0 = _mm256_fmadd_ps(_mm256_load_ps(qs + k), nib[0], a0);
      a1 = _mm256_fmadd_ps(_mm256_load_ps(qs + k + 8), nib[1], a1);
      a0 = _mm256_fmadd_ps(_mm256_load_ps(qs + half + k), nib[2], a0);
      a1 = _mm256_fmadd_ps(_mm256_load_ps(qs + half + k + 8), nib[3], a1);
    }
    scores[j] = hsum(_mm256_add_ps(a0, a1)) + zterm;
  }
}

void chan_axpy(const KvRowGeom& g, const float* p, const void* tile, int t0, int n, float* acc) {
  const int d = g.head_dim, half = d / 2;
  if (d % 32 != 0) return scalar_of(KvType::kInt4Channel).axpy(g, p, tile, t0, n, acc);
  const auto* base = static_cast<const uint8_t*>(tile);
  float psum = 0.0f;
  for (int j = 0; j < n; ++j) psum += p[j];
  // acc_c += scale_c * sum_j p_j n_jc + zero_c * sum_j p_j
  for (int k = 0; k < half; k += 16) {
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
    for (int j = 0; j < n; ++j) {
      const __m256 w = _mm256_set1_ps(p[j]);
      __m256 nib[4];
      load16_nibbles(base + chan_row_offset(d, t0 + j) + k, nib);
      for (int m = 0; m < 4; ++m) a[m] = _mm256_fmadd_ps(w, nib[m], a[m]);
    }
    const __m256 vp = _mm256_set1_ps(psum);
    for (int m = 0; m < 4; ++m) {
      const int c = (m < 2 ? k + 8 * m : half + k + 8 * (m - 2));
      __m256 sc, zc;
      load8_params(base + 4 * c, &sc, &zc);
      _mm256_storeu_ps(
          acc + c, _mm256_fmadd_ps(sc, a[m], _mm256_fmadd_ps(zc, vp, _mm256_loadu_ps(acc + c))));
    }
  }
}

// ---- int8_channel --------------------------------------------------------------------------

void chan8_dot(const KvRowGeom& g, const float* q, const void* tile, int t0, int n, float* scores) {
  const int d = g.head_dim;
  if (d % 16 != 0 || d > kMaxHeadDim)
    return scalar_of(KvType::kInt8Channel).dot(g, q, tile, t0, n, scores);
  const auto* base = static_cast<const uint8_t*>(tile);
  // As int4_channel: qs = q * scale per channel, the zero points folded into one constant.
  alignas(32) float qs[kMaxHeadDim];
  __m256 vz = _mm256_setzero_ps();
  for (int c = 0; c < d; c += 8) {
    __m256 sc, zc;
    load8_params(base + 4 * c, &sc, &zc);
    const __m256 qc = _mm256_loadu_ps(q + c);
    _mm256_store_ps(qs + c, _mm256_mul_ps(qc, sc));
    vz = _mm256_fmadd_ps(qc, zc, vz);
  }
  const float zterm = hsum(vz);
  for (int j = 0; j < n; ++j) {
    const uint8_t* row = base + chan8_row_offset(d, t0 + j);
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (int c = 0; c < d; c += 16) {
      a0 = _mm256_fmadd_ps(_mm256_load_ps(qs + c), load8_u8(row + c), a0);
      a1 = _mm256_fmadd_ps(_mm256_load_ps(qs + c + 8), load8_u8(row + c + 8), a1);
    }
    scores[j] = hsum(_mm256_add_ps(a0, a1)) + zterm;
  }
}

void chan8_axpy(const KvRowGeom& g, const float* p, const void* tile, int t0, int n, float* acc) {
  const int d = g.head_dim;
  if (d % 32 != 0) return scalar_of(KvType::kInt8Channel).axpy(g, p, tile, t0, n, acc);
  const auto* base = static_cast<const uint8_t*>(tile);
  float psum = 0.0f;
  for (int j = 0; j < n; ++j) psum += p[j];
  const __m256 vp = _mm256_set1_ps(psum);
  // acc_c += scale_c * sum_j p_j n_jc + zero_c * sum_j p_j, 32 channels at a time.
  for (int c0 = 0; c0 < d; c0 += 32) {
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
    for (int j = 0; j < n; ++j) {
      const __m256 w = _mm256_set1_ps(p[j]);
      const uint8_t* row = base + chan8_row_offset(d, t0 + j) + c0;
      for (int m = 0; m < 4; ++m) a[m] = _mm256_fmadd_ps(w, load8_u8(row + 8 * m), a[m]);
    }
    for (int m = 0; m < 4; ++m) {
      const int c = c0 + 8 * m;
      __m256 sc, zc;
      load8_params(base + 4 * c, &sc, &zc);
      _mm256_storeu_ps(
          acc + c, _mm256_fmadd_ps(sc, a[m], _mm256_fmadd_ps(zc, vp, _mm256_loadu_ps(acc + c))));
    }
  }
}

}  // namespace

const KvFormatTraits* kv_traits_avx2_table(KvType type) {
  static const KvFormatTraits kTable[] = {
      {KvType::kF16, f16_store, scalar_of(KvType::kF16).load, f16_dot, f16_axpy},
      {KvType::kFp8E4M3, scalar_of(KvType::kFp8E4M3).store, scalar_of(KvType::kFp8E4M3).load,
       scaled_dot<true>, scaled_axpy<true>},
      {KvType::kInt8, int8_store, scalar_of(KvType::kInt8).load, scaled_dot<false>,
       scaled_axpy<false>},
      {KvType::kInt4Asym, scalar_of(KvType::kInt4Asym).store, scalar_of(KvType::kInt4Asym).load,
       int4_dot, int4_axpy},
      {KvType::kInt4Channel, scalar_of(KvType::kInt4Channel).store,
       scalar_of(KvType::kInt4Channel).load, chan_dot, chan_axpy},
      {KvType::kInt8Channel, scalar_of(KvType::kInt8Channel).store,
       scalar_of(KvType::kInt8Channel).load, chan8_dot, chan8_axpy},
  };
  for (const KvFormatTraits& t : kTable) {
    if (t.type == type) return &t;
  }
  return nullptr;
}

}  // namespace bie::kv::detail
