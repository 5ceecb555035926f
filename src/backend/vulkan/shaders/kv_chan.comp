#version 450
// Per-channel KV tiles (int4_channel_tT, int8_channel_tT; kv_chan_encode.glsl) written whole on
// the device, from one of two sources:
//   src_kind 0 (Backend::quantise_blocks, a window exit): the FP16 block job[2 j + 1] of the fp16
//     pool in S16, every layer of the group (fp16 -> fp32 exactly, then the store);
//   src_kind 1 (Backend::kv_write of a whole body block): tokens job[2 j + 1] .. + T - 1 of the
//     layer's K / V rows (F32), rounded to fp16 first when round_fp16 (a mixed layout's body).
// into body block job[2 j] of the pool in Dst. Only the per-channel sides (K and/or V) are
// written; kv_write_q / kv_quantise write the row-wise side. One invocation per (job, layer, K/V,
// KV head, quad of channels).
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer S16 { uint s16[]; };  // fp16 pool (src_kind 0)
layout(std430, binding = 1) readonly buffer SK { float sk[]; };   // K rows (src_kind 1)
layout(std430, binding = 2) readonly buffer SV { float sv[]; };   // V rows (src_kind 1)
layout(std430, binding = 3) readonly buffer J { int job[]; };
layout(std430, binding = 4) buffer Dst { uint dst[]; };
layout(push_constant) uniform P {
  uint n_layers; uint n_head_kv; uint head_dim; uint block_size; uint k_type; uint v_type;
  uint src_kind; uint round_fp16; uint src_block_bytes; uint src_base;
  uint k_off; uint k_stride; uint v_off; uint v_stride;
  uint dst_block_bytes; uint dst_k_tile; uint dst_v_tile; uint dst_base;
} p;

#include "kv_codec.glsl"

uint g_src, g_il, g_h;  // the job's source block or first token; layer; KV head
bool g_v;
float kv_tile_src(uint t, uint c) {
  const uint d = p.head_dim;
  if (p.src_kind == 0u) {
    const uint src_tile = 2u * p.block_size * d;  // fp16 tiles
    const uint off = p.src_base + g_src * p.src_block_bytes + g_il * 2u * p.n_head_kv * src_tile +
                     ((g_v ? p.n_head_kv : 0u) + g_h) * src_tile + 2u * (t * d + c);
    return kv_half_to_float((s16[off >> 2] >> ((off & 2u) * 8u)) & 0xFFFFu);
  }
  const uint tok = g_src + t;
  const float x = g_v ? sv[p.v_off + tok * p.v_stride + g_h * d + c]
                      : sk[p.k_off + tok * p.k_stride + g_h * d + c];
  return p.round_fp16 != 0u ? kv_half_to_float(kv_float_to_half(x)) : x;
}
#define KV_DST dst
#include "kv_chan_encode.glsl"

void main() {
  const uint r = gl_GlobalInvocationID.x, j = gl_WorkGroupID.y;
  const uint H = p.n_head_kv, d = p.head_dim, quads = d / 4u;
  if (r >= p.n_layers * 2u * H * quads) return;
  const uint qd = r % quads, tile = r / quads;  // tile = (layer * 2 + kv) * H + h
  g_h = tile % H;
  g_v = (tile / H) % 2u != 0u;
  g_il = tile / (2u * H);
  const uint type = g_v ? p.v_type : p.k_type;
  if (!kv_is_chan(type) || (type == KV_INT4_CHAN && qd >= d / 8u)) return;
  g_src = uint(job[2u * j + 1u]);
  const uint dblk = uint(job[2u * j]);
  const uint tile0 = p.dst_base + dblk * p.dst_block_bytes + g_il * H * (p.dst_k_tile + p.dst_v_tile) +
                     (g_v ? H * p.dst_k_tile + g_h * p.dst_v_tile : g_h * p.dst_k_tile);
  kv_encode_chan_quad(type, d, p.block_size, tile0, qd);
}
