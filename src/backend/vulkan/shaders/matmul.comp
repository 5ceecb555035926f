#version 450
// Prefill: Y[t][r] = sum_k W[r][k] * X[t][k], tiled 32 rows x 32 tokens per workgroup with 32-wide
// K steps through shared memory (the weight tile is decoded from its GGUF blocks once per step
// and reused by all 32 tokens). 256 lanes, each computing 2 x 2 outputs.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P {
  uint n_in; uint n_out; uint row_bytes; uint w_off; uint x_off; uint x_stride; uint y_off;
  uint y_stride; uint n_tokens;
} p;
#include "quant.glsl"
const uint TM = 32u, TN = 32u, TK = 32u;
shared float ws[TM][TK + 1u];
shared float xs[TN][TK + 1u];
void main() {
  const uint lid = gl_LocalInvocationID.x;
  const uint r0 = gl_WorkGroupID.x * TM, t0 = gl_WorkGroupID.y * TN;
  const uint lr = (lid % 16u) * 2u, lt = (lid / 16u) * 2u;
  float acc[2][2] = {{0.0, 0.0}, {0.0, 0.0}};
  for (uint k0 = 0u; k0 < p.n_in; k0 += TK) {
    for (uint i = lid; i < TM * TK; i += 256u) {
      const uint r = i / TK, k = i % TK;
      const uint gr = r0 + r, gk = k0 + k;
      ws[r][k] = (gr < p.n_out && gk < p.n_in) ? wget(p.w_off + gr * p.row_bytes, gk) : 0.0;
      const uint gt = t0 + r;
      xs[r][k] = (gt < p.n_tokens && gk < p.n_in) ? x[p.x_off + gt * p.x_stride + gk] : 0.0;
    }
    barrier();
    for (uint k = 0u; k < TK; ++k) {
      const float w0 = ws[lr][k], w1 = ws[lr + 1u][k];
      const float x0 = xs[lt][k], x1 = xs[lt + 1u][k];
      acc[0][0] += w0 * x0; acc[0][1] += w0 * x1;
      acc[1][0] += w1 * x0; acc[1][1] += w1 * x1;
    }
    barrier();
  }
  for (uint a = 0u; a < 2u; ++a) {
    for (uint b = 0u; b < 2u; ++b) {
      const uint r = r0 + lr + a, t = t0 + lt + b;
      if (r < p.n_out && t < p.n_tokens) y[p.y_off + t * p.y_stride + r] = acc[a][b];
    }
  }
}
