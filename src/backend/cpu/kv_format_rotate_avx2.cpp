// AVX2 normalised fast Walsh–Hadamard transform: the three innermost butterfly stages inside one
// register (lane shuffles), the rest between registers. Bit-identical to the scalar twin: every
// output is the same a + b or a - b of the same operands.
#include <immintrin.h>

#include <cassert>
#include <cmath>

#include "bie/backend/kv_format_rotate.h"

namespace bie::kv {

namespace {

// One butterfly stage of span h (1, 2 or 4) inside a register: lanes with bit h clear get
// x + partner, lanes with it set get partner - x (= a - b with a the lower lane).
template <int kBlend>
inline __m256 stage_in_register(__m256 x, __m256 partner) {
  return _mm256_blend_ps(_mm256_add_ps(x, partner), _mm256_sub_ps(partner, x), kBlend);
}

}  // namespace

void hadamard_rotate_avx2(float* x, int n) {
  assert(n >= 1 && n <= 4096 && (n & (n - 1)) == 0);
  if (n < 8) {
    hadamard_rotate_scalar(x, n);
    return;
  }
  for (int i = 0; i < n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    v = stage_in_register<0xAA>(v, _mm256_permute_ps(v, 0xB1));          // h = 1
    v = stage_in_register<0xCC>(v, _mm256_permute_ps(v, 0x4E));          // h = 2
    v = stage_in_register<0xF0>(v, _mm256_permute2f128_ps(v, v, 0x01));  // h = 4
    _mm256_storeu_ps(x + i, v);
  }
  for (int h = 8; h < n; h *= 2) {
    for (int i = 0; i < n; i += 2 * h) {
      for (int j = i; j < i + h; j += 8) {
        const __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + h);
        _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
        _mm256_storeu_ps(x + j + h, _mm256_sub_ps(a, b));
      }
    }
  }
  const __m256 norm = _mm256_set1_ps(1.0f / std::sqrt(static_cast<float>(n)));
  for (int i = 0; i < n; i += 8)
    _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), norm));
}

}  // namespace bie::kv
