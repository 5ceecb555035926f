#version 450
// Window exit on the device (Backend::quantise_blocks): the first rows[j] rows of every K and V
// tile of FP16 block src[j] re-encoded into body block dst[j] in the body pool's row-wise format,
// as PagedKvStore's host migration does (fp16 -> fp32 exactly, then the format's store). One
// invocation per (job, layer, K/V, KV head, row). Byte offsets as kv_write_q.comp's, per pool. A
// per-channel side is left to kv_chan.comp.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Src { uint src[]; };
layout(std430, binding = 1) buffer Dst { uint dst[]; };
layout(std430, binding = 2) readonly buffer J { int job[]; };  // [3 j] src, [3 j + 1] dst, [3 j + 2] rows
layout(push_constant) uniform P {
  uint n_layers; uint n_head_kv; uint head_dim; uint block_size; uint src_block_bytes;
  uint src_base; uint dst_block_bytes; uint dst_k_tile; uint dst_v_tile; uint dst_base;
  uint k_type; uint v_type; uint k_group; uint v_group;
} p;

#include "kv_codec.glsl"

uint src_at;  // byte offset of the fp16 row being encoded
float kv_src(uint i) {
  const uint off = src_at + 2u * i;
  return kv_half_to_float((src[off >> 2] >> ((off & 2u) * 8u)) & 0xFFFFu);
}
#define KV_DST dst
#include "kv_encode.glsl"

void main() {
  const uint r = gl_GlobalInvocationID.x, j = gl_WorkGroupID.y;
  const uint H = p.n_head_kv, B = p.block_size;
  if (r >= p.n_layers * 2u * H * B) return;
  const uint row = r % B, tile = r / B;  // tile = (layer * 2 + kv) * H + h
  const uint h = tile % H, is_v = (tile / H) % 2u, il = tile / (2u * H);
  if (row >= uint(job[3u * j + 2u])) return;
  const uint sblk = uint(job[3u * j]), dblk = uint(job[3u * j + 1u]);
  const uint src_tile = 2u * B * p.head_dim;  // fp16 tiles
  const uint src_layer = 2u * H * src_tile;
  src_at = p.src_base + sblk * p.src_block_bytes + il * src_layer + (is_v * H + h) * src_tile +
           row * 2u * p.head_dim;
  const uint type = is_v != 0u ? p.v_type : p.k_type, g = is_v != 0u ? p.v_group : p.k_group;
  if (kv_is_chan(type)) return;  // a per-channel side: kv_chan.comp
  const uint dst_layer = H * (p.dst_k_tile + p.dst_v_tile);
  const uint dst_tile0 = p.dst_base + dblk * p.dst_block_bytes + il * dst_layer +
                         (is_v != 0u ? H * p.dst_k_tile + h * p.dst_v_tile : h * p.dst_k_tile);
  kv_encode_row(type, p.head_dim, g, dst_tile0 + row * kv_row_bytes(type, p.head_dim, g));
}
