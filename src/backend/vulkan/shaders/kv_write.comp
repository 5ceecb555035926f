#version 450
// Writes one layer's K and V rows (F32) into fp16 KV tiles: slot t sends source token tok[t]'s
// head h to row row[t] of block block[t] (one lane per pair of dimensions, so each 32-bit word has
// one writer).
// Half index of (block b, head h, row j, dim c): k_off + b * block_stride + h * head_stride +
// j * head_dim + c (V: v_off ...).
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer K { float k[]; };  // [t][n_head_kv * head_dim]
layout(std430, binding = 1) readonly buffer V { float v[]; };
// [t] block, [n_tokens + t] row, [2 n_tokens + t] source token
layout(std430, binding = 2) readonly buffer S { int slot[]; };
layout(std430, binding = 3) buffer Pool { uint pool[]; };
layout(push_constant) uniform P {
  uint n_tokens; uint n_head_kv; uint head_dim; uint block_stride; uint head_stride; uint k_off;
  uint v_off; uint k_src_off; uint k_src_stride; uint v_src_off; uint v_src_stride;
} p;
void main() {
  const uint i = gl_GlobalInvocationID.x;  // pair index within the token's n_head_kv * head_dim
  const uint t = gl_GlobalInvocationID.y;
  const uint width = p.n_head_kv * p.head_dim;
  if (2u * i >= width || t >= p.n_tokens) return;
  const uint h = (2u * i) / p.head_dim, c = (2u * i) % p.head_dim;
  const uint blk = uint(slot[t]), row = uint(slot[p.n_tokens + t]);
  const uint rel = blk * p.block_stride + h * p.head_stride + row * p.head_dim + c;
  const uint tok = uint(slot[2u * p.n_tokens + t]);
  const uint ks = p.k_src_off + tok * p.k_src_stride + 2u * i;
  const uint vs = p.v_src_off + tok * p.v_src_stride + 2u * i;
  pool[(p.k_off + rel) >> 1] = packHalf2x16(vec2(k[ks], k[ks + 1u]));
  pool[(p.v_off + rel) >> 1] = packHalf2x16(vec2(v[vs], v[vs + 1u]));
}
