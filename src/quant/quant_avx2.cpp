// AVX2+FMA+F16C kernels. Compiled with -mavx2 -mfma -mf16c (CMake: *_avx2.cpp); only reached
// through avx2_table(), which traits_avx2() hands out after a run-time CPU check.
// Each function has its scalar twin in quant_scalar.cpp; tests hold them to it.
#include <immintrin.h>

#include <array>
#include <cstring>

#include "bie/quant/fp16.h"
#include "quant/quant_avx2_inl.h"
#include "quant/quant_internal.h"

namespace bie::quant {

namespace {

using namespace simd;  // NOLINT: shared AVX2 helpers

// ---- F32 / F16 / BF16 ----------------------------------------------------------------------

void to_float_f16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  }
  for (; i < n; ++i) dst[i] = _cvtsh_ss(h[i]);
}

void from_float_f16(const float* src, void* dst, int64_t n) {
  auto* h = static_cast<uint16_t*>(dst);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) h[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

inline __m256 load_bf16x8(const uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

void to_float_bf16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_bf16x8(h + i));
  for (; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
}

void from_float_bf16(const float* src, void* dst, int64_t n) {
  auto* h = static_cast<uint16_t*>(dst);
  int64_t i = 0;
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000);
  for (; i + 16 <= n; i += 16) {
    __m256i r[2];
    for (int k = 0; k < 2; ++k) {
      const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(src + i + 8 * k));
      const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
      const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
      const __m256i rounded = _mm256_srli_epi32(
          _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb)), 16);
      const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(64));
      r[k] = _mm256_blendv_epi8(rounded, nan, is_nan);
    }
    const __m256i packed =
        _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), _MM_SHUFFLE(3, 1, 2, 0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(h + i), packed);
  }
  for (; i < n; ++i) h[i] = fp32_to_bf16(src[i]);
}

float vec_dot_f32(int64_t n, const void* vx, const void* vy) {
  const auto* x = static_cast<const float*>(vx);
  const auto* y = static_cast<const float*>(vy);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) {
      acc[k] =
          _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8 * k), _mm256_loadu_ps(y + i + 8 * k), acc[k]);
    }
  }
  for (; i + 8 <= n; i += 8)
    acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc[0]);
  float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) s += x[i] * y[i];
  return s;
}

inline __m256 load_f16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

float vec_dot_f16(int64_t n, const void* vx, const void* vy) {
  const auto* x = static_cast<const uint16_t*>(vx);
  const auto* y = static_cast<const uint16_t*>(vy);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) {
      acc[k] = _mm256_fmadd_ps(load_f16x8(x + i + 8 * k), load_f16x8(y + i + 8 * k), acc[k]);
    }
  }
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(load_f16x8(x + i), load_f16x8(y + i), acc[0]);
  float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) s += _cvtsh_ss(x[i]) * _cvtsh_ss(y[i]);
  return s;
}

float vec_dot_bf16(int64_t n, const void* vx, const void* vy) {
  const auto* x = static_cast<const uint16_t*>(vx);
  const auto* y = static_cast<const uint16_t*>(vy);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) {
      acc[k] = _mm256_fmadd_ps(load_bf16x8(x + i + 8 * k), load_bf16x8(y + i + 8 * k), acc[k]);
    }
  }
  for (; i + 8 <= n; i += 8)
    acc[0] = _mm256_fmadd_ps(load_bf16x8(x + i), load_bf16x8(y + i), acc[0]);
  float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) s += bf16_to_fp32(x[i]) * bf16_to_fp32(y[i]);
  return s;
}

// ---- legacy 32-value blocks ----------------------------------------------------------------

// Q5 high bits: Q5_0 wants q - 16 as int8 (OR 0xF0 where the bit is clear), Q5_1 wants q.
inline __m256i q5_0_values(const BlockQ5_0& b) {
  const __m256i hi =
      _mm256_andnot_si256(bits32_to_mask(b.qh), _mm256_set1_epi8(static_cast<char>(0xF0)));
  return _mm256_or_si256(nibbles32(b.qs), hi);
}
inline __m256i q5_1_values(const BlockQ5_1& b) {
  const __m256i hi = _mm256_and_si256(bits32_to_mask(b.qh), _mm256_set1_epi8(0x10));
  return _mm256_or_si256(nibbles32(b.qs), hi);
}

void to_float_q4_0(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ4_0*>(src);
  for (int64_t i = 0; i < n / kQK32; ++i, y += kQK32) {
    const __m256i q = _mm256_sub_epi8(nibbles32(b[i].qs), _mm256_set1_epi8(8));
    store_scaled_i8(q, _mm256_set1_ps(h2f(b[i].d)), y);
  }
}
void to_float_q4_1(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ4_1*>(src);
  for (int64_t i = 0; i < n / kQK32; ++i, y += kQK32) {
    store_scaled_u8_add(nibbles32(b[i].qs), _mm256_set1_ps(h2f(b[i].d)),
                        _mm256_set1_ps(h2f(b[i].m)), y);
  }
}
void to_float_q5_0(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ5_0*>(src);
  for (int64_t i = 0; i < n / kQK32; ++i, y += kQK32)
    store_scaled_i8(q5_0_values(b[i]), _mm256_set1_ps(h2f(b[i].d)), y);
}
void to_float_q5_1(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ5_1*>(src);
  for (int64_t i = 0; i < n / kQK32; ++i, y += kQK32) {
    store_scaled_u8_add(q5_1_values(b[i]), _mm256_set1_ps(h2f(b[i].d)), _mm256_set1_ps(h2f(b[i].m)),
                        y);
  }
}
template <typename Block>
void to_float_q8(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const Block*>(src);
  for (int64_t i = 0; i < n / kQK32; ++i, y += kQK32) {
    store_scaled_i8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qs)),
                    _mm256_set1_ps(h2f(b[i].d)), y);
  }
}

// Q8_0/Q8_1 quantiser, identical in its bytes to the scalar one (same d, id, ties-to-even).
template <typename Block, bool kWithSum>
void from_float_q8(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<Block*>(dst);
  for (int64_t i = 0; i < n / kQK32; ++i, x += kQK32) {
    int32_t sum;
    const float d = quantize_q8_block(x, b[i].qs, &sum);
    b[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    if constexpr (kWithSum) {
      b[i].s = _cvtss_sh(d * static_cast<float>(sum), _MM_FROUND_TO_NEAREST_INT);
    }
  }
}

// Two blocks per iteration with independent accumulators: a single FMA chain (4-cycle latency
// per block) was the limit, not the arithmetic.
template <typename BX, typename BY, typename F>
inline float dot_blocks(int64_t nb, const BX* x, const BY* y, F&& block_dot) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    acc0 = block_dot(x[i], y[i], acc0);
    acc1 = block_dot(x[i + 1], y[i + 1], acc1);
  }
  if (i < nb) acc0 = block_dot(x[i], y[i], acc0);
  return hsum_ps(_mm256_add_ps(acc0, acc1));
}

template <typename BX, typename BY>
inline float min_terms(int64_t nb, const BX* x, const BY* y) {
  float s0 = 0, s1 = 0;
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    s0 += h2f(x[i].m) * h2f(y[i].s);
    s1 += h2f(x[i + 1].m) * h2f(y[i + 1].s);
  }
  if (i < nb) s0 += h2f(x[i].m) * h2f(y[i].s);
  return s0 + s1;
}

inline __m256i load_qs(const int8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

float vec_dot_q4_0(int64_t n, const void* vx, const void* vy) {
  return dot_blocks(n / kQK32, static_cast<const BlockQ4_0*>(vx), static_cast<const BlockQ8_0*>(vy),
                    [](const BlockQ4_0& x, const BlockQ8_0& y, __m256 acc) {
                      const __m256 d = _mm256_set1_ps(h2f(x.d) * h2f(y.d));
                      const __m256i qx = _mm256_sub_epi8(nibbles32(x.qs), _mm256_set1_epi8(8));
                      return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8(qx, load_qs(y.qs))), acc);
                    });
}

float vec_dot_q4_1(int64_t n, const void* vx, const void* vy) {
  const auto* x = static_cast<const BlockQ4_1*>(vx);
  const auto* y = static_cast<const BlockQ8_1*>(vy);
  const float main =
      dot_blocks(n / kQK32, x, y, [](const BlockQ4_1& bx, const BlockQ8_1& by, __m256 acc) {
        const __m256 d = _mm256_set1_ps(h2f(bx.d) * h2f(by.d));
        return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_u8i8(nibbles32(bx.qs), load_qs(by.qs))),
                               acc);
      });
  return main + min_terms(n / kQK32, x, y);
}

float vec_dot_q5_0(int64_t n, const void* vx, const void* vy) {
  return dot_blocks(n / kQK32, static_cast<const BlockQ5_0*>(vx), static_cast<const BlockQ8_0*>(vy),
                    [](const BlockQ5_0& x, const BlockQ8_0& y, __m256 acc) {
                      const __m256 d = _mm256_set1_ps(h2f(x.d) * h2f(y.d));
                      return _mm256_fmadd_ps(
                          d, _mm256_cvtepi32_ps(dot_i8(q5_0_values(x), load_qs(y.qs))), acc);
                    });
}

float vec_dot_q5_1(int64_t n, const void* vx, const void* vy) {
  const auto* x = static_cast<const BlockQ5_1*>(vx);
  const auto* y = static_cast<const BlockQ8_1*>(vy);
  const float main =
      dot_blocks(n / kQK32, x, y, [](const BlockQ5_1& bx, const BlockQ8_1& by, __m256 acc) {
        const __m256 d = _mm256_set1_ps(h2f(bx.d) * h2f(by.d));
        return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_u8i8(q5_1_values(bx), load_qs(by.qs))),
                               acc);
      });
  return main + min_terms(n / kQK32, x, y);
}

float vec_dot_q8_0(int64_t n, const void* vx, const void* vy) {
  return dot_blocks(n / kQK32, static_cast<const BlockQ8_0*>(vx), static_cast<const BlockQ8_0*>(vy),
                    [](const BlockQ8_0& x, const BlockQ8_0& y, __m256 acc) {
                      const __m256 d = _mm256_set1_ps(h2f(x.d) * h2f(y.d));
                      return _mm256_fmadd_ps(
                          d, _mm256_cvtepi32_ps(dot_i8(load_qs(x.qs), load_qs(y.qs))), acc);
                    });
}

// ---- K-quants ------------------------------------------------------------------------------

// Dequantise with the scalar twin's evaluation order: (d*sc)*q - dmin*m, or (d*sc)*(q - zero).
template <typename U>
void to_float_k(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const typename U::Block*>(src);
  KRegs r;
  for (int64_t i = 0; i < n / kQKK; ++i, y += kQKK) {
    U::run(b[i], r);
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      const __m128i halves[2] = {_mm256_castsi256_si128(r.q[c]),
                                 _mm256_extracti128_si256(r.q[c], 1)};
#pragma GCC unroll 8
      for (int h = 0; h < 2; ++h) {
        const int g = 2 * c + h;
        const __m256 dl = _mm256_set1_ps(r.d * static_cast<float>(r.sc[g]));
        const __m256 ml = _mm256_set1_ps(r.dmin * static_cast<float>(r.m[g]));
#pragma GCC unroll 8
        for (int k = 0; k < 2; ++k) {
          __m256i qi = _mm256_cvtepu8_epi32(k == 0 ? halves[h] : _mm_srli_si128(halves[h], 8));
          float* out = y + 32 * c + 16 * h + 8 * k;
          if constexpr (U::kSym) {
            qi = _mm256_sub_epi32(qi, _mm256_set1_epi32(U::kZero));
            _mm256_storeu_ps(out, _mm256_mul_ps(dl, _mm256_cvtepi32_ps(qi)));
          } else {
            _mm256_storeu_ps(out, _mm256_sub_ps(_mm256_mul_ps(dl, _mm256_cvtepi32_ps(qi)), ml));
          }
        }
      }
    }
  }
}

template <typename U>
float vec_dot_k(int64_t n, const void* vx, const void* vy) {
  const auto* x = static_cast<const typename U::Block*>(vx);
  const auto* y = static_cast<const BlockQ8_K*>(vy);
  // Byte shuffle that spreads int16 pair (a, b) of a broadcast dword: a to the low 128 bits, b
  // to the high 128 bits.
  const __m256i spread = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2,
                                          3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  __m256 acc = _mm256_setzero_ps();
  KRegs r;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    U::run(x[i], r);
    const __m256i sc = _mm256_load_si256(reinterpret_cast<const __m256i*>(r.sc));
    __m256i isum = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      const __m256i scv =
          _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(sc, _mm256_set1_epi32(c)), spread);
      const __m256i p =
          _mm256_maddubs_epi16(r.q[c], load32(reinterpret_cast<const uint8_t*>(y[i].qs) + 32 * c));
      isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scv));
    }
    const __m256i msum =
        _mm256_madd_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(r.m)),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].bsums)));
    const __m256 dd = _mm256_set1_ps(r.d * y[i].d);
    if constexpr (U::kSym) {
      acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(_mm256_sub_epi32(isum, msum)), acc);
    } else {
      acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(isum), acc);
      acc = _mm256_fnmadd_ps(_mm256_set1_ps(r.dmin * y[i].d), _mm256_cvtepi32_ps(msum), acc);
    }
  }
  return hsum_ps(acc);
}

// Q8_K quantiser, byte-identical to the scalar one.
void from_float_q8_k(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_K*>(dst);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    __m256 amax = _mm256_setzero_ps();
    for (int k = 0; k < kQKK; k += 8)
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)));
    __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(amax, 1), _mm256_castps256_ps128(amax));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float am = _mm_cvtss_f32(m4);
    if (am == 0) {
      std::memset(&b[i], 0, sizeof(BlockQ8_K));
      continue;
    }
    // The signed value of largest magnitude, first occurrence (as the scalar loop picks it).
    float max = 0;
    const __m256 amv = _mm256_set1_ps(am);
    for (int k = 0; k < kQKK; k += 8) {
      const int mask = _mm256_movemask_ps(
          _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)), amv, _CMP_EQ_OQ));
      if (mask) {
        max = x[k + __builtin_ctz(static_cast<unsigned>(mask))];
        break;
      }
    }
    const float iscale = -127.f / max;
    const __m256 is = _mm256_set1_ps(iscale);
    const __m256i lim = _mm256_set1_epi32(127);
    for (int k = 0; k < kQKK; k += 32) {
      __m256i q[4];
      for (int j = 0; j < 4; ++j) {
        q[j] = _mm256_min_epi32(
            _mm256_cvtps_epi32(_mm256_mul_ps(is, _mm256_loadu_ps(x + k + 8 * j))), lim);
      }
      b[i].bsums[k / 16] = static_cast<int16_t>(hsum_epi32(_mm256_add_epi32(q[0], q[1])));
      b[i].bsums[k / 16 + 1] = static_cast<int16_t>(hsum_epi32(_mm256_add_epi32(q[2], q[3])));
      const __m256i p = _mm256_permutevar8x32_epi32(
          _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])),
          _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(b[i].qs + k), p);
    }
    b[i].d = 1 / iscale;
  }
}

void to_float_q8_k(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ8_K*>(src);
  for (int64_t i = 0; i < n / kQKK; ++i, y += kQKK) {
    const __m256 d = _mm256_set1_ps(b[i].d);
    for (int k = 0; k < kQKK; k += 32)
      store_scaled_i8(load32(reinterpret_cast<const uint8_t*>(b[i].qs) + k), d, y + k);
  }
}

}  // namespace

const TypeTraits* avx2_table() {
  static const auto table = [] {
    std::array<TypeTraits, kGgmlTypeIdLimit> t{};
    std::memcpy(t.data(), scalar_table(), sizeof(TypeTraits) * kGgmlTypeIdLimit);
    auto at = [&](GgmlType g) -> TypeTraits& { return t[static_cast<size_t>(g)]; };
    using G = GgmlType;
    // F32 to_float/from_float are memcpy in both tables.
    at(G::F32).vec_dot = vec_dot_f32;
    at(G::F16) = {G::F16, "f16", 1, 2, false, to_float_f16, from_float_f16, vec_dot_f16, G::F16};
    at(G::BF16) = {G::BF16,         "bf16",       1,      2, false, to_float_bf16,
                   from_float_bf16, vec_dot_bf16, G::BF16};
    at(G::Q4_0).to_float = to_float_q4_0;
    at(G::Q4_0).vec_dot = vec_dot_q4_0;
    at(G::Q4_1).to_float = to_float_q4_1;
    at(G::Q4_1).vec_dot = vec_dot_q4_1;
    at(G::Q5_0).to_float = to_float_q5_0;
    at(G::Q5_0).vec_dot = vec_dot_q5_0;
    at(G::Q5_1).to_float = to_float_q5_1;
    at(G::Q5_1).vec_dot = vec_dot_q5_1;
    at(G::Q8_0).to_float = to_float_q8<BlockQ8_0>;
    at(G::Q8_0).from_float = from_float_q8<BlockQ8_0, false>;
    at(G::Q8_0).vec_dot = vec_dot_q8_0;
    at(G::Q8_1).to_float = to_float_q8<BlockQ8_1>;
    at(G::Q8_1).from_float = from_float_q8<BlockQ8_1, true>;
    at(G::Q2_K).to_float = to_float_k<UnpackQ2K>;
    at(G::Q2_K).vec_dot = vec_dot_k<UnpackQ2K>;
    at(G::Q3_K).to_float = to_float_k<UnpackQ3K>;
    at(G::Q3_K).vec_dot = vec_dot_k<UnpackQ3K>;
    at(G::Q4_K).to_float = to_float_k<UnpackQ4K>;
    at(G::Q4_K).vec_dot = vec_dot_k<UnpackQ4K>;
    at(G::Q5_K).to_float = to_float_k<UnpackQ5K>;
    at(G::Q5_K).vec_dot = vec_dot_k<UnpackQ5K>;
    at(G::Q6_K).to_float = to_float_k<UnpackQ6K>;
    at(G::Q6_K).vec_dot = vec_dot_k<UnpackQ6K>;
    at(G::Q8_K).to_float = to_float_q8_k;
    at(G::Q8_K).from_float = from_float_q8_k;
    return t;
  }();
  return table.data();
}

}  // namespace bie::quant
