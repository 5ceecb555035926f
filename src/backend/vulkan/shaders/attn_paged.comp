#version 450
// Paged causal attention with fp16 K/V, one workgroup per (query token, query head). Keys are
// visited 64 at a time (one per lane: score = q . k, q rounded to fp16 as the CPU's f16 path),
// with an online softmax (running max m, sum l) and the V rows accumulated per dimension.
// K/V element (block b, kv head h, row j, dim c) sits at half index
//   b * block_stride + h * head_stride + j * head_dim + c   (block_stride, head_stride in halves)
// of the pool plus k_off / v_off (this layer's first K / V tile, in halves). Token t belongs to sequence
// meta's seq[t], sits at position pos[t] and sees positions max(0, pos - window + 1) .. pos
// (window 0: all). GQA: query head qh reads KV head qh / group.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };     // [t][n_head][head_dim]
layout(std430, binding = 1) readonly buffer K { uint kw[]; };     // fp16 pairs
layout(std430, binding = 2) readonly buffer V { uint vw[]; };
layout(std430, binding = 3) readonly buffer BT { int table[]; };  // block ids, per sequence
// [t] seq, [n_tokens + t] pos, [2 n_tokens + s] first table entry of sequence s
layout(std430, binding = 4) readonly buffer M { int meta[]; };
layout(std430, binding = 5) writeonly buffer O { float o[]; };    // [t][n_head][head_dim]
layout(push_constant) uniform P {
  uint n_tokens; uint n_head; uint group; uint head_dim; uint block_size; uint block_stride;
  uint head_stride; uint unused; uint window; float scale; uint q_off; uint q_stride;
  uint o_off; uint o_stride; uint k_off; uint v_off;
} p;
shared float qs[512];
shared float ps[64];
shared float red[64];
void main() {
  const uint t = gl_WorkGroupID.x, qh = gl_WorkGroupID.y, lid = gl_LocalInvocationID.x;
  const uint D = p.head_dim, kvh = qh / p.group;
  const int seq = meta[t];
  const int pos = meta[p.n_tokens + t];
  const uint tstart = uint(meta[2u * p.n_tokens + uint(seq)]);
  const int first = p.window > 0u ? max(0, pos - int(p.window) + 1) : 0;
  for (uint c = lid; c < D; c += 64u) {
    qs[c] = unpackHalf2x16(packHalf2x16(vec2(q[p.q_off + t * p.q_stride + qh * D + c], 0.0))).x;
  }
  barrier();
  float acc[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};  // dims lid + 64 i
  float m = -1.0 / 0.0, l = 0.0;
  for (int j0 = first; j0 <= pos; j0 += 64) {
    const int j = j0 + int(lid);
    float s = -1.0 / 0.0;
    if (j <= pos) {
      const uint blk = uint(table[tstart + uint(j) / p.block_size]);
      const uint base = p.k_off + blk * p.block_stride + kvh * p.head_stride + (uint(j) % p.block_size) * D;
      float dot = 0.0;
      for (uint c = 0u; c < D; c += 2u) {
        const vec2 kk = unpackHalf2x16(kw[(base + c) >> 1]);  // base and D are even
        dot += qs[c] * kk.x + qs[c + 1u] * kk.y;
      }
      s = dot * p.scale;
    }
    red[lid] = s;
    barrier();
    for (uint k = 32u; k > 0u; k >>= 1) {
      if (lid < k) red[lid] = max(red[lid], red[lid + k]);
      barrier();
    }
    const float m_new = max(m, red[0]);
    barrier();
    const float e = j <= pos ? exp(s - m_new) : 0.0;
    ps[lid] = e;
    red[lid] = e;
    barrier();
    for (uint k = 32u; k > 0u; k >>= 1) {
      if (lid < k) red[lid] += red[lid + k];
      barrier();
    }
    const float alpha = exp(m - m_new);  // 0 on the first chunk (m = -inf)
    l = l * alpha + red[0];
    m = m_new;
    const int n_keys = min(64, pos - j0 + 1);
    for (uint i = 0u; i < 8u; ++i) {
      const uint c = lid + 64u * i;
      if (c >= D) break;
      float a = acc[i] * alpha;
      for (int jj = 0; jj < n_keys; ++jj) {
        const uint jk = uint(j0 + jj);
        const uint blk = uint(table[tstart + jk / p.block_size]);
        const uint idx = p.v_off + blk * p.block_stride + kvh * p.head_stride + (jk % p.block_size) * D + c;
        const vec2 vv = unpackHalf2x16(vw[idx >> 1]);
        a += ps[jj] * ((idx & 1u) == 0u ? vv.x : vv.y);
      }
      acc[i] = a;
    }
    barrier();
  }
  for (uint i = 0u; i < 8u; ++i) {
    const uint c = lid + 64u * i;
    if (c < D) o[p.o_off + t * p.o_stride + qh * D + c] = l > 0.0 ? acc[i] / l : 0.0;
  }
}
