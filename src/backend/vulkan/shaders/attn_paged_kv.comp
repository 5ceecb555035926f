#version 450
// Paged causal attention over K/V in any KV format (the rows of f16, fp8_e4m3, int8, int4_asym,
// the tiles of int4_channel and int8_channel; kv_codec.glsl) and over two pools at once (a mixed
// layout's FP16 sink/window pool and its quantised body pool: each block-table entry names its
// pool), each pool bound as up to four parts (a pool larger than one binding is split). Codes
// are decoded in registers as they are read; no dequantised copy of a block is written.
// One workgroup per (query token, KV head, chunk of up to heads_per_wg of its query heads): each
// key and value is decoded once for all the query heads that share it (GQA). Keys 64 at a time
// (one per lane), online softmax (running max m, sum l) per head, V accumulated per dimension.
// A token's keys are cut into splits (attn_split.glsl: a grid fixed by its own position): with
// split_wg = 0 one workgroup runs every split and merges them in order; with split_wg = 1 the
// workgroup z runs split z alone and writes its (m, l, unnormalised output) to the scratch, and
// attn_split_merge.comp merges them in the same order with the same arithmetic, so a token gets
// the same bits either way (decode, a few tokens, spreads over many workgroups; a prefill chunk
// has enough without). Scores follow the CPU's kernels: against fp16 keys q is rounded to fp16
// (the CPU's f16 path), against quantised keys q stays fp32 and the row scale multiplies the code
// dot (a per-channel tile: each channel's scale and zero dequantise its code).
// rotate: the keys were stored Hadamard-rotated (kv_write_q.comp), so the query is rotated first.
// meta: [8 s + 0..7] pool slot s's (k_type, v_type, k_group, v_group, block_bytes, k_tile,
// v_tile, k_base: byte offset of this layer's K tiles in block 0); then, from 16: [t] sequence,
// [n_tokens + t] position, [2 n_tokens + s] first table entry of sequence s. A table entry is
// block * 8 + binding, binding = pool slot * 4 + part (block: within the part). Token t sees
// positions max(0, pos - window + 1) .. pos (window 0: all).
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };     // [t][n_head][head_dim]
layout(std430, binding = 1) readonly buffer P0 { uint p0[]; };    // pool slot 0, parts 0..3
layout(std430, binding = 2) readonly buffer P1 { uint p1[]; };
layout(std430, binding = 3) readonly buffer P2 { uint p2[]; };
layout(std430, binding = 4) readonly buffer P3 { uint p3[]; };
layout(std430, binding = 5) readonly buffer P4 { uint p4[]; };    // pool slot 1, parts 0..3
layout(std430, binding = 6) readonly buffer P5 { uint p5[]; };
layout(std430, binding = 7) readonly buffer P6 { uint p6[]; };
layout(std430, binding = 8) readonly buffer P7 { uint p7[]; };
layout(std430, binding = 9) readonly buffer BT { int table[]; };
layout(std430, binding = 10) readonly buffer M { int meta[]; };
layout(std430, binding = 11) writeonly buffer O { float o[]; };   // [t][n_head][head_dim]
// split_wg = 1: [((t n_head + head) n_split_max + split) (head_dim + 2)]: m, l, output[head_dim]
layout(std430, binding = 12) writeonly buffer S { float part[]; };
layout(push_constant) uniform P {
  uint n_tokens; uint n_head; uint group; uint head_dim; uint block_size; uint n_head_kv;
  uint window; float scale; uint q_off; uint q_stride; uint o_off; uint o_stride; uint rotate;
  float rot_norm; uint heads_per_wg; uint head_chunks; uint n_split_max; uint split_min;
  uint split_wg;
} p;

#include "kv_codec.glsl"
#include "attn_split.glsl"

// heads_per_wg * ceil(head_dim / 64) <= 16 and heads_per_wg <= 8 (the backend's choice).
shared float qf[1024];  // the workgroup's query heads, fp32: [h][head_dim]
shared float qh[1024];  // the same rounded to fp16 (scores against f16 keys)
shared float ob[1024];  // the merged output of the splits so far, unnormalised: [h][head_dim]
shared float ps[512];   // softmax weights of the chunk's keys per head (times the V row scale)
shared float red[512];  // reductions per head: [h][lane]
shared uint v_at[64];   // byte offset of each key's V row
shared uint v_tile[64]; // and of its tile (a per-channel tile's scales)
shared uint v_slot[64]; // and its binding
uint d0[8], d1[8];      // the pool slots' descriptors (meta[0..16)), read once
uint NH;                // query heads of this workgroup

// Word w of binding b (pool slot b / 4, part b % 4). The "slot" arguments below are bindings.
uint pw(uint b, uint w) {
  switch (b) {
    case 0u: return p0[w];
    case 1u: return p1[w];
    case 2u: return p2[w];
    case 3u: return p3[w];
    case 4u: return p4[w];
    case 5u: return p5[w];
    case 6u: return p6[w];
    default: return p7[w];
  }
}
uint pb8(uint slot, uint off) { return (pw(slot, off >> 2) >> ((off & 3u) * 8u)) & 0xFFu; }
uint pb16(uint slot, uint off) { return (pw(slot, off >> 2) >> ((off & 2u) * 8u)) & 0xFFFFu; }
float ph(uint slot, uint off) { return kv_half_to_float(pb16(slot, off)); }
uint desc(uint slot, uint i) { return slot < 4u ? d0[i] : d1[i]; }

// Byte offset of row j (a position) of KV head kvh's K tile (v: V tile); slot = its binding,
// tile = the tile's byte offset there.
uint row_at(uint tstart, uint j, uint kvh, bool v, out uint slot, out uint tile) {
  const int ref = table[tstart + j / p.block_size];
  slot = uint(ref) & 7u;
  const uint blk = uint(ref) >> 3;
  const uint type = desc(slot, v ? 1u : 0u), g = desc(slot, v ? 3u : 2u);
  const uint kt = desc(slot, 5u), vt = desc(slot, 6u);
  tile = desc(slot, 7u) + blk * desc(slot, 4u) + (v ? p.n_head_kv * kt + kvh * vt : kvh * kt);
  return tile + kv_row_offset(type, p.head_dim, g, j % p.block_size);
}

// Channel c of a per-channel tile's row at `at`: the channel's scale and zero applied to its code.
float chan_value(uint slot, uint type, uint tile, uint at, uint c) {
  uint code;
  if (type == KV_INT8_CHAN) {
    code = pb8(slot, at + c);
  } else {
    const uint half_ = p.head_dim / 2u;
    const uint byte = pb8(slot, at + (c % half_));
    code = c < half_ ? (byte & 15u) : (byte >> 4);
  }
  return ph(slot, tile + 4u * c) * float(code) + ph(slot, tile + 4u * c + 2u);
}

// Scores of the key row at `at` against the workgroup's NH query heads (each code decoded once).
void key_scores(uint slot, uint at, uint tile, out float sc[8]) {
  const uint D = p.head_dim, type = desc(slot, 0u);
  for (uint h = 0u; h < 8u; ++h) sc[h] = 0.0;
  if (kv_is_chan(type)) {
    for (uint c = 0u; c < D; ++c) {
      const float x = chan_value(slot, type, tile, at, c);
      for (uint h = 0u; h < NH; ++h) sc[h] += qf[h * D + c] * x;
    }
    return;
  }
  if (type == KV_F16) {
    for (uint c = 0u; c < D; c += 2u) {
      const vec2 kk = unpackHalf2x16(pw(slot, (at + 2u * c) >> 2));  // rows are word aligned
      for (uint h = 0u; h < NH; ++h) sc[h] += qh[h * D + c] * kk.x + qh[h * D + c + 1u] * kk.y;
    }
    return;
  }
  if (type == KV_INT8 || type == KV_FP8) {
    for (uint c = 0u; c < D; ++c) {
      const uint code = pb8(slot, at + 2u + c);
      const float x = type == KV_INT8 ? float(int(code << 24) >> 24) : kv_e4m3_to_float(code);
      for (uint h = 0u; h < NH; ++h) sc[h] += qf[h * D + c] * x;
    }
    const float rs = ph(slot, at);
    for (uint h = 0u; h < NH; ++h) sc[h] *= rs;
    return;
  }
  // int4_asym: sum q (s n + z) = s sum(q n) + z sum(q), per group
  const uint g = desc(slot, 2u), half_ = g / 2u;
  for (uint b = 0u; b < D / g; ++b) {
    const uint grp = at + b * (half_ + 4u);
    float qn[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    float qsum[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    for (uint i = 0u; i < half_; ++i) {
      const uint byte = pb8(slot, grp + 4u + i);
      const float lo = float(byte & 15u), hi = float(byte >> 4);
      for (uint h = 0u; h < NH; ++h) {
        const float a = qf[h * D + b * g + i], c = qf[h * D + b * g + i + half_];
        qn[h] += a * lo + c * hi;
        qsum[h] += a + c;
      }
    }
    const float s = ph(slot, grp), z = ph(slot, grp + 2u);
    for (uint h = 0u; h < NH; ++h) sc[h] += s * qn[h] + z * qsum[h];
  }
}

// V element c of the row at `at`, without the row scale of int8 / fp8 (folded into ps).
float value_at(uint slot, uint at, uint tile, uint c) {
  const uint type = desc(slot, 1u);
  if (type == KV_F16) return ph(slot, at + 2u * c);
  if (kv_is_chan(type)) return chan_value(slot, type, tile, at, c);
  if (type == KV_INT8) return float(int(pb8(slot, at + 2u + c) << 24) >> 24);
  if (type == KV_FP8) return kv_e4m3_to_float(pb8(slot, at + 2u + c));
  const uint g = desc(slot, 3u), half_ = g / 2u, i = c % g;
  const uint grp = at + (c / g) * (half_ + 4u);
  const uint byte = pb8(slot, grp + 4u + (i % half_));
  const uint n = i < half_ ? (byte & 15u) : (byte >> 4);
  return ph(slot, grp) * float(n) + ph(slot, grp + 2u);
}

void main() {
  const uint t = gl_WorkGroupID.x, lid = gl_LocalInvocationID.x;
  const uint kvh = gl_WorkGroupID.y / p.head_chunks, chunk = gl_WorkGroupID.y % p.head_chunks;
  const uint D = p.head_dim, h0 = kvh * p.group + chunk * p.heads_per_wg;
  NH = min(p.heads_per_wg, p.group - chunk * p.heads_per_wg);
  const int seq = meta[16u + t];
  const int pos = meta[16u + p.n_tokens + t];
  const uint tstart = uint(meta[16u + 2u * p.n_tokens + uint(seq)]);
  const int first = p.window > 0u ? max(0, pos - int(p.window) + 1) : 0;
  int len, n_split;
  split_grid(first, pos, p.n_split_max, p.split_min, len, n_split);
  const int s_begin = p.split_wg != 0u ? int(gl_WorkGroupID.z) : 0;
  const int s_end = p.split_wg != 0u ? s_begin + 1 : n_split;
  if (s_begin >= n_split) return;  // the whole workgroup: a shorter token of the batch
  for (uint i = 0u; i < 8u; ++i) {
    d0[i] = uint(meta[i]);
    d1[i] = uint(meta[8u + i]);
  }
  for (uint c = lid; c < NH * D; c += 64u) qf[c] = q[p.q_off + t * p.q_stride + h0 * D + c];
  barrier();
  if (p.rotate != 0u) {
    // Keys stored Hadamard-rotated: each query head rotated the same way (the butterflies of
    // kv::hadamard_rotate, a stage's pairs side by side, then the norm), as the CPU's runner does.
    for (uint h = 1u; h < D; h *= 2u) {
      for (uint pr = lid; pr < NH * D / 2u; pr += 64u) {
        const uint base = (pr / (D / 2u)) * D, pp = pr % (D / 2u);
        const uint j = base + (pp / h) * 2u * h + pp % h;
        const float a = qf[j], b = qf[j + h];
        precise float s = a + b, d = a - b;
        qf[j] = s;
        qf[j + h] = d;
      }
      barrier();
    }
    for (uint c = lid; c < NH * D; c += 64u) {
      precise float x = qf[c] * p.rot_norm;
      qf[c] = x;
    }
    barrier();
  }
  for (uint c = lid; c < NH * D; c += 64u) {
    qh[c] = kv_half_to_float(kv_float_to_half(qf[c]));
    ob[c] = 0.0;
  }
  barrier();
  const uint DC = (D + 63u) / 64u;  // dims per lane: lid + 64 i
  float M[8], L[8];                 // the merged splits' max and sum per head
  for (uint h = 0u; h < 8u; ++h) {
    M[h] = -1.0 / 0.0;
    L[h] = 0.0;
  }
  for (int sp = s_begin; sp < s_end; ++sp) {
    const int lo = first + sp * len, hi = min(pos, lo + len - 1);
    float acc[16];  // [h][i]: dims lid + 64 i of head h
    for (uint i = 0u; i < 16u; ++i) acc[i] = 0.0;
    float m[8], l[8];
    for (uint h = 0u; h < 8u; ++h) {
      m[h] = -1.0 / 0.0;
      l[h] = 0.0;
    }
    for (int j0 = lo; j0 <= hi; j0 += 64) {
      const int j = j0 + int(lid);
      float sc[8];
      float v_scale = 1.0;
      const bool live = j <= hi;
      if (live) {
        uint slot, kt;
        const uint at = row_at(tstart, uint(j), kvh, false, slot, kt);
        key_scores(slot, at, kt, sc);
        uint vs, vt0;
        const uint va = row_at(tstart, uint(j), kvh, true, vs, vt0);
        v_at[lid] = va;
        v_tile[lid] = vt0;
        v_slot[lid] = vs;
        const uint vt = desc(vs, 1u);
        if (vt == KV_INT8 || vt == KV_FP8) v_scale = ph(vs, va);
      }
      for (uint h = 0u; h < NH; ++h) {
        sc[h] = live ? sc[h] * p.scale : -1.0 / 0.0;
        red[h * 64u + lid] = sc[h];
      }
      barrier();
      for (uint k = 32u; k > 0u; k >>= 1) {
        if (lid < k) {
          for (uint h = 0u; h < NH; ++h) red[h * 64u + lid] = max(red[h * 64u + lid], red[h * 64u + lid + k]);
        }
        barrier();
      }
      float m_new[8];
      for (uint h = 0u; h < NH; ++h) m_new[h] = max(m[h], red[h * 64u]);
      barrier();
      for (uint h = 0u; h < NH; ++h) {
        const float e = live ? exp(sc[h] - m_new[h]) : 0.0;
        ps[h * 64u + lid] = e * v_scale;
        red[h * 64u + lid] = e;
      }
      barrier();
      for (uint k = 32u; k > 0u; k >>= 1) {
        if (lid < k) {
          for (uint h = 0u; h < NH; ++h) red[h * 64u + lid] += red[h * 64u + lid + k];
        }
        barrier();
      }
      float alpha[8];
      for (uint h = 0u; h < NH; ++h) {
        alpha[h] = exp(m[h] - m_new[h]);  // 0 on the split's first chunk (m = -inf)
        l[h] = l[h] * alpha[h] + red[h * 64u];
        m[h] = m_new[h];
      }
      const int n_keys = min(64, hi - j0 + 1);
      for (uint i = 0u; i < DC; ++i) {
        const uint c = lid + 64u * i;
        if (c >= D) break;
        float a[8];
        for (uint h = 0u; h < NH; ++h) a[h] = acc[h * DC + i] * alpha[h];
        for (int jj = 0; jj < n_keys; ++jj) {
          const float v = value_at(v_slot[jj], v_at[jj], v_tile[jj], c);
          for (uint h = 0u; h < NH; ++h) a[h] += ps[h * 64u + uint(jj)] * v;
        }
        for (uint h = 0u; h < NH; ++h) acc[h * DC + i] = a[h];
      }
      barrier();
    }
    if (p.split_wg != 0u) {
      for (uint h = 0u; h < NH; ++h) {
        const uint at = ((t * p.n_head + h0 + h) * p.n_split_max + uint(sp)) * (D + 2u);
        if (lid == 0u) {
          part[at] = m[h];
          part[at + 1u] = l[h];
        }
        for (uint i = 0u; i < DC; ++i) {
          const uint c = lid + 64u * i;
          if (c < D) part[at + 2u + c] = acc[h * DC + i];
        }
      }
      return;
    }
    for (uint h = 0u; h < NH; ++h) {
      float a, b;
      split_merge(M[h], L[h], m[h], l[h], a, b);
      for (uint i = 0u; i < DC; ++i) {
        const uint c = lid + 64u * i;
        if (c < D) ob[h * D + c] = split_apply(ob[h * D + c], a, acc[h * DC + i], b);
      }
    }
  }
  for (uint h = 0u; h < NH; ++h) {
    for (uint i = 0u; i < DC; ++i) {
      const uint c = lid + 64u * i;
      if (c < D) o[p.o_off + t * p.o_stride + (h0 + h) * D + c] = ob[h * D + c] / L[h];
    }
  }
}
