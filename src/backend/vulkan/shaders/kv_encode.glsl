// Encoding one row of a row-wise KV format (kv_codec.glsl, included first). The includer defines,
// before including this file:
//   float kv_src(uint i)    value i of the row being encoded (fp32)
//   KV_DST                   the destination buffer's uint array
// Bytes are gathered into 32-bit words; a word the row shares with a neighbouring row (rows of
// d + 2 bytes are 2-byte aligned) is merged with atomics, so rows written by different
// invocations never clobber each other.
uint kv_wb_word = 0xFFFFFFFFu, kv_wb_val = 0u, kv_wb_mask = 0u;
void kv_wb_flush() {
  if (kv_wb_mask == 0u) return;
  if (kv_wb_mask == 0xFFFFFFFFu) {
    KV_DST[kv_wb_word] = kv_wb_val;
  } else {
    atomicAnd(KV_DST[kv_wb_word], ~kv_wb_mask);
    atomicOr(KV_DST[kv_wb_word], kv_wb_val);
  }
  kv_wb_mask = 0u;
  kv_wb_val = 0u;
}
void kv_put8(uint off, uint b) {
  const uint w = off >> 2;
  if (w != kv_wb_word) {
    kv_wb_flush();
    kv_wb_word = w;
  }
  const uint sh = (off & 3u) * 8u;
  kv_wb_val |= (b & 0xFFu) << sh;
  kv_wb_mask |= 0xFFu << sh;
}
void kv_put16(uint off, uint h) {
  kv_put8(off, h);
  kv_put8(off + 1u, h >> 8);
}

// Encodes kv_src(0 .. d-1) as one row of `type` at byte `off` of KV_DST (scaled_store /
// int4_store / f16_store of kv_format.cpp).
void kv_encode_row(uint type, uint d, uint g, uint off) {
  if (type == KV_F16) {
    for (uint i = 0u; i < d; ++i) kv_put16(off + 2u * i, kv_float_to_half(kv_src(i)));
  } else if (type == KV_INT8 || type == KV_FP8) {
    float amax = 0.0;
    for (uint i = 0u; i < d; ++i) amax = max(amax, abs(kv_src(i)));
    const uint sh = kv_float_to_half(kv_div_rn(amax, type == KV_INT8 ? 127.0 : 448.0));
    kv_put16(off, sh);
    const float s = kv_half_to_float(sh);
    const float inv = s > 0.0 ? kv_div_rn(1.0, s) : 0.0;
    for (uint i = 0u; i < d; ++i) {
      precise float v = kv_src(i) * inv;
      const uint c = type == KV_INT8 ? uint(int(clamp(roundEven(v), -127.0, 127.0))) & 0xFFu
                                     : kv_float_to_e4m3(v);
      kv_put8(off + 2u + i, c);
    }
  } else {  // KV_INT4
    const uint half_ = g / 2u;
    for (uint b = 0u; b < d / g; ++b) {
      const uint g0 = b * g, grp = off + b * (half_ + 4u);
      float mn = kv_src(g0), mx = mn;
      for (uint i = 1u; i < g; ++i) {
        mn = min(mn, kv_src(g0 + i));
        mx = max(mx, kv_src(g0 + i));
      }
      precise float range = mx - mn;
      const uint sh = kv_float_to_half(range > 0.0 ? kv_div_rn(range, 15.0) : 0.0);
      const uint zh = kv_float_to_half(mn);
      kv_put16(grp, sh);
      kv_put16(grp + 2u, zh);
      const float s = kv_half_to_float(sh), z = kv_half_to_float(zh);
      const float inv = s > 0.0 ? kv_div_rn(1.0, s) : 0.0;
      for (uint i = 0u; i < half_; ++i) {
        precise float lo = (kv_src(g0 + i) - z) * inv;
        precise float hi = (kv_src(g0 + i + half_) - z) * inv;
        const uint nl = uint(clamp(roundEven(lo), 0.0, 15.0));
        const uint nh = uint(clamp(roundEven(hi), 0.0, 15.0));
        kv_put8(grp + 4u + i, nl | (nh << 4));
      }
    }
  }
  kv_wb_flush();
}
