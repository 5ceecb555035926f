// Scalar reference kernels for every supported type: the definition every SIMD path is tested
// against. Formulas and evaluation order follow ggml's reference C code so that dequantised
// values are bit-exact.
#include <algorithm>
#include <array>
#include <cassert>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "bie/quant/fp16.h"
#include "quant/quant_internal.h"

namespace bie::quant {

namespace {

inline float h2f(half_bits h) {
  return fp16_to_fp32(h);
}

// ---- F32 / F16 / BF16 --------------------------------------------------------------------

void to_float_f32(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}
void from_float_f32(const float* src, void* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}
void to_float_f16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
}
void from_float_f16(const float* src, void* dst, int64_t n) {
  auto* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(src[i]);
}
void to_float_bf16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
}
void from_float_bf16(const float* src, void* dst, int64_t n) {
  auto* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_bf16(src[i]);
}

// Dots accumulate in double: the reference should be the most accurate path.
float vec_dot_f32(int64_t n, const void* x, const void* y) {
  const auto* a = static_cast<const float*>(x);
  const auto* b = static_cast<const float*>(y);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return static_cast<float>(s);
}
float vec_dot_f16(int64_t n, const void* x, const void* y) {
  const auto* a = static_cast<const uint16_t*>(x);
  const auto* b = static_cast<const uint16_t*>(y);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(fp16_to_fp32(a[i])) * fp16_to_fp32(b[i]);
  return static_cast<float>(s);
}
float vec_dot_bf16(int64_t n, const void* x, const void* y) {
  const auto* a = static_cast<const uint16_t*>(x);
  const auto* b = static_cast<const uint16_t*>(y);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(bf16_to_fp32(a[i])) * bf16_to_fp32(b[i]);
  return static_cast<float>(s);
}

// ---- Q4_0 / Q4_1 / Q5_0 / Q5_1 -----------------------------------------------------------

void to_float_q4_0(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ4_0*>(src);
  for (int64_t i = 0; i < n / kQK32; ++i, y += kQK32) {
    const float d = h2f(b[i].d);
    for (int j = 0; j < kQK32 / 2; ++j) {
      y[j] = static_cast<float>((b[i].qs[j] & 0xF) - 8) * d;
      y[j + 16] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void to_float_q4_1(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ4_1*>(src);
  for (int64_t i = 0; i < n / kQK32; ++i, y += kQK32) {
    const float d = h2f(b[i].d);
    const float m = h2f(b[i].m);
    for (int j = 0; j < kQK32 / 2; ++j) {
      y[j] = static_cast<float>(b[i].qs[j] & 0xF) * d + m;
      y[j + 16] = static_cast<float>(b[i].qs[j] >> 4) * d + m;
    }
  }
}

// Fifth bits of a Q5 block: value j's bit 4 is bit j of qh.
inline uint32_t load_qh(const uint8_t qh[4]) {
  uint32_t v;
  std::memcpy(&v, qh, 4);
  return v;
}

void to_float_q5_0(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ5_0*>(src);
  for (int64_t i = 0; i < n / kQK32; ++i, y += kQK32) {
    const float d = h2f(b[i].d);
    const uint32_t qh = load_qh(b[i].qh);
    for (int j = 0; j < kQK32 / 2; ++j) {
      const int h0 = static_cast<int>((qh >> j) << 4) & 0x10;
      const int h1 = static_cast<int>(qh >> (j + 12)) & 0x10;
      y[j] = static_cast<float>(((b[i].qs[j] & 0xF) | h0) - 16) * d;
      y[j + 16] = static_cast<float>(((b[i].qs[j] >> 4) | h1) - 16) * d;
    }
  }
}

void to_float_q5_1(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ5_1*>(src);
  for (int64_t i = 0; i < n / kQK32; ++i, y += kQK32) {
    const float d = h2f(b[i].d);
    const float m = h2f(b[i].m);
    const uint32_t qh = load_qh(b[i].qh);
    for (int j = 0; j < kQK32 / 2; ++j) {
      const int h0 = static_cast<int>((qh >> j) << 4) & 0x10;
      const int h1 = static_cast<int>(qh >> (j + 12)) & 0x10;
      y[j] = static_cast<float>((b[i].qs[j] & 0xF) | h0) * d + m;
      y[j + 16] = static_cast<float>((b[i].qs[j] >> 4) | h1) * d + m;
    }
  }
}

void to_float_q8_0(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < n / kQK32; ++i, y += kQK32) {
    const float d = h2f(b[i].d);
    for (int j = 0; j < kQK32; ++j) y[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

void to_float_q8_1(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ8_1*>(src);
  for (int64_t i = 0; i < n / kQK32; ++i, y += kQK32) {
    const float d = h2f(b[i].d);
    for (int j = 0; j < kQK32; ++j) y[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

// ggml's reference quantisers (quantize_row_q4_0_ref & co.).
void from_float_q4_0(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_0*>(dst);
  for (int64_t i = 0; i < n / kQK32; ++i, x += kQK32) {
    float amax = 0, max = 0;
    for (int j = 0; j < kQK32; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK32 / 2; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 8.5f)));
      b[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void from_float_q4_1(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_1*>(dst);
  for (int64_t i = 0; i < n / kQK32; ++i, x += kQK32) {
    float mn = FLT_MAX, mx = -FLT_MAX;
    for (int j = 0; j < kQK32; ++j) {
      mn = std::min(mn, x[j]);
      mx = std::max(mx, x[j]);
    }
    const float d = (mx - mn) / 15;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    b[i].m = fp32_to_fp16(mn);
    for (int j = 0; j < kQK32 / 2; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>((x[j] - mn) * id + 0.5f)));
      const int q1 =
          std::min(15, static_cast<int>(static_cast<int8_t>((x[j + 16] - mn) * id + 0.5f)));
      b[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void from_float_q5_0(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ5_0*>(dst);
  for (int64_t i = 0; i < n / kQK32; ++i, x += kQK32) {
    float amax = 0, max = 0;
    for (int j = 0; j < kQK32; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -16;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    uint32_t qh = 0;
    for (int j = 0; j < kQK32 / 2; ++j) {
      const int q0 = std::min(31, static_cast<int>(static_cast<int8_t>(x[j] * id + 16.5f)));
      const int q1 = std::min(31, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 16.5f)));
      b[i].qs[j] = static_cast<uint8_t>((q0 & 0xF) | ((q1 & 0xF) << 4));
      qh |= static_cast<uint32_t>((q0 & 0x10) >> 4) << j;
      qh |= static_cast<uint32_t>((q1 & 0x10) >> 4) << (j + 16);
    }
    std::memcpy(b[i].qh, &qh, 4);
  }
}

void from_float_q5_1(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ5_1*>(dst);
  for (int64_t i = 0; i < n / kQK32; ++i, x += kQK32) {
    float mn = FLT_MAX, mx = -FLT_MAX;
    for (int j = 0; j < kQK32; ++j) {
      mn = std::min(mn, x[j]);
      mx = std::max(mx, x[j]);
    }
    const float d = (mx - mn) / 31;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    b[i].m = fp32_to_fp16(mn);
    uint32_t qh = 0;
    for (int j = 0; j < kQK32 / 2; ++j) {
      const int q0 = static_cast<uint8_t>((x[j] - mn) * id + 0.5f);
      const int q1 = static_cast<uint8_t>((x[j + 16] - mn) * id + 0.5f);
      b[i].qs[j] = static_cast<uint8_t>((q0 & 0xF) | ((q1 & 0xF) << 4));
      qh |= static_cast<uint32_t>((q0 & 0x10) >> 4) << j;
      qh |= static_cast<uint32_t>((q1 & 0x10) >> 4) << (j + 16);
    }
    std::memcpy(b[i].qh, &qh, 4);
  }
}

// Q8_0 / Q8_1 follow the x86 SIMD quantiser llama.cpp runs on this hardware: d = amax / 127,
// q = round_half_even(x * (127 / amax)). (ggml's portable reference multiplies by 1/d and rounds
// half away from zero; the two differ only on exact ties.)
// Returns d in fp32 (Q8_1's s is computed from it before rounding, as ggml does).
template <typename Block>
float quantize_q8_block(const float* x, Block& b, int32_t& sum) {
  float amax = 0;
  for (int j = 0; j < kQK32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.f;
  const float id = amax != 0 ? 127.f / amax : 0.0f;
  b.d = fp32_to_fp16(d);
  sum = 0;
  for (int j = 0; j < kQK32; ++j) {
    const int q = nearest_int(x[j] * id);
    b.qs[j] = static_cast<int8_t>(q);
    sum += q;
  }
  return d;
}

void from_float_q8_0(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_0*>(dst);
  int32_t sum;
  for (int64_t i = 0; i < n / kQK32; ++i) quantize_q8_block(x + i * kQK32, b[i], sum);
}

void from_float_q8_1(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_1*>(dst);
  for (int64_t i = 0; i < n / kQK32; ++i) {
    int32_t sum = 0;
    const float d = quantize_q8_block(x + i * kQK32, b[i], sum);
    b[i].s = fp32_to_fp16(d * static_cast<float>(sum));
  }
}

float vec_dot_q4_0(int64_t n, const void* vx, const void* vy) {
  const auto* x = static_cast<const BlockQ4_0*>(vx);
  const auto* y = static_cast<const BlockQ8_0*>(vy);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK32; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQK32 / 2; ++j) {
      sumi += ((x[i].qs[j] & 0xF) - 8) * y[i].qs[j];
      sumi += ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + 16];
    }
    sum += static_cast<float>(sumi) * h2f(x[i].d) * h2f(y[i].d);
  }
  return sum;
}

float vec_dot_q4_1(int64_t n, const void* vx, const void* vy) {
  const auto* x = static_cast<const BlockQ4_1*>(vx);
  const auto* y = static_cast<const BlockQ8_1*>(vy);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK32; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQK32 / 2; ++j) {
      sumi += (x[i].qs[j] & 0xF) * y[i].qs[j];
      sumi += (x[i].qs[j] >> 4) * y[i].qs[j + 16];
    }
    sum += h2f(x[i].d) * h2f(y[i].d) * static_cast<float>(sumi) + h2f(x[i].m) * h2f(y[i].s);
  }
  return sum;
}

float vec_dot_q5_0(int64_t n, const void* vx, const void* vy) {
  const auto* x = static_cast<const BlockQ5_0*>(vx);
  const auto* y = static_cast<const BlockQ8_0*>(vy);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK32; ++i) {
    const uint32_t qh = load_qh(x[i].qh);
    int sumi = 0;
    for (int j = 0; j < kQK32 / 2; ++j) {
      const int h0 = static_cast<int>((qh >> j) << 4) & 0x10;
      const int h1 = static_cast<int>(qh >> (j + 12)) & 0x10;
      sumi += (((x[i].qs[j] & 0xF) | h0) - 16) * y[i].qs[j];
      sumi += (((x[i].qs[j] >> 4) | h1) - 16) * y[i].qs[j + 16];
    }
    sum += static_cast<float>(sumi) * h2f(x[i].d) * h2f(y[i].d);
  }
  return sum;
}

float vec_dot_q5_1(int64_t n, const void* vx, const void* vy) {
  const auto* x = static_cast<const BlockQ5_1*>(vx);
  const auto* y = static_cast<const BlockQ8_1*>(vy);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK32; ++i) {
    const uint32_t qh = load_qh(x[i].qh);
    int sumi = 0;
    for (int j = 0; j < kQK32 / 2; ++j) {
      const int h0 = static_cast<int>((qh >> j) << 4) & 0x10;
      const int h1 = static_cast<int>(qh >> (j + 12)) & 0x10;
      sumi += ((x[i].qs[j] & 0xF) | h0) * y[i].qs[j];
      sumi += ((x[i].qs[j] >> 4) | h1) * y[i].qs[j + 16];
    }
    sum += h2f(x[i].d) * h2f(y[i].d) * static_cast<float>(sumi) + h2f(x[i].m) * h2f(y[i].s);
  }
  return sum;
}

float vec_dot_q8_0(int64_t n, const void* vx, const void* vy) {
  const auto* x = static_cast<const BlockQ8_0*>(vx);
  const auto* y = static_cast<const BlockQ8_0*>(vy);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK32; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQK32; ++j) sumi += x[i].qs[j] * y[i].qs[j];
    sum += static_cast<float>(sumi) * (h2f(x[i].d) * h2f(y[i].d));
  }
  return sum;
}

// ---- K-quants ----------------------------------------------------------------------------

// Q8_K (quantize_row_q8_K_ref): the signed value of largest magnitude (first one on ties) maps
// to -127; q = min(127, round_half_even(x * -127 / max)).
void from_float_q8_k(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_K*>(dst);
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    float amax = 0, max = 0;
    for (int j = 0; j < kQKK; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    if (amax == 0) {
      std::memset(&b[i], 0, sizeof(BlockQ8_K));
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < kQKK; ++j)
      b[i].qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[j])));
    for (int g = 0; g < kQKK / 16; ++g) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += b[i].qs[16 * g + l];
      b[i].bsums[g] = static_cast<int16_t>(s);
    }
    b[i].d = 1 / iscale;
  }
}

void to_float_q8_k(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ8_K*>(src);
  for (int64_t i = 0; i < n / kQKK; ++i, y += kQKK) {
    for (int j = 0; j < kQKK; ++j) y[j] = b[i].d * static_cast<float>(b[i].qs[j]);
  }
}

// Dequantise through the unified form; the evaluation order is ggml's:
// asymmetric (d*sc)*q - (dmin*m), symmetric (d*sc)*(q - zero).
template <typename Block, void (*Unify)(const Block&, KUnified&)>
void to_float_k(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const Block*>(src);
  KUnified u;
  for (int64_t i = 0; i < n / kQKK; ++i, y += kQKK) {
    Unify(b[i], u);
    for (int e = 0; e < kQKK; ++e) {
      const int g = e / 16;
      const float dl = u.d * static_cast<float>(u.sc[g]);
      if (u.sym) {
        y[e] = dl * static_cast<float>(static_cast<int>(u.qu[e]) - u.zero);
      } else {
        y[e] = dl * static_cast<float>(u.qu[e]) - u.dmin * static_cast<float>(u.m[g]);
      }
    }
  }
}

template <typename Block, void (*Unify)(const Block&, KUnified&)>
float vec_dot_k(int64_t n, const void* vx, const void* vy) {
  const auto* x = static_cast<const Block*>(vx);
  const auto* y = static_cast<const BlockQ8_K*>(vy);
  KUnified u;
  float sum = 0;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    Unify(x[i], u);
    int32_t isum = 0, msum = 0;
    for (int g = 0; g < kQKK / 16; ++g) {
      int32_t s = 0;
      for (int l = 0; l < 16; ++l) s += u.qu[16 * g + l] * y[i].qs[16 * g + l];
      isum += u.sc[g] * s;
      msum += u.m[g] * y[i].bsums[g];
    }
    if (u.sym) {
      sum += (u.d * y[i].d) * static_cast<float>(isum - msum);
    } else {
      sum +=
          (u.d * y[i].d) * static_cast<float>(isum) - (u.dmin * y[i].d) * static_cast<float>(msum);
    }
  }
  return sum;
}

// Simple K-quant quantisers (not ggml's search for the best scales): per group, the range is
// mapped linearly onto the levels, then the group scales are quantised against the block's
// largest one and the values re-quantised against the stored (rounded) scales.

// Asymmetric groups (Q2_K, Q4_K, Q5_K): x ~= d*sc*q - dmin*m. Returns stored d, dmin.
template <int kGroup, int kLevels, int kScaleMax>
void quantize_asym_k(const float* x, uint8_t q[kQKK], uint8_t sc[kQKK / kGroup],
                     uint8_t m[kQKK / kGroup], half_bits& d_out, half_bits& dmin_out) {
  constexpr int kGroups = kQKK / kGroup;
  float scale[kGroups], minv[kGroups];
  float max_scale = 0, max_min = 0;
  for (int g = 0; g < kGroups; ++g) {
    float mn = 0, mx = -FLT_MAX;
    for (int l = 0; l < kGroup; ++l) {
      mn = std::min(mn, x[g * kGroup + l]);
      mx = std::max(mx, x[g * kGroup + l]);
    }
    scale[g] = (mx - mn) / kLevels;
    minv[g] = -mn;
    max_scale = std::max(max_scale, scale[g]);
    max_min = std::max(max_min, minv[g]);
  }
  d_out = fp32_to_fp16(max_scale / kScaleMax);
  dmin_out = fp32_to_fp16(max_min / kScaleMax);
  const float d = fp16_to_fp32(d_out), dmin = fp16_to_fp32(dmin_out);
  for (int g = 0; g < kGroups; ++g) {
    sc[g] = d > 0 ? static_cast<uint8_t>(std::clamp(nearest_int(scale[g] / d), 0, kScaleMax)) : 0;
    m[g] =
        dmin > 0 ? static_cast<uint8_t>(std::clamp(nearest_int(minv[g] / dmin), 0, kScaleMax)) : 0;
    const float dl = d * sc[g], ml = dmin * m[g];
    for (int l = 0; l < kGroup; ++l) {
      const float v = x[g * kGroup + l];
      q[g * kGroup + l] =
          dl > 0 ? static_cast<uint8_t>(std::clamp(nearest_int((v + ml) / dl), 0, kLevels)) : 0;
    }
  }
}

// Symmetric groups of 16 (Q3_K, Q6_K): x ~= d*sc*q, q in [-kHalf, kHalf-1], sc signed.
template <int kHalf, int kScaleHalf>
float quantize_sym_k(const float* x, int8_t q[kQKK], int8_t sc[16]) {
  float scale[16];
  float max_scale = 0, amax_scale = 0;
  for (int g = 0; g < 16; ++g) {
    float amax = 0, max = 0;
    for (int l = 0; l < 16; ++l) {
      if (std::fabs(x[16 * g + l]) > amax) {
        amax = std::fabs(x[16 * g + l]);
        max = x[16 * g + l];
      }
    }
    scale[g] = max / -static_cast<float>(kHalf);
    if (std::fabs(scale[g]) > amax_scale) {
      amax_scale = std::fabs(scale[g]);
      max_scale = scale[g];
    }
  }
  const half_bits dh =
      fp32_to_fp16(max_scale != 0 ? max_scale / -static_cast<float>(kScaleHalf) : 0.f);
  const float d = fp16_to_fp32(dh);
  for (int g = 0; g < 16; ++g) {
    sc[g] = d != 0 ? static_cast<int8_t>(
                         std::clamp(nearest_int(scale[g] / d), -kScaleHalf, kScaleHalf - 1))
                   : 0;
    const float dl = d * sc[g];
    for (int l = 0; l < 16; ++l) {
      q[16 * g + l] =
          dl != 0
              ? static_cast<int8_t>(std::clamp(nearest_int(x[16 * g + l] / dl), -kHalf, kHalf - 1))
              : 0;
    }
  }
  return d;
}

void from_float_q2_k(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ2_K*>(dst);
  uint8_t q[kQKK], sc[16], m[16];
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    quantize_asym_k<16, 3, 15>(x, q, sc, m, b[i].d, b[i].dmin);
    for (int g = 0; g < 16; ++g) b[i].scales[g] = static_cast<uint8_t>(sc[g] | (m[g] << 4));
    std::memset(b[i].qs, 0, sizeof(b[i].qs));
    for (int e = 0; e < kQKK; ++e)
      b[i].qs[32 * (e / 128) + e % 32] |= static_cast<uint8_t>(q[e] << (2 * ((e % 128) / 32)));
  }
}

void from_float_q3_k(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ3_K*>(dst);
  int8_t q[kQKK], sc[16];
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    b[i].d = fp32_to_fp16(quantize_sym_k<4, 32>(x, q, sc));
    uint8_t s[16];
    for (int g = 0; g < 16; ++g) s[g] = static_cast<uint8_t>(sc[g] + 32);
    std::memset(b[i].scales, 0, sizeof(b[i].scales));
    for (int j = 0; j < 8; ++j)
      b[i].scales[j] = static_cast<uint8_t>((s[j] & 0xF) | ((s[j + 8] & 0xF) << 4));
    for (int g = 0; g < 16; ++g)
      b[i].scales[8 + g % 4] |= static_cast<uint8_t>((s[g] >> 4) << (2 * (g / 4)));
    std::memset(b[i].qs, 0, sizeof(b[i].qs));
    std::memset(b[i].hmask, 0, sizeof(b[i].hmask));
    for (int e = 0; e < kQKK; ++e) {
      const int u = q[e] + 4;
      b[i].qs[32 * (e / 128) + e % 32] |= static_cast<uint8_t>((u & 3) << (2 * ((e % 128) / 32)));
      b[i].hmask[e % 32] |= static_cast<uint8_t>((u >> 2) << (e / 32));
    }
  }
}

// Packs 8 six-bit scales and mins the way k4_scale_min reads them.
void pack_k4_scales(const uint8_t sc[8], const uint8_t m[8], uint8_t out[12]) {
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
}

void from_float_q4_k(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_K*>(dst);
  uint8_t q[kQKK], sc[8], m[8];
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    quantize_asym_k<32, 15, 63>(x, q, sc, m, b[i].d, b[i].dmin);
    pack_k4_scales(sc, m, b[i].scales);
    std::memset(b[i].qs, 0, sizeof(b[i].qs));
    for (int e = 0; e < kQKK; ++e) {
      const int g = e / 32;
      b[i].qs[32 * (g / 2) + e % 32] |= static_cast<uint8_t>(q[e] << (4 * (g % 2)));
    }
  }
}

void from_float_q5_k(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ5_K*>(dst);
  uint8_t q[kQKK], sc[8], m[8];
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    quantize_asym_k<32, 31, 63>(x, q, sc, m, b[i].d, b[i].dmin);
    pack_k4_scales(sc, m, b[i].scales);
    std::memset(b[i].qs, 0, sizeof(b[i].qs));
    std::memset(b[i].qh, 0, sizeof(b[i].qh));
    for (int e = 0; e < kQKK; ++e) {
      const int g = e / 32;
      b[i].qs[32 * (g / 2) + e % 32] |= static_cast<uint8_t>((q[e] & 0xF) << (4 * (g % 2)));
      b[i].qh[e % 32] |= static_cast<uint8_t>((q[e] >> 4) << g);
    }
  }
}

void from_float_q6_k(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ6_K*>(dst);
  int8_t q[kQKK], sc[16];
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    b[i].d = fp32_to_fp16(quantize_sym_k<32, 128>(x, q, sc));
    std::memcpy(b[i].scales, sc, 16);
    std::memset(b[i].ql, 0, sizeof(b[i].ql));
    std::memset(b[i].qh, 0, sizeof(b[i].qh));
    for (int e = 0; e < kQKK; ++e) {
      const int u = q[e] + 32, h = e / 128, k = (e % 128) / 32, l = e % 32;
      b[i].ql[64 * h + l + 32 * (k & 1)] |= static_cast<uint8_t>((u & 0xF) << (4 * (k >> 1)));
      b[i].qh[32 * h + l] |= static_cast<uint8_t>((u >> 4) << (2 * k));
    }
  }
}

constexpr TypeTraits make(GgmlType t, const char* name, int64_t bs, size_t ts, bool q, ToFloatFn tf,
                          FromFloatFn ff, VecDotFn vd, GgmlType vdt) {
  return TypeTraits{t, name, bs, ts, q, tf, ff, vd, vdt};
}

}  // namespace

// ---- unified K form ----------------------------------------------------------------------

void unify_q2_k(const BlockQ2_K& b, KUnified& u) {
  for (int e = 0; e < kQKK; ++e)
    u.qu[e] = (b.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
  for (int g = 0; g < 16; ++g) {
    u.sc[g] = b.scales[g] & 0xF;
    u.m[g] = b.scales[g] >> 4;
  }
  u.d = fp16_to_fp32(b.d);
  u.dmin = fp16_to_fp32(b.dmin);
  u.sym = false;
  u.zero = 0;
}

void unify_q3_k(const BlockQ3_K& b, KUnified& u) {
  for (int e = 0; e < kQKK; ++e) {
    const int low = (b.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
    const int high = (b.hmask[e % 32] >> (e / 32)) & 1;
    u.qu[e] = static_cast<uint8_t>(low | (high << 2));
  }
  int8_t s[16];
  q3k_scales(b.scales, s);
  for (int g = 0; g < 16; ++g) {
    u.sc[g] = s[g];
    u.m[g] = static_cast<int16_t>(4 * s[g]);
  }
  u.d = u.dmin = fp16_to_fp32(b.d);
  u.sym = true;
  u.zero = 4;
}

void unify_q4_k(const BlockQ4_K& b, KUnified& u) {
  for (int e = 0; e < kQKK; ++e) {
    const int g = e / 32;
    u.qu[e] = (b.qs[32 * (g / 2) + e % 32] >> (4 * (g % 2))) & 0xF;
  }
  for (int g = 0; g < 8; ++g) {
    uint8_t sc, m;
    k4_scale_min(g, b.scales, sc, m);
    u.sc[2 * g] = u.sc[2 * g + 1] = sc;
    u.m[2 * g] = u.m[2 * g + 1] = m;
  }
  u.d = fp16_to_fp32(b.d);
  u.dmin = fp16_to_fp32(b.dmin);
  u.sym = false;
  u.zero = 0;
}

void unify_q5_k(const BlockQ5_K& b, KUnified& u) {
  for (int e = 0; e < kQKK; ++e) {
    const int g = e / 32;
    const int low = (b.qs[32 * (g / 2) + e % 32] >> (4 * (g % 2))) & 0xF;
    const int high = (b.qh[e % 32] >> g) & 1;
    u.qu[e] = static_cast<uint8_t>(low | (high << 4));
  }
  for (int g = 0; g < 8; ++g) {
    uint8_t sc, m;
    k4_scale_min(g, b.scales, sc, m);
    u.sc[2 * g] = u.sc[2 * g + 1] = sc;
    u.m[2 * g] = u.m[2 * g + 1] = m;
  }
  u.d = fp16_to_fp32(b.d);
  u.dmin = fp16_to_fp32(b.dmin);
  u.sym = false;
  u.zero = 0;
}

void unify_q6_k(const BlockQ6_K& b, KUnified& u) {
  for (int e = 0; e < kQKK; ++e) {
    const int h = e / 128, k = (e % 128) / 32, l = e % 32;
    const int low = (b.ql[64 * h + l + 32 * (k & 1)] >> (4 * (k >> 1))) & 0xF;
    const int high = (b.qh[32 * h + l] >> (2 * k)) & 3;
    u.qu[e] = static_cast<uint8_t>(low | (high << 4));
  }
  for (int g = 0; g < 16; ++g) {
    u.sc[g] = b.scales[g];
    u.m[g] = static_cast<int16_t>(32 * b.scales[g]);
  }
  u.d = u.dmin = fp16_to_fp32(b.d);
  u.sym = true;
  u.zero = 32;
}

const TypeTraits* scalar_table() {
  static const auto table = [] {
    std::array<TypeTraits, kGgmlTypeIdLimit> t{};
    auto set = [&](TypeTraits tr) { t[static_cast<size_t>(tr.type)] = tr; };
    using G = GgmlType;
    set(make(G::F32, "f32", 1, 4, false, to_float_f32, from_float_f32, vec_dot_f32, G::F32));
    set(make(G::F16, "f16", 1, 2, false, to_float_f16, from_float_f16, vec_dot_f16, G::F16));
    set(make(G::BF16, "bf16", 1, 2, false, to_float_bf16, from_float_bf16, vec_dot_bf16, G::BF16));
    set(make(G::Q4_0, "q4_0", 32, sizeof(BlockQ4_0), true, to_float_q4_0, from_float_q4_0,
             vec_dot_q4_0, G::Q8_0));
    set(make(G::Q4_1, "q4_1", 32, sizeof(BlockQ4_1), true, to_float_q4_1, from_float_q4_1,
             vec_dot_q4_1, G::Q8_1));
    set(make(G::Q5_0, "q5_0", 32, sizeof(BlockQ5_0), true, to_float_q5_0, from_float_q5_0,
             vec_dot_q5_0, G::Q8_0));
    set(make(G::Q5_1, "q5_1", 32, sizeof(BlockQ5_1), true, to_float_q5_1, from_float_q5_1,
             vec_dot_q5_1, G::Q8_1));
    set(make(G::Q8_0, "q8_0", 32, sizeof(BlockQ8_0), true, to_float_q8_0, from_float_q8_0,
             vec_dot_q8_0, G::Q8_0));
    set(make(G::Q8_1, "q8_1", 32, sizeof(BlockQ8_1), true, to_float_q8_1, from_float_q8_1, nullptr,
             G::Q8_1));
    set(make(G::Q2_K, "q2_K", 256, sizeof(BlockQ2_K), true, to_float_k<BlockQ2_K, unify_q2_k>,
             from_float_q2_k, vec_dot_k<BlockQ2_K, unify_q2_k>, G::Q8_K));
    set(make(G::Q3_K, "q3_K", 256, sizeof(BlockQ3_K), true, to_float_k<BlockQ3_K, unify_q3_k>,
             from_float_q3_k, vec_dot_k<BlockQ3_K, unify_q3_k>, G::Q8_K));
    set(make(G::Q4_K, "q4_K", 256, sizeof(BlockQ4_K), true, to_float_k<BlockQ4_K, unify_q4_k>,
             from_float_q4_k, vec_dot_k<BlockQ4_K, unify_q4_k>, G::Q8_K));
    set(make(G::Q5_K, "q5_K", 256, sizeof(BlockQ5_K), true, to_float_k<BlockQ5_K, unify_q5_k>,
             from_float_q5_k, vec_dot_k<BlockQ5_K, unify_q5_k>, G::Q8_K));
    set(make(G::Q6_K, "q6_K", 256, sizeof(BlockQ6_K), true, to_float_k<BlockQ6_K, unify_q6_k>,
             from_float_q6_k, vec_dot_k<BlockQ6_K, unify_q6_k>, G::Q8_K));
    set(make(G::Q8_K, "q8_K", 256, sizeof(BlockQ8_K), true, to_float_q8_k, from_float_q8_k, nullptr,
             G::Q8_K));
    return t;
  }();
  return table.data();
}

}  // namespace bie::quant
