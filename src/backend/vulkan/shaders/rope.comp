#version 450
// RoPE in place on x[t][h][d] (n_heads heads of head_dim per token) with a (cos, sin) cache
// cs[t][n_rot] computed on the host by ops::rope_cache (so the angles are the CPU's, bit for bit).
// Adjacent pairs (d, d+1) or, with neox, halves (d/2, d/2 + n_rot/2). One lane per pair.
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer CS { float cs[]; };
layout(push_constant) uniform P {
  uint n_tokens; uint n_heads; uint head_dim; uint n_rot; uint neox; uint x_off; uint x_stride;
  uint cs_off; uint cs_stride;
} p;
void main() {
  const uint half_rot = p.n_rot / 2u;
  const uint i = gl_GlobalInvocationID.x;  // pair within the head
  const uint h = gl_GlobalInvocationID.y;
  const uint t = gl_GlobalInvocationID.z;
  if (i >= half_rot || h >= p.n_heads || t >= p.n_tokens) return;
  const uint i0 = 2u * i;
  const float c = cs[p.cs_off + t * p.cs_stride + i0], s = cs[p.cs_off + t * p.cs_stride + i0 + 1u];
  const uint base = p.x_off + t * p.x_stride + h * p.head_dim;
  const uint a = base + (p.neox != 0u ? i : i0);
  const uint b = base + (p.neox != 0u ? i + half_rot : i0 + 1u);
  const float x0 = x[a], x1 = x[b];
  x[a] = x0 * c - x1 * s;
  x[b] = x0 * s + x1 * c;
}
