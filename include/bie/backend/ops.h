// Element-wise CPU operations of the forward pass. Stateless; safe to call from any thread on
// disjoint data.
#pragma once

#include <cstdint>

namespace bie::ops {

// out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i], n values (sum of squares in double, as ggml).
void rms_norm(const float* x, const float* w, float* out, int64_t n, float eps);

// x[i] += y[i]
void add_inplace(float* x, const float* y, int64_t n);

// gate[i] = silu(gate[i]) * up[i]
void silu_mul_inplace(float* gate, const float* up, int64_t n);

// gate[i] = gelu(gate[i]) * up[i], GELU's tanh approximation computed as ggml's CPU geglu does:
// on the fp16-rounded input, the result rounded to fp16 (its lookup table), 0 below -10 and the
// identity above 10 (Gemma's GeGLU feed-forward).
void gelu_mul_inplace(float* gate, const float* up, int64_t n);

struct RopeParams {
  int n_rot = 0;  // rotated dims per head (even)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;
  bool neox = false;                    // halves layout instead of adjacent pairs
  const float* freq_factors = nullptr;  // optional [n_rot/2] per-pair divisors (llama 3.1)
};

// Fills cs[0 .. n_rot) with interleaved (cos, sin) for position pos, as ggml's rope cache.
void rope_cache(const RopeParams& p, int64_t pos, float* cs);

// Rotates n_heads heads of head_dim values each (contiguous) with a cache from rope_cache().
void rope_apply(const RopeParams& p, const float* cs, float* x, int n_heads, int head_dim);

}  // namespace bie::ops
