#version 450
// The splits of attn_paged_kv.comp's split_wg pass merged per (query token, query head): in split
// order, with attn_split.glsl's arithmetic (the same the one-workgroup pass uses), then
// normalised. One workgroup per (token, head), a lane per dimension (lid + 64 i).
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer S { float part[]; };  // attn_paged_kv.comp's layout
layout(std430, binding = 1) readonly buffer M { int meta[]; };    // attn_paged_kv.comp's meta
layout(std430, binding = 2) writeonly buffer O { float o[]; };    // [t][n_head][head_dim]
layout(push_constant) uniform P {
  uint n_tokens; uint n_head; uint head_dim; uint window; uint n_split_max; uint split_min;
  uint o_off; uint o_stride;
} p;

#include "attn_split.glsl"

void main() {
  const uint t = gl_WorkGroupID.x, head = gl_WorkGroupID.y, lid = gl_LocalInvocationID.x;
  const uint D = p.head_dim;
  const int pos = meta[16u + p.n_tokens + t];
  const int first = p.window > 0u ? max(0, pos - int(p.window) + 1) : 0;
  int len, n_split;
  split_grid(first, pos, p.n_split_max, p.split_min, len, n_split);
  const uint base = (t * p.n_head + head) * p.n_split_max * (D + 2u);
  for (uint c = lid; c < D; c += 64u) {
    float M = -1.0 / 0.0, L = 0.0, acc = 0.0;
    for (int s = 0; s < n_split; ++s) {
      const uint at = base + uint(s) * (D + 2u);
      float a, b;
      split_merge(M, L, part[at], part[at + 1u], a, b);
      acc = split_apply(acc, a, part[at + 2u + c], b);
    }
    o[p.o_off + t * p.o_stride + head * D + c] = acc / L;
  }
}
