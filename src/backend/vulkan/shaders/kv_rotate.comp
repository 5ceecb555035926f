#version 450
// Hadamard-rotated K rows (hadamard.glsl) into a scratch, for Backend::kv_write of whole
// per-channel key tiles with rotated keys: kv_chan.comp then fits each channel over the tile's
// rotated rows, as the CPU's store does. Job j (job[2 j + 1]: its first source token) sends the
// block_size tokens from there to scratch rows j * block_size .. (each row n_head_kv * head_dim
// values, as the source). One invocation per (job row, KV head).
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer K { float k[]; };  // [t][k_stride]
layout(std430, binding = 1) readonly buffer J { int job[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
  uint n_jobs; uint n_head_kv; uint head_dim; uint block_size; uint k_off; uint k_stride;
  float rot_norm;
} p;

#include "hadamard.glsl"

void main() {
  const uint r = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 64u;
  const uint H = p.n_head_kv, d = p.head_dim;
  if (r >= p.n_jobs * p.block_size * H) return;
  const uint h = r % H, row = r / H;
  const uint tok = uint(job[2u * (row / p.block_size) + 1u]) + row % p.block_size;
  const uint src = p.k_off + tok * p.k_stride + h * d;
  for (uint i = 0u; i < d; ++i) rot[i] = k[src + i];
  hadamard_rotate_rot(d, p.rot_norm);
  const uint dst = (row * H + h) * d;
  for (uint i = 0u; i < d; ++i) o[dst + i] = rot[i];
}
