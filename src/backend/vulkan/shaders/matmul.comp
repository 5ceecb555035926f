#version 450
// Prefill: Y[t][r] = sum_k W[r][k] * X[t][k], tiled 32 rows x 32 tokens per workgroup with 32-wide
// K steps through shared memory (the weight tile is decoded from its GGUF blocks once per step
// and reused by all 32 tokens). 64 lanes, each computing 4 x 4 outputs: a CPU driver such as
// lavapipe runs each barrier as a switch between all of a workgroup's invocations, so fewer lanes
// with more outputs each cost far fewer switches (256 lanes of 2 x 2 made prefill ~9x slower per
// weight than the matrix-vector kernel there). Each output sums k in order, as before.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 64) in;
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
  const uint lr = (lid % 8u) * 4u, lt = (lid / 8u) * 4u;
  float acc[4][4];
  [[unroll]] for (uint a = 0u; a < 4u; ++a) {
    [[unroll]] for (uint b = 0u; b < 4u; ++b) acc[a][b] = 0.0;
  }
  for (uint k0 = 0u; k0 < p.n_in; k0 += TK) {
    // Each lane fills quads of the tiles: 4 weights decoded together (wget4) where the quad
    // lies inside the row, one by one at a row's ragged end.
    for (uint i = 4u * lid; i < TM * TK; i += 256u) {
      const uint r = i / TK, k = i % TK;
      const uint gr = r0 + r, gk = k0 + k, gt = t0 + r;
      if (gr < p.n_out && gk + 3u < p.n_in) {
        const vec4 q = wget4(p.w_off + gr * p.row_bytes, gk);
        ws[r][k] = q.x;
        ws[r][k + 1u] = q.y;
        ws[r][k + 2u] = q.z;
        ws[r][k + 3u] = q.w;
      } else {
        for (uint c = 0u; c < 4u; ++c) {
          ws[r][k + c] =
              (gr < p.n_out && gk + c < p.n_in) ? wget(p.w_off + gr * p.row_bytes, gk + c) : 0.0;
        }
      }
      for (uint c = 0u; c < 4u; ++c) {
        xs[r][k + c] =
            (gt < p.n_tokens && gk + c < p.n_in) ? x[p.x_off + gt * p.x_stride + gk + c] : 0.0;
      }
    }
    barrier();
    // Lanes whose four tokens are all past the batch skip the products (a short prefill fills
    // few of the tile's 32 tokens); lanes 8i..8i+7 share their tokens.
    for (uint k = 0u; k < TK && t0 + lt < p.n_tokens; ++k) {
      float wr[4], xr[4];
      [[unroll]] for (uint a = 0u; a < 4u; ++a) {
        wr[a] = ws[lr + a][k];
        xr[a] = xs[lt + a][k];
      }
      [[unroll]] for (uint a = 0u; a < 4u; ++a) {
        [[unroll]] for (uint b = 0u; b < 4u; ++b) acc[a][b] += wr[a] * xr[b];
      }
    }
    barrier();
  }
  [[unroll]] for (uint a = 0u; a < 4u; ++a) {
    [[unroll]] for (uint b = 0u; b < 4u; ++b) {
      const uint r = r0 + lr + a, t = t0 + lt + b;
      if (r < p.n_out && t < p.n_tokens) y[p.y_off + t * p.y_stride + r] = acc[a][b];
    }
  }
}
