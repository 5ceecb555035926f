#include "bie/backend/ops.h"

#include <cmath>

#include "bie/quant/fp16.h"

namespace bie::ops {

void rms_norm(const float* x, const float* w, float* out, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * w[i];
}

void add_inplace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void silu_mul_inplace(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void gelu_mul_inplace(float* gate, const float* up, int64_t n) {
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  constexpr float kCoefA = 0.044715f;
  for (int64_t i = 0; i < n; ++i) {
    const float x = gate[i];
    if (x <= -10.0f) {
      gate[i] = 0.0f;
    } else if (x >= 10.0f) {
      gate[i] = x * up[i];
    } else {
      // ggml's table entry for fp16(x): gelu of the fp16 value, stored as fp16.
      const float xh = quant::fp16_to_fp32(quant::fp32_to_fp16(x));
      const float g = 0.5f * xh * (1.0f + std::tanh(kSqrt2OverPi * xh * (1.0f + kCoefA * xh * xh)));
      gate[i] = quant::fp16_to_fp32(quant::fp32_to_fp16(g)) * up[i];
    }
  }
}

void rope_cache(const RopeParams& p, int64_t pos, float* cs) {
  const float theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(p.n_rot));
  float theta = static_cast<float>(pos);
  for (int i0 = 0; i0 < p.n_rot; i0 += 2) {
    const float ff = p.freq_factors != nullptr ? p.freq_factors[i0 / 2] : 1.0f;
    const float t = p.freq_scale * (theta / ff);
    cs[i0] = std::cos(t);
    cs[i0 + 1] = std::sin(t);
    theta *= theta_scale;
  }
}

void rope_apply(const RopeParams& p, const float* cs, float* x, int n_heads, int head_dim) {
  const int half = p.n_rot / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    for (int i0 = 0; i0 < p.n_rot; i0 += 2) {
      const float c = cs[i0];
      const float s = cs[i0 + 1];
      const int a = p.neox ? i0 / 2 : i0;
      const int b = p.neox ? i0 / 2 + half : i0 + 1;
      const float x0 = v[a];
      const float x1 = v[b];
      v[a] = x0 * c - x1 * s;
      v[b] = x0 * s + x1 * c;
    }
  }
}

}  // namespace bie::ops
