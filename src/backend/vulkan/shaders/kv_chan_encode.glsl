// Encoding one per-channel KV tile (int4_channel_tT, int8_channel_tT) as the CPU's scalar store
// does (chan_store / chan8_store in src/kv/kv_format.cpp): every float operation of the CPU's
// grid fit in the same order, `precise` (no contraction into fma), divisions correctly rounded
// (kv_div_rn), min / max as std::min / std::max compare. kv_codec.glsl is included first; the
// includer defines, before including this file:
//   float kv_tile_src(uint t, uint c)   value of channel c of the tile's token t (fp32)
//   KV_DST                               the destination buffer's uint array

// A channel's grid as the CPU's Int4Params: the fp16 bits stored and their fp32 values.
struct KvChanGrid {
  uint sh, zh;
  float s, z, inv;
};

KvChanGrid kv_chan_grid(float scale, float zero) {
  KvChanGrid p;
  p.sh = kv_float_to_half(scale);
  p.zh = kv_float_to_half(zero);
  p.s = kv_half_to_float(p.sh);
  p.z = kv_half_to_float(p.zh);
  p.inv = p.s > 0.0 && !isinf(p.s) ? kv_div_rn(1.0, p.s) : 0.0;  // the CPU's 1 / inf is 0
  return p;
}

// The nearest code in [0, levels] (nearest_code: clamped, rounded to even, clamped).
uint kv_chan_code(KvChanGrid p, float v, float levels) {
  precise float y = (v - p.z) * p.inv;
  const float q = roundEven(clamp(y, -1.0, levels + 1.0));
  return uint(clamp(q, 0.0, levels));
}

// Channel c's minimum and maximum over the tile's T tokens.
void kv_chan_min_max(uint c, uint T, out float mn, out float mx) {
  mn = kv_tile_src(0u, c);
  mx = mn;
  for (uint t = 1u; t < T; ++t) {
    const float x = kv_tile_src(t, c);
    mn = x < mn ? x : mn;  // std::min(mn, x)
    mx = mx < x ? x : mx;  // std::max(mx, x)
  }
}

// Squared error of channel c coded with p (int4_sq_error).
float kv_chan_sq_error(KvChanGrid p, uint c, uint T) {
  precise float e = 0.0;
  for (uint t = 0u; t < T; ++t) {
    const float v = kv_tile_src(t, c);
    precise float r = v - (p.s * float(kv_chan_code(p, v, 15.0)) + p.z);
    e += r * r;
  }
  return e;
}

// int4_channel's grid of channel c (fit_channels + fit_channel_grids): min/max, or the fitted
// candidate with the least residual if it codes the tile with less squared error.
KvChanGrid kv_chan_fit4(uint c, uint T) {
  float mn, mx;
  kv_chan_min_max(c, T, mn, mx);
  precise float range = mx - mn;
  precise float sx = 0.0, sxx = 0.0;
  for (uint t = 0u; t < T; ++t) {
    precise float v = kv_tile_src(t, c) - mn;
    sx += v;
    sxx += v * v;
  }
  const float n = float(T);
  float best = 1.0 / 0.0, bs = 0.0, bz = 0.0;
  for (int step = -3; step <= 3; ++step) {
    precise float levels = 15.0 + 0.2 * float(step);
    const float inv = range > 0.0 ? kv_div_rn(levels, range) : 0.0;
    precise float sq = 0.0, sqq = 0.0, sqx = 0.0;
    for (uint t = 0u; t < T; ++t) {
      precise float v = kv_tile_src(t, c) - mn;
      precise float y = v * inv + 0.5;
      const float q = float(min(int(y), 15));
      sq += q;
      sqq += q * q;
      sqx += q * v;
    }
    precise float det = n * sqq - sq * sq;
    if (!(det > 0.0)) continue;  // the CPU's scale 0: never kept
    precise float num = n * sqx - sq * sx;
    const float scale = kv_div_signed(num, det);
    precise float zn = sx - scale * sq;
    const float zero = kv_div_signed(zn, n);
    precise float resid = sxx - 2.0 * scale * sqx - 2.0 * zero * sx + scale * scale * sqq +
                          2.0 * scale * zero * sq + n * zero * zero;
    if (scale > 0.0 && resid < best) {
      best = resid;
      bs = scale;
      precise float z = zero + mn;
      bz = z;
    }
  }
  KvChanGrid grid = kv_chan_grid(kv_div_rn(range, 15.0), mn);
  if (bs > 0.0) {
    const KvChanGrid p = kv_chan_grid(bs, bz);
    if (p.s > 0.0 && !isinf(p.s) && !isnan(p.s) && !isinf(p.z) && !isnan(p.z) &&
        kv_chan_sq_error(p, c, T) < kv_chan_sq_error(grid, c, T)) {
      grid = p;
    }
  }
  return grid;
}

// int8_channel's grid of channel c: min/max over 255 levels (int4_params).
KvChanGrid kv_chan_fit8(uint c, uint T) {
  float mn, mx;
  kv_chan_min_max(c, T, mn, mx);
  precise float range = mx - mn;
  return kv_chan_grid(kv_div_rn(range, 255.0), mn);
}

// Channels 4 qd .. 4 qd + 3 of the tile at byte `tile` (int4_channel: with their partners
// c + d/2, which share their code bytes): their (scale, zero) words and their code words of
// every row. An invocation owns whole 32-bit words (d a multiple of 8, the tile 4-byte aligned).
void kv_encode_chan_quad(uint type, uint d, uint T, uint tile, uint qd) {
  const uint c0 = 4u * qd;
  if (type == KV_INT4_CHAN) {
    const uint half_ = d / 2u;
    KvChanGrid lo[4], hi[4];
    for (uint i = 0u; i < 4u; ++i) {
      lo[i] = kv_chan_fit4(c0 + i, T);
      hi[i] = kv_chan_fit4(c0 + i + half_, T);
      KV_DST[(tile >> 2) + c0 + i] = lo[i].sh | (lo[i].zh << 16);
      KV_DST[(tile >> 2) + c0 + i + half_] = hi[i].sh | (hi[i].zh << 16);
    }
    for (uint t = 0u; t < T; ++t) {
      uint w = 0u;
      for (uint i = 0u; i < 4u; ++i) {
        const uint nl = kv_chan_code(lo[i], kv_tile_src(t, c0 + i), 15.0);
        const uint nh = kv_chan_code(hi[i], kv_tile_src(t, c0 + i + half_), 15.0);
        w |= (nl | (nh << 4)) << (8u * i);
      }
      KV_DST[(tile + kv_row_offset(type, d, T, t) + c0) >> 2] = w;
    }
  } else {  // KV_INT8_CHAN
    KvChanGrid g[4];
    for (uint i = 0u; i < 4u; ++i) {
      g[i] = kv_chan_fit8(c0 + i, T);
      KV_DST[(tile >> 2) + c0 + i] = g[i].sh | (g[i].zh << 16);
    }
    for (uint t = 0u; t < T; ++t) {
      uint w = 0u;
      for (uint i = 0u; i < 4u; ++i) {
        w |= kv_chan_code(g[i], kv_tile_src(t, c0 + i), 255.0) << (8u * i);
      }
      KV_DST[(tile + kv_row_offset(type, d, T, t) + c0) >> 2] = w;
    }
  }
}
