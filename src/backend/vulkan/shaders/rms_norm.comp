#version 450
// y[r][i] = x[r][i] / sqrt(mean(x[r]^2) + eps) * w[i] for rows r of n values (one workgroup per
// row). Per-head q/k norm: rows = tokens x heads, n = head_dim, w has n values. x and y may be
// the same buffer (each lane reads its values before writing them).
layout(local_size_x = 128) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Wt { float w[]; };
layout(std430, binding = 2) buffer Y { float y[]; };
layout(push_constant) uniform P {
  uint rows; uint n; uint x_off; uint x_stride; uint w_off; uint y_off; uint y_stride; float eps;
} p;
shared float red[128];
void main() {
  const uint r = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  const uint lid = gl_LocalInvocationID.x;
  if (r >= p.rows) return;  // uniform per workgroup
  const uint xb = p.x_off + r * p.x_stride, yb = p.y_off + r * p.y_stride;
  float s = 0.0;
  for (uint i = lid; i < p.n; i += 128u) s += x[xb + i] * x[xb + i];
  red[lid] = s;
  barrier();
  for (uint k = 64u; k > 0u; k >>= 1) {
    if (lid < k) red[lid] += red[lid + k];
    barrier();
  }
  const float scale = 1.0 / sqrt(red[0] / float(p.n) + p.eps);
  for (uint i = lid; i < p.n; i += 128u) y[yb + i] = x[xb + i] * scale * w[p.w_off + i];
}
