// The KV formats of bie/backend/kv_format.h (the rows of f16, fp8_e4m3, int8, int4_asym_gG; the tiles
// of int4_channel_tT and int8_channel_tT), encoded and decoded exactly as the CPU's scalar trait
// table (src/kv/kv_format.cpp) does, so a block written on the device has the CPU's bytes. Every rounding step the CPU takes is reproduced in integer
// arithmetic: GLSL's packHalf2x16 rounding is implementation-defined and Vulkan lets a division be
// off by 2.5 ulp, so neither is used on the encode path.
//
// Format ids are planner::KvType's. Offsets are bytes; fp16 fields sit at even offsets.

const uint KV_F16 = 0u, KV_FP8 = 1u, KV_INT8 = 2u, KV_INT4 = 3u, KV_INT4_CHAN = 4u,
           KV_INT8_CHAN = 7u;

// The per-channel (KIVI) tiles: d (fp16 scale, fp16 zero) pairs, one per channel over the tile's
// tokens, then the tile's rows of codes (kv::chan_row_offset, kv::chan8_row_offset).
bool kv_is_chan(uint type) { return type == KV_INT4_CHAN || type == KV_INT8_CHAN; }

// Bytes of one row of head_dim d (kv::row_bytes_*): group g for int4_asym; a per-channel tile's
// rows hold codes only.
uint kv_row_bytes(uint type, uint d, uint g) {
  if (type == KV_F16) return 2u * d;
  if (type == KV_INT4) return (d / g) * (g / 2u + 4u);
  if (type == KV_INT4_CHAN) return d / 2u;
  if (type == KV_INT8_CHAN) return d;
  return d + 2u;  // fp8, int8: fp16 scale + d codes
}
// Byte offset of row r inside a tile.
uint kv_row_offset(uint type, uint d, uint g, uint r) {
  return (kv_is_chan(type) ? 4u * d : 0u) + r * kv_row_bytes(type, d, g);
}

// fp16 bits -> fp32 (exact), as quant::fp16_to_fp32.
float kv_half_to_float(uint h) {
  const uint e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  float v;
  if (e == 0u) {
    v = float(m) * 5.9604644775390625e-8;  // m * 2^-24, exact
  } else if (e == 31u) {
    v = uintBitsToFloat(0x7F800000u | (m << 13));
  } else {
    v = uintBitsToFloat(((e + 112u) << 23) | (m << 13));
  }
  return (h & 0x8000u) != 0u ? -v : v;
}

// fp32 -> fp16 bits, round to nearest even: quant::fp32_to_fp16 line by line.
uint kv_float_to_half(float f) {
  const uint x = floatBitsToUint(f);
  const uint sign = (x >> 16) & 0x8000u;
  const uint ax = x & 0x7FFFFFFFu;
  if (ax >= 0x7F800000u) return sign | (ax > 0x7F800000u ? 0x7E00u | ((ax >> 13) & 0x3FFu) : 0x7C00u);
  if (ax >= 0x477FF000u) return sign | 0x7C00u;
  if (ax < 0x38800000u) {
    if (ax <= 0x33000000u) return sign;
    const uint e = ax >> 23;
    const uint m = (ax & 0x7FFFFFu) | 0x800000u;
    const uint shift = 126u - e;
    uint q = m >> shift;
    const uint rem = m & ((1u << shift) - 1u);
    const uint half_ = 1u << (shift - 1u);
    if (rem > half_ || (rem == half_ && (q & 1u) != 0u)) ++q;
    return sign | q;
  }
  uint base = (ax - (112u << 23)) >> 13;
  const uint rem = ax & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (base & 1u) != 0u)) ++base;
  return sign | base;
}

// a / b rounded to nearest even, as IEEE fp32 division on the CPU, for a >= 0, b > 0 finite and
// normal (long division of the significands). A quotient below 2^-126, or an a below it, gives 0
// (the CPU would give a subnormal; every caller rounds it to fp16 zero or multiplies it by codes
// that are then 0 too).
float kv_div_rn(float a, float b) {
  const uint xa = floatBitsToUint(a), xb = floatBitsToUint(b);
  const int ea = int(xa >> 23), eb = int(xb >> 23);
  if (ea == 0) return 0.0;
  uint r = (xa & 0x7FFFFFu) | 0x800000u;
  const uint d = (xb & 0x7FFFFFu) | 0x800000u;
  int biased = ea - eb + 127;
  if (r < d) {
    r <<= 1;
    --biased;
  }
  uint q = 0u;  // r / d in [1, 2): 24 significand bits and a round bit
  for (int i = 0; i < 25; ++i) {
    q <<= 1;
    if (r >= d) {
      r -= d;
      q |= 1u;
    }
    r <<= 1;
  }
  uint mant = q >> 1;
  if ((q & 1u) != 0u && (r != 0u || (mant & 1u) != 0u)) ++mant;
  if (biased <= 0) return 0.0;
  return uintBitsToFloat((uint(biased) << 23) + mant - 0x800000u);  // a carry bumps the exponent
}

// a / b for any finite a and b > 0 normal: kv_div_rn on |a|, the sign put back.
float kv_div_signed(float a, float b) {
  return a < 0.0 ? -kv_div_rn(-a, b) : kv_div_rn(a, b);
}

// kv::fp32_to_e4m3: round to nearest even, |x| >= 448 saturates, NaN -> 0.
uint kv_float_to_e4m3(float x) {
  if (isnan(x)) return 0u;
  const uint sign = (floatBitsToUint(x) >> 31) != 0u ? 0x80u : 0u;
  const float a = abs(x);
  if (a >= 448.0) return sign | 0x7Eu;
  if (a < 0.015625) return sign | uint(roundEven(a * 512.0));
  int e;
  const float fr = frexp(a, e);
  int ex = e - 1 + 7;
  precise float mf = (2.0 * fr - 1.0) * 8.0;  // exact: fr in [0.5, 1)
  int m = int(roundEven(mf));
  if (m == 8) {
    m = 0;
    ++ex;
  }
  if (ex > 15 || (ex == 15 && m > 6)) return sign | 0x7Eu;
  return sign | (uint(ex) << 3) | uint(m);
}

// kv::e4m3_to_fp32: the code's bits as an fp16 with bias 15, times 256.
float kv_e4m3_to_float(uint c) {
  return kv_half_to_float(((c & 0x80u) << 8) | ((c & 0x7Fu) << 7)) * 256.0;
}
