#include <immintrin.h>

#include <cmath>

#include "bie/attention/dense_attention.h"
#include "bie/common/simd_avx2.h"

namespace bie::attention {

using simd::hsum;

// note: call only if head_dim % 8 == 0 and head_dim <= 512 (attend_one_head checks).
void attend_one_head_avx2(const DenseAttnArgs& a) {
  const int hd = a.head_dim;
  const int nv = hd / 8;
  __m256 qv[64];
  for (int i = 0; i < nv; ++i) {
    // Round q to fp16 and back, as the reference does.
    const __m128i h =
        _mm256_cvtps_ph(_mm256_loadu_ps(a.q + a.head * hd + 8 * i), _MM_FROUND_TO_NEAREST_INT);
    qv[i] = _mm256_cvtph_ps(h);
  }
  const int64_t off = static_cast<int64_t>(a.kv_head) * hd;
  const int64_t j0 = a.kv_first;
  for (int64_t j = j0; j < a.n_kv_tokens; ++j) {
    const uint16_t* kr = a.k + j * a.kv_stride + off;
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < nv; ++i) {
      const __m256 kf =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kr + 8 * i)));
      acc = _mm256_fmadd_ps(qv[i], kf, acc);
    }
    a.scores[j - j0] = hsum(acc) * a.scale;
  }
  softmax_inplace(a.scores, a.n_kv_tokens - j0);
  __m256 ov[64];
  for (int i = 0; i < nv; ++i) ov[i] = _mm256_setzero_ps();
  for (int64_t j = j0; j < a.n_kv_tokens; ++j) {
    const float p16 = _cvtsh_ss(_cvtss_sh(a.scores[j - j0], _MM_FROUND_TO_NEAREST_INT));
    const __m256 p = _mm256_set1_ps(p16);
    const uint16_t* vr = a.v + j * a.kv_stride + off;
    for (int i = 0; i < nv; ++i) {
      const __m256 vf =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(vr + 8 * i)));
      ov[i] = _mm256_fmadd_ps(p, vf, ov[i]);
    }
  }
  for (int i = 0; i < nv; ++i) _mm256_storeu_ps(a.out + 8 * i, ov[i]);
}

}  // namespace bie::attention
