#version 450
// y[t][r] = sum_k W[r][k] * x[t][k]: one subgroup per weight row, `rows_per_group` rows per
// workgroup of 64 lanes (the subgroups take its rows in turn, so any subgroup size works), up to
// 8 tokens per workgroup (group y: tokens 8y..8y+7) sharing each decoded weight. Every token runs
// the same operations in the same order whatever the others are, so its bits do not depend on
// the batch (decode batch invariance). W is read in its GGUF block layout (quant.glsl), four
// elements at a time; a row's lanes stride over it and reduce with subgroupAdd: no shared
// memory, no barrier (a CPU driver such as lavapipe runs a barrier as a switch between every
// invocation). Rows beyond the x-dimension's workgroups fold into group z. Offsets and strides
// are in floats (w_off in bytes): whole buffers are bound, so views need no aligned offsets.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P {
  uint n_in; uint n_out; uint row_bytes; uint w_off; uint x_off; uint x_stride; uint y_off;
  uint y_stride; uint rows_per_group; uint n_tok;
} p;
#include "quant.glsl"
void main() {
  const uint group = gl_WorkGroupID.x + gl_WorkGroupID.z * gl_NumWorkGroups.x;
  const uint t0 = gl_WorkGroupID.y * 8u;
  const uint nt = min(8u, p.n_tok - t0);
  const uint lane = gl_SubgroupInvocationID;
  for (uint i = gl_SubgroupID; i < p.rows_per_group; i += gl_NumSubgroups) {
    const uint row = group * p.rows_per_group + i;
    if (row >= p.n_out) break;  // uniform per subgroup
    const uint roff = p.w_off + row * p.row_bytes;
    float acc[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    // Constant trip counts (unrolled: acc stays in registers); tokens past nt are skipped.
    // Lane l takes elements 4l..4l+3, then every 4 x subgroup size further (wget4 decodes a
    // quad's block and scales once); a row whose length is not a multiple of 4 ends with single
    // elements.
    const uint n4 = p.n_in & ~3u;
    for (uint k = 4u * lane; k < n4; k += 4u * gl_SubgroupSize) {
      const vec4 wk = wget4(roff, k);
      [[unroll]] for (uint j = 0u; j < 8u; ++j) {
        if (j < nt) {
          const uint xo = p.x_off + (t0 + j) * p.x_stride + k;
          acc[j] += wk.x * x[xo];
          acc[j] += wk.y * x[xo + 1u];
          acc[j] += wk.z * x[xo + 2u];
          acc[j] += wk.w * x[xo + 3u];
        }
      }
    }
    for (uint k = n4 + lane; k < p.n_in; k += gl_SubgroupSize) {
      const float wk = wget(roff, k);
      [[unroll]] for (uint j = 0u; j < 8u; ++j) {
        if (j < nt) acc[j] += wk * x[p.x_off + (t0 + j) * p.x_stride + k];
      }
    }
    [[unroll]] for (uint j = 0u; j < 8u; ++j) {
      if (j < nt) {
        const float s = subgroupAdd(acc[j]);
        if (subgroupElect()) y[p.y_off + (t0 + j) * p.y_stride + row] = s;
      }
    }
  }
}
