// Small AVX-512 helpers the *_avx512.cpp kernels share. Include only from files compiled with
// AVX-512 enabled (CMakeLists.txt: the *_avx512.cpp sources).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace bie::cpu {

// The 4 bytes at p (any alignment) in every 32-bit lane.
inline __m512i bcast32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

}  // namespace bie::cpu
