// Small AVX2 helpers shared by the *_avx2.cpp kernels. Include only from translation units
// compiled with -mavx2 -mfma -mf16c (CMake gives those flags to files named *_avx2.cpp).
#pragma once

#include <immintrin.h>

// Every ISA's files get their own copy of these inline helpers: an unoptimised build emits them
// as weak symbols, and without a per-ISA name the linker could keep the AVX-512 file's copy for
// the AVX2 path too (illegal instructions on a CPU without AVX-512).
#if defined(__AVX512F__)
#define BIE_SIMD_ISA isa_avx512
#elif defined(__AVX2__)
#define BIE_SIMD_ISA isa_avx2
#else
#error "simd_avx2.h is for files compiled with -mavx2 (*_avx2.cpp, *_avx512.cpp)"
#endif

namespace bie::simd {
inline namespace BIE_SIMD_ISA {

// Sum of the 8 lanes: (lo + hi) halves, then pairs, then the last two — one fixed order that
// every kernel shares (the f16 attention scores rely on it being the same as dense attention's).
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Largest of the 8 lanes (exact in any order).
inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

}  // namespace BIE_SIMD_ISA
}  // namespace bie::simd
