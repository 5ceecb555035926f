#version 450
// Embedding gather: y[t][k] = W[ids[t]][k] (row decoded from its GGUF blocks) * scale.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer I { int ids[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P {
  uint n_in; uint row_bytes; uint w_off; uint ids_off; uint y_off; uint y_stride; float scale;
} p;
#include "quant.glsl"
void main() {
  const uint t = gl_WorkGroupID.y;
  const uint roff = p.w_off + uint(ids[p.ids_off + t]) * p.row_bytes;
  for (uint k = gl_WorkGroupID.x * 64u + gl_LocalInvocationID.x; k < p.n_in;
       k += 64u * gl_NumWorkGroups.x) {
    y[p.y_off + t * p.y_stride + k] = wget(roff, k) * p.scale;
  }
}
