#include <immintrin.h>

#include "bie/attention/paged_attention.h"

namespace bie::attention {

// scores[j] = q . row j of an f16 tile, summed exactly as attend_one_head_avx2 sums: one 8-lane
// FMA accumulator over head_dim, then the same horizontal sum. Keeps the paged f16 path
// bit-identical to ContiguousKvCache (kv::f16_dot's two accumulators move SmolLM2's logits by
// up to 0.8, past the golden bar).
// note: call only if head_dim % 8 == 0 and the CPU has AVX2+FMA+F16C
void f16_dot_dense_order_avx2(int head_dim, const float* q, const uint8_t* tile, int n,
                              float* scores) {
  for (int j = 0; j < n; ++j) {
    const auto* kr = reinterpret_cast<const uint16_t*>(tile) + static_cast<size_t>(j) * head_dim;
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < head_dim; i += 8) {
      const __m256 kf = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kr + i)));
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), kf, acc);
    }
    __m128 lo = _mm256_castps256_ps128(acc);
    __m128 hi = _mm256_extractf128_ps(acc, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    scores[j] = _mm_cvtss_f32(lo);
  }
}

}  // namespace bie::attention
