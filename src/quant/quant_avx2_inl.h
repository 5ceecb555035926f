// AVX2 helpers shared by src/quant/quant_avx2.cpp and src/backend/cpu/matmul_avx2.cpp.
// note: include only from *_avx2.cpp / *_avx512.cpp files (compiled with -mavx2 -mfma -mf16c and
// more).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "bie/common/simd_avx2.h"
#include "bie/quant/blocks.h"
#include "quant/quant_internal.h"

namespace bie::quant::simd {
inline namespace BIE_SIMD_ISA {  // one copy per ISA's files (bie/common/simd_avx2.h)

inline float h2f(half_bits h) {
  return _cvtsh_ss(h);
}

inline float hsum_ps(__m256 v) {
  return bie::simd::hsum(v);
}

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// 16 bytes of nibbles -> 32 bytes: low nibbles (values 0..15) then high nibbles (16..31).
inline __m256i nibbles32(const uint8_t* p) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
  return _mm256_and_si256(b, _mm256_set1_epi8(0x0F));
}

// 32 bits -> 32 bytes, 0xFF where the bit is set (byte j <- bit j).
inline __m256i bits32_to_mask(const uint8_t* p) {
  uint32_t x;
  std::memcpy(&x, p, 4);
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101,
                                         0x0000000000000000);
  __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int32_t>(x)), shuf);
  b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7FBFDFEFF7FBFDFE));
  return _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1));
}

// One block of 32 floats -> int8 qs (Q8_0/Q8_1 rounding: ties to even); returns the unrounded
// scale d = amax / 127 and writes the exact sum of qs. Shared by every Q8 activation quantiser
// so that they produce the same bytes.
inline float quantize_q8_block(const float* x, int8_t* qs, int32_t* sum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps();
  for (int k = 0; k < 4; ++k) {
    v[k] = _mm256_loadu_ps(x + 8 * k);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[k]));
  }
  __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(amax, 1), _mm256_castps256_ps128(amax));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float am = _mm_cvtss_f32(m4);
  const float id = am != 0 ? 127.f / am : 0.0f;
  __m256i q[4];
  for (int k = 0; k < 4; ++k) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], _mm256_set1_ps(id)));
  *sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
  const __m256i p = _mm256_permutevar8x32_epi32(
      _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])),
      _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs), p);
  return am / 127.f;
}

inline float round_fp16(float f) {
  return _cvtsh_ss(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}

// Signed int8 x int8 -> 8 int32 partial sums (4 products each).
inline __m256i dot_i8(__m256i x, __m256i y) {
  const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}
// Unsigned x signed int8 -> 8 int32.
inline __m256i dot_u8i8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// 32 int8 (as 4 x 8 int32 after widening) -> floats, times d: writes 32 floats.
inline void store_scaled_i8(__m256i q, __m256 d, float* y) {
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  _mm256_storeu_ps(y + 0, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), d));
  _mm256_storeu_ps(
      y + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), d));
  _mm256_storeu_ps(y + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), d));
  _mm256_storeu_ps(
      y + 24, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), d));
}
// Same for unsigned bytes with an added offset: y = q*d + m.
inline void store_scaled_u8_add(__m256i q, __m256 d, __m256 m, float* y) {
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int k = 0; k < 4; ++k) {
    const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[k]));
    _mm256_storeu_ps(y + 8 * k, _mm256_add_ps(_mm256_mul_ps(f, d), m));
  }
}

// 8x8 transpose of 32-bit elements: out[j] lane i = in[i] lane j.
inline void transpose8x32(const __m256i in[8], __m256i out[8]) {
  __m256i t[8], u[8];
#pragma GCC unroll 16
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(in[2 * i], in[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(in[2 * i], in[2 * i + 1]);
  }
#pragma GCC unroll 16
  for (int i = 0; i < 2; ++i) {
    u[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
    u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
    u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
#pragma GCC unroll 16
  for (int i = 0; i < 4; ++i) {
    out[i] = _mm256_permute2x128_si256(u[i], u[4 + i], 0x20);
    out[4 + i] = _mm256_permute2x128_si256(u[i], u[4 + i], 0x31);
  }
}

// Per K type: unpack a super-block into 8 vectors of 32 unsigned values qu (the unified form of
// quant_internal.h, values e = 32c .. 32c+31 in q[c]) plus scales.
struct KRegs {
  __m256i q[8];
  alignas(32) int16_t sc[16];
  alignas(32) int16_t m[16];
  float d, dmin;
};

inline __m256i load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

struct UnpackQ2K {
  using Block = BlockQ2_K;
  static constexpr bool kSym = false;
  static constexpr int kZero = 0;
  static void run(const Block& b, KRegs& r) {
    const __m256i m3 = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; ++h) {
      const __m256i v = load32(b.qs + 32 * h);
      r.q[4 * h + 0] = _mm256_and_si256(v, m3);
      r.q[4 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 2), m3);
      r.q[4 * h + 2] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m3);
      r.q[4 * h + 3] = _mm256_and_si256(_mm256_srli_epi16(v, 6), m3);
    }
    const __m256i s16 =
        _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(r.sc),
                       _mm256_and_si256(s16, _mm256_set1_epi16(0xF)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(r.m), _mm256_srli_epi16(s16, 4));
    r.d = h2f(b.d);
    r.dmin = h2f(b.dmin);
  }
};

struct UnpackQ3K {
  using Block = BlockQ3_K;
  static constexpr bool kSym = true;
  static constexpr int kZero = 4;
  static void run(const Block& b, KRegs& r) {
    const __m256i m3 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    const __m256i hm = load32(b.hmask);
    for (int h = 0; h < 2; ++h) {
      const __m256i v = load32(b.qs + 32 * h);
      for (int k = 0; k < 4; ++k) {
        const __m256i low = _mm256_and_si256(_mm256_srli_epi16(v, 2 * k), m3);
        const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << (4 * h + k)));
        const __m256i high =
            _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit), four);
        r.q[4 * h + k] = _mm256_or_si256(low, high);
      }
    }
    int8_t s[16];
    q3k_scales(b.scales, s);
    for (int g = 0; g < 16; ++g) {
      r.sc[g] = s[g];
      r.m[g] = static_cast<int16_t>(4 * s[g]);
    }
    r.d = r.dmin = h2f(b.d);
  }
};

// Q4_K/Q5_K: the 12 packed bytes -> 8 scales and 8 mins (bytes 0..7 / 8..15 of u), with four
// 32-bit operations, then widened to one int16 per group of 16.
template <typename Block>
inline void k4_scales(const Block& b, KRegs& r) {
  uint32_t u[4];
  std::memcpy(u, b.scales, 12);
  constexpr uint32_t kLow6 = 0x3F3F3F3F, kLow4 = 0x0F0F0F0F, kLow2 = 0x03030303;
  u[3] = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);
  const uint32_t mins_lo = u[1] & kLow6;
  u[1] = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);
  u[2] = mins_lo;
  u[0] &= kLow6;
  const __m128i v = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(u)));
  const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(u + 2)));
  _mm_store_si128(reinterpret_cast<__m128i*>(r.sc), _mm_unpacklo_epi16(v, v));
  _mm_store_si128(reinterpret_cast<__m128i*>(r.sc + 8), _mm_unpackhi_epi16(v, v));
  _mm_store_si128(reinterpret_cast<__m128i*>(r.m), _mm_unpacklo_epi16(w, w));
  _mm_store_si128(reinterpret_cast<__m128i*>(r.m + 8), _mm_unpackhi_epi16(w, w));
  r.d = h2f(b.d);
  r.dmin = h2f(b.dmin);
}

struct UnpackQ4K {
  using Block = BlockQ4_K;
  static constexpr bool kSym = false;
  static constexpr int kZero = 0;
  static void run(const Block& b, KRegs& r) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    for (int j = 0; j < 4; ++j) {
      const __m256i v = load32(b.qs + 32 * j);
      r.q[2 * j] = _mm256_and_si256(v, m4);
      r.q[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    }
    k4_scales(b, r);
  }
};

struct UnpackQ5K {
  using Block = BlockQ5_K;
  static constexpr bool kSym = false;
  static constexpr int kZero = 0;
  static void run(const Block& b, KRegs& r) {
    const __m256i m4 = _mm256_set1_epi8(0xF), sixteen = _mm256_set1_epi8(16);
    const __m256i qh = load32(b.qh);
    for (int j = 0; j < 4; ++j) {
      const __m256i v = load32(b.qs + 32 * j);
      for (int k = 0; k < 2; ++k) {
        const int g = 2 * j + k;
        const __m256i low =
            k == 0 ? _mm256_and_si256(v, m4) : _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << g));
        const __m256i high =
            _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit), sixteen);
        r.q[g] = _mm256_or_si256(low, high);
      }
    }
    k4_scales(b, r);
  }
};

struct UnpackQ6K {
  using Block = BlockQ6_K;
  static constexpr bool kSym = true;
  static constexpr int kZero = 32;
  static void run(const Block& b, KRegs& r) {
    const __m256i m4 = _mm256_set1_epi8(0xF), m30 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; ++h) {
      const __m256i l0 = load32(b.ql + 64 * h), l1 = load32(b.ql + 64 * h + 32);
      const __m256i qh = load32(b.qh + 32 * h);
      r.q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                       _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
      r.q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                       _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
      r.q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                       _mm256_and_si256(qh, m30));
      r.q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                       _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
    }
    const __m256i sc =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(r.sc), sc);
    _mm256_store_si256(reinterpret_cast<__m256i*>(r.m), _mm256_slli_epi16(sc, 5));
    r.d = r.dmin = h2f(b.d);
  }
};

}  // namespace BIE_SIMD_ISA
}  // namespace bie::quant::simd
