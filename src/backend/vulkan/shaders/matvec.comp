#version 450
// y[t][r] = sum_k W[r][k] * x[t][k] for one weight row per workgroup and token t = group y.
// W is read in its GGUF block layout (quant.glsl); the 64 lanes split the row and reduce in
// shared memory. Rows beyond the x-dimension's workgroups fold into group z. Offsets and strides
// are in floats (w_off in bytes): whole buffers are bound, so views need no aligned offsets.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P {
  uint n_in; uint n_out; uint row_bytes; uint w_off; uint x_off; uint x_stride; uint y_off;
  uint y_stride;
} p;
#include "quant.glsl"
shared float red[64];
void main() {
  const uint row = gl_WorkGroupID.x + gl_WorkGroupID.z * gl_NumWorkGroups.x;
  const uint t = gl_WorkGroupID.y;
  const uint lid = gl_LocalInvocationID.x;
  if (row >= p.n_out) return;  // uniform per workgroup
  const uint roff = p.w_off + row * p.row_bytes;
  const uint xo = p.x_off + t * p.x_stride;
  float acc = 0.0;
  for (uint k = lid; k < p.n_in; k += 64u) acc += wget(roff, k) * x[xo + k];
  red[lid] = acc;
  barrier();
  for (uint s = 32u; s > 0u; s >>= 1) {
    if (lid < s) red[lid] += red[lid + s];
    barrier();
  }
  if (lid == 0u) y[p.y_off + t * p.y_stride + row] = red[0];
}
