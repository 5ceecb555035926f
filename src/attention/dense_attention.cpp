#include "bie/attention/dense_attention.h"

#include <cmath>

#include "bie/common/cpu_features.h"
#include "bie/quant/fp16.h"

namespace bie::attention {

namespace {
constexpr int kMaxHeadDim = 512;

inline float round_fp16(float x) {
  return quant::fp16_to_fp32(quant::fp32_to_fp16(x));
}
}  // namespace

// Softmax of scores[0..n) in place; the sum is taken in double like ggml's soft_max.
void softmax_inplace(float* scores, int64_t n) {
  float max_s = -INFINITY;
  for (int64_t j = 0; j < n; ++j) max_s = std::fmax(max_s, scores[j]);
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    const float e = std::exp(scores[j] - max_s);
    scores[j] = e;
    sum += e;
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t j = 0; j < n; ++j) scores[j] *= inv;
}

void attend_one_head_scalar(const DenseAttnArgs& a) {
  const int hd = a.head_dim;
  float qh[kMaxHeadDim];
  for (int d = 0; d < hd; ++d) qh[d] = round_fp16(a.q[a.head * hd + d]);
  const int64_t k_off = static_cast<int64_t>(a.kv_head) * hd;
  const int64_t j0 = a.kv_first;
  for (int64_t j = j0; j < a.n_kv_tokens; ++j) {
    const uint16_t* kr = a.k + j * a.kv_stride + k_off;
    float s = 0.0f;
    for (int d = 0; d < hd; ++d) s += qh[d] * quant::fp16_to_fp32(kr[d]);
    a.scores[j - j0] = s * a.scale;
  }
  softmax_inplace(a.scores, a.n_kv_tokens - j0);
  for (int d = 0; d < hd; ++d) a.out[d] = 0.0f;
  for (int64_t j = j0; j < a.n_kv_tokens; ++j) {
    const float p = round_fp16(a.scores[j - j0]);
    const uint16_t* vr = a.v + j * a.kv_stride + k_off;
    for (int d = 0; d < hd; ++d) a.out[d] += p * quant::fp16_to_fp32(vr[d]);
  }
}

void attend_one_head(const DenseAttnArgs& a) {
  if (has_avx2() && a.head_dim % 8 == 0 && a.head_dim <= kMaxHeadDim) {
    attend_one_head_avx2(a);
  } else {
    attend_one_head_scalar(a);
  }
}

}  // namespace bie::attention
