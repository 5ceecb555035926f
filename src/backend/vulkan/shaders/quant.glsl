// Weight element reads in GGUF block layouts, straight from the uploaded bytes (no dequantised
// copy). The includer declares `uint w[]` (the weight buffer as 32-bit words). Offsets are bytes;
// every half-precision field sits at an even offset (all block sizes are even).

uint rd8(uint off) { return (w[off >> 2] >> ((off & 3u) * 8u)) & 0xFFu; }
uint rd16(uint off) { return (w[off >> 2] >> ((off & 2u) * 8u)) & 0xFFFFu; }  // off even
uint rd32_even(uint off) { return rd16(off) | (rd16(off + 2u) << 16); }
float rdhalf(uint off) { return unpackHalf2x16(rd16(off)).x; }
int rds8(uint off) { return int(rd8(off) << 24) >> 24; }
// Four bytes at any byte offset, byte i in bits 8i..8i+7 (one word read when aligned).
// The second word's index is clamped to the buffer: a compiler may read it on both branches.
uint rd32u(uint off) {
  const uint sh = (off & 3u) * 8u, lo = w[off >> 2];
  const uint hi = w[min((off >> 2) + 1u, uint(w.length()) - 1u)];
  return sh == 0u ? lo : (lo >> sh) | (hi << (32u - sh));
}
// Byte i (0..3) of a word from rd32u, signed.
int s8_of(uint word, uint i) { return int(word << (24u - 8u * i)) >> 24; }

#if defined(WTYPE_F32)
const uint QK = 1u, BLOCK_BYTES = 4u;
#elif defined(WTYPE_F16) || defined(WTYPE_BF16)
const uint QK = 1u, BLOCK_BYTES = 2u;
#elif defined(WTYPE_Q8_0)
const uint QK = 32u, BLOCK_BYTES = 34u;
#elif defined(WTYPE_Q4_0)
const uint QK = 32u, BLOCK_BYTES = 18u;
#elif defined(WTYPE_Q4_1)
const uint QK = 32u, BLOCK_BYTES = 20u;
#elif defined(WTYPE_Q5_0)
const uint QK = 32u, BLOCK_BYTES = 22u;
#elif defined(WTYPE_Q5_1)
const uint QK = 32u, BLOCK_BYTES = 24u;
#elif defined(WTYPE_Q4_K)
const uint QK = 256u, BLOCK_BYTES = 144u;
#elif defined(WTYPE_Q5_K)
const uint QK = 256u, BLOCK_BYTES = 176u;
#elif defined(WTYPE_Q6_K)
const uint QK = 256u, BLOCK_BYTES = 210u;
#else
#error "define one WTYPE_*"
#endif

#if defined(WTYPE_Q4_K) || defined(WTYPE_Q5_K)
// 6-bit scale and min of group g (0..7) from the 12 packed bytes at s.
void scale_min_k4(uint s, uint g, out float sc, out float m) {
  if (g < 4u) {
    sc = float(rd8(s + g) & 63u);
    m = float(rd8(s + g + 4u) & 63u);
  } else {
    sc = float((rd8(s + g + 4u) & 0xFu) | ((rd8(s + g - 4u) >> 6) << 4));
    m = float((rd8(s + g + 4u) >> 4) | ((rd8(s + g) >> 6) << 4));
  }
}
#endif

// Element k of the row starting at byte row_off.
float wget(uint row_off, uint k) {
  const uint b = row_off + (k / QK) * BLOCK_BYTES;
  const uint e = k % QK;
#if defined(WTYPE_F32)
  return uintBitsToFloat(w[b >> 2]);
#elif defined(WTYPE_F16)
  return rdhalf(b);
#elif defined(WTYPE_BF16)
  return uintBitsToFloat(rd16(b) << 16);
#elif defined(WTYPE_Q8_0)
  return rdhalf(b) * float(rds8(b + 2u + e));
#elif defined(WTYPE_Q4_0)
  const uint q = (rd8(b + 2u + (e & 15u)) >> ((e >> 4) * 4u)) & 15u;
  return rdhalf(b) * (float(q) - 8.0);
#elif defined(WTYPE_Q4_1)
  const uint q = (rd8(b + 4u + (e & 15u)) >> ((e >> 4) * 4u)) & 15u;
  return rdhalf(b) * float(q) + rdhalf(b + 2u);
#elif defined(WTYPE_Q5_0)
  const uint qh = rd32_even(b + 2u);
  const uint q = ((rd8(b + 6u + (e & 15u)) >> ((e >> 4) * 4u)) & 15u) | (((qh >> e) & 1u) << 4);
  return rdhalf(b) * (float(q) - 16.0);
#elif defined(WTYPE_Q5_1)
  const uint qh = rd32_even(b + 4u);
  const uint q = ((rd8(b + 8u + (e & 15u)) >> ((e >> 4) * 4u)) & 15u) | (((qh >> e) & 1u) << 4);
  return rdhalf(b) * float(q) + rdhalf(b + 2u);
#elif defined(WTYPE_Q4_K)
  const uint g = e / 32u;
  float sc, m;
  scale_min_k4(b + 4u, g, sc, m);
  const uint q = (rd8(b + 16u + 32u * (g / 2u) + (e % 32u)) >> ((g & 1u) * 4u)) & 15u;
  return rdhalf(b) * sc * float(q) - rdhalf(b + 2u) * m;
#elif defined(WTYPE_Q5_K)
  const uint g = e / 32u;
  float sc, m;
  scale_min_k4(b + 4u, g, sc, m);
  const uint lo = (rd8(b + 48u + 32u * (g / 2u) + (e % 32u)) >> ((g & 1u) * 4u)) & 15u;
  const uint hi = (rd8(b + 16u + (e % 32u)) >> g) & 1u;
  return rdhalf(b) * sc * float(lo | (hi << 4)) - rdhalf(b + 2u) * m;
#elif defined(WTYPE_Q6_K)
  const uint h = e / 128u, r = e % 128u, j = r / 32u, l = r % 32u;
  const uint lo = (rd8(b + 64u * h + l + (j & 1u) * 32u) >> ((j >> 1) * 4u)) & 15u;
  const uint hi = (rd8(b + 128u + 32u * h + l) >> (2u * j)) & 3u;
  const int q = int(lo | (hi << 4)) - 32;
  const float sc = float(rds8(b + 192u + 8u * h + l / 16u + 2u * j));
  return rdhalf(b + 208u) * sc * float(q);
#endif
}

// Elements k..k+3 of the row at row_off (k a multiple of 4: the four share a block and, in every
// format here, their scales): each is wget(row_off, k + i)'s value, with the block's address and
// scales decoded once.
vec4 wget4(uint row_off, uint k) {
#if defined(WTYPE_F32) || defined(WTYPE_F16) || defined(WTYPE_BF16)
  return vec4(wget(row_off, k), wget(row_off, k + 1u), wget(row_off, k + 2u), wget(row_off, k + 3u));
#else
  const uint b = row_off + (k / QK) * BLOCK_BYTES;
  const uint e = k % QK;
  vec4 r;
#if defined(WTYPE_Q8_0)
  const float d = rdhalf(b);
  const uint qw = rd32u(b + 2u + e);
  for (uint i = 0u; i < 4u; ++i) r[i] = d * float(s8_of(qw, i));
#elif defined(WTYPE_Q4_0) || defined(WTYPE_Q4_1)
#if defined(WTYPE_Q4_0)
  const uint qs = b + 2u;
#else
  const uint qs = b + 4u;
  const float m = rdhalf(b + 2u);
#endif
  const float d = rdhalf(b);
  const uint qw = rd32u(qs + (e & 15u)) >> ((e >> 4) * 4u);
  for (uint i = 0u; i < 4u; ++i) {
    const uint q = (qw >> (8u * i)) & 15u;
#if defined(WTYPE_Q4_0)
    r[i] = d * (float(q) - 8.0);
#else
    r[i] = d * float(q) + m;
#endif
  }
#elif defined(WTYPE_Q5_0) || defined(WTYPE_Q5_1)
#if defined(WTYPE_Q5_0)
  const uint qh = rd32_even(b + 2u), qs = b + 6u;
#else
  const uint qh = rd32_even(b + 4u), qs = b + 8u;
  const float m = rdhalf(b + 2u);
#endif
  const float d = rdhalf(b);
  const uint qw = rd32u(qs + (e & 15u)) >> ((e >> 4) * 4u);
  for (uint i = 0u; i < 4u; ++i) {
    const uint q = ((qw >> (8u * i)) & 15u) | (((qh >> (e + i)) & 1u) << 4);
#if defined(WTYPE_Q5_0)
    r[i] = d * (float(q) - 16.0);
#else
    r[i] = d * float(q) + m;
#endif
  }
#elif defined(WTYPE_Q4_K) || defined(WTYPE_Q5_K)
  const uint g = e / 32u;
  float sc, m;
  scale_min_k4(b + 4u, g, sc, m);
  const float ds = rdhalf(b) * sc, dm = rdhalf(b + 2u) * m;
  const uint l0 = e % 32u;
#if defined(WTYPE_Q4_K)
  const uint qw = rd32u(b + 16u + 32u * (g / 2u) + l0) >> ((g & 1u) * 4u);
#else
  const uint qw = rd32u(b + 48u + 32u * (g / 2u) + l0) >> ((g & 1u) * 4u);
  const uint hw = rd32u(b + 16u + l0) >> g;
#endif
  for (uint i = 0u; i < 4u; ++i) {
#if defined(WTYPE_Q4_K)
    const uint q = (qw >> (8u * i)) & 15u;
#else
    const uint q = ((qw >> (8u * i)) & 15u) | (((hw >> (8u * i)) & 1u) << 4);
#endif
    r[i] = ds * float(q) - dm;
  }
#elif defined(WTYPE_Q6_K)
  const uint h = e / 128u, rr = e % 128u, j = rr / 32u, l0 = rr % 32u;
  const float ds = rdhalf(b + 208u) * float(rds8(b + 192u + 8u * h + l0 / 16u + 2u * j));
  const uint lw = rd32u(b + 64u * h + l0 + (j & 1u) * 32u) >> ((j >> 1) * 4u);
  const uint hw = rd32u(b + 128u + 32u * h + l0) >> (2u * j);
  for (uint i = 0u; i < 4u; ++i) {
    const uint lo = (lw >> (8u * i)) & 15u;
    const uint hi = (hw >> (8u * i)) & 3u;
    r[i] = ds * float(int(lo | (hi << 4)) - 32);
  }
#endif
  return r;
#endif
}
