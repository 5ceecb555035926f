// Scalar normalised fast Walsh–Hadamard transform and the dispatcher (AVX2 twin in
// kv_format_rotate_avx2.cpp).
#include "bie/backend/kv_format_rotate.h"

#include <cassert>
#include <cmath>

#include "bie/common/cpu_features.h"

namespace bie::kv {

void hadamard_rotate_scalar(float* x, int n) {
  assert(n >= 1 && n <= 4096 && (n & (n - 1)) == 0);
  for (int h = 1; h < n; h *= 2) {
    for (int i = 0; i < n; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  const float norm = 1.0f / std::sqrt(static_cast<float>(n));
  for (int i = 0; i < n; ++i) x[i] *= norm;
}

void hadamard_rotate(float* x, int n) {
  if (has_avx2()) {
    hadamard_rotate_avx2(x, n);
  } else {
    hadamard_rotate_scalar(x, n);
  }
}

}  // namespace bie::kv
