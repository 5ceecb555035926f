#version 450
// Writes one layer's K and V rows (F32) into KV tiles of a row-wise format (fp8_e4m3, int8,
// int4_asym; kv_codec.glsl), one invocation per (slot, K/V, KV head) row: the row's scale is a
// reduction over the whole row, and a row is small (a per-channel side is left to kv_chan.comp).
// Slot i sends source token slot[2n + i]'s head h to row slot[n + i] of block slot[i]. Byte offset
// of (block b, head h, row j) in the pool: k_base + b * block_bytes + h * k_tile + j * row_bytes
// (V: k_base + n_head_kv * k_tile + ...).
// rotate_k: K rows are Hadamard-rotated first (hadamard.glsl). round_fp16: the row is then
// rounded to fp16 (a mixed layout's body pool: its bytes are those of rows that passed through
// the FP16 window).
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer K { float k[]; };  // [t][n_head_kv * head_dim]
layout(std430, binding = 1) readonly buffer V { float v[]; };
layout(std430, binding = 2) readonly buffer S { int slot[]; };  // [i] block, [n + i] row, [2n + i] token
layout(std430, binding = 3) buffer Pool { uint pool[]; };
layout(push_constant) uniform P {
  uint n_slots; uint n_head_kv; uint head_dim; uint block_bytes; uint k_tile; uint v_tile;
  uint k_base; uint k_type; uint v_type; uint k_group; uint v_group; uint round_fp16;
  uint k_src_off; uint k_src_stride; uint v_src_off; uint v_src_stride; uint rotate_k;
  float rot_norm;
} p;

#include "kv_codec.glsl"

uint src_at;  // index of the row's first value in k[] or v[]
bool src_is_v, rotated;
#include "hadamard.glsl"
float kv_src(uint i) {
  const float x = rotated ? rot[i] : src_is_v ? v[src_at + i] : k[src_at + i];
  return p.round_fp16 != 0u ? kv_half_to_float(kv_float_to_half(x)) : x;
}

// rot = the K row at src_at, rotated.
void rotate_row(uint d) {
  for (uint i = 0u; i < d; ++i) rot[i] = k[src_at + i];
  hadamard_rotate_rot(d, p.rot_norm);
}
#define KV_DST pool
#include "kv_encode.glsl"

void main() {
  const uint r = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 64u;
  if (r >= p.n_slots * 2u * p.n_head_kv) return;
  const uint i = r / (2u * p.n_head_kv), kvh = r % (2u * p.n_head_kv);
  src_is_v = kvh >= p.n_head_kv;
  const uint h = kvh % p.n_head_kv;
  const uint blk = uint(slot[i]), row = uint(slot[p.n_slots + i]), tok = uint(slot[2u * p.n_slots + i]);
  const uint type = src_is_v ? p.v_type : p.k_type, g = src_is_v ? p.v_group : p.k_group;
  if (kv_is_chan(type)) return;  // a per-channel side is written a tile at a time (kv_chan.comp)
  src_at = src_is_v ? p.v_src_off + tok * p.v_src_stride + h * p.head_dim
                    : p.k_src_off + tok * p.k_src_stride + h * p.head_dim;
  rotated = !src_is_v && p.rotate_k != 0u;
  if (rotated) rotate_row(p.head_dim);
  const uint tile0 = p.k_base + blk * p.block_bytes +
                     (src_is_v ? p.n_head_kv * p.k_tile + h * p.v_tile : h * p.k_tile);
  kv_encode_row(type, p.head_dim, g, tile0 + row * kv_row_bytes(type, p.head_dim, g));
}
