// Scalar reference kernels of the KV storage formats, the trait tables and the byte sizes.
// Every AVX2 kernel (kv_format_avx2.cpp) is tested against these.
#include "bie/backend/kv_format.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <vector>

#include "bie/common/cpu_features.h"
#include "backend/cpu/kv_format_internal.h"

namespace bie::kv {

using detail::load_fp16;
using detail::store_fp16;
using quant::fp16_to_fp32;
using quant::fp32_to_fp16;

// ---- fp8 e4m3 codec ------------------------------------------------------------------------

uint8_t fp32_to_e4m3(float x) {
  if (std::isnan(x)) return 0;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (a >= 448.0f) return sign | 0x7E;  // largest finite, S.1111.110
  if (a < 0.015625f) {
    // Subnormal range (below 2^-6): steps of 2^-9; m == 8 is exactly the smallest normal 0x08.
    const int m = static_cast<int>(std::nearbyint(a * 512.0f));
    return static_cast<uint8_t>(sign | m);
  }
  int e = 0;
  const float fr = std::frexp(a, &e);  // a = fr * 2^e, fr in [0.5, 1)
  int exp = e - 1 + 7;                 // biased exponent of a = (2 fr) * 2^(e-1)
  int m = static_cast<int>(std::nearbyint((2.0f * fr - 1.0f) * 8.0f));
  if (m == 8) {
    m = 0;
    ++exp;
  }
  if (exp > 15 || (exp == 15 && m > 6)) return sign | 0x7E;
  return static_cast<uint8_t>(sign | (exp << 3) | m);
}

float e4m3_to_fp32(uint8_t code) {
  // E4M3 bits shifted into an fp16 (exponent bias 15 instead of 7) are the same value / 2^8,
  // subnormals included; the AVX2 kernels use the same identity with F16C.
  const auto h = static_cast<uint16_t>(((code & 0x80u) << 8) | ((code & 0x7Fu) << 7));
  return fp16_to_fp32(h) * 256.0f;
}

namespace {

// ---- f16 -----------------------------------------------------------------------------------

void f16_store(const KvRowGeom& g, const float* x, void* tile, int t0, int n) {
  auto* dst =
      static_cast<uint8_t*>(tile) + static_cast<size_t>(t0) * detail::row_bytes_f16(g.head_dim);
  for (int64_t i = 0; i < static_cast<int64_t>(n) * g.head_dim; ++i) {
    store_fp16(dst + 2 * i, fp32_to_fp16(x[i]));
  }
}

void f16_load(const KvRowGeom& g, const void* tile, int t0, int n, float* y) {
  const auto* src = static_cast<const uint8_t*>(tile) +
                    static_cast<size_t>(t0) * detail::row_bytes_f16(g.head_dim);
  for (int64_t i = 0; i < static_cast<int64_t>(n) * g.head_dim; ++i) y[i] = load_fp16(src + 2 * i);
}

void f16_dot(const KvRowGeom& g, const float* q, const void* tile, int t0, int n, float* scores) {
  const int d = g.head_dim;
  for (int j = 0; j < n; ++j) {
    const auto* row =
        static_cast<const uint8_t*>(tile) + static_cast<size_t>(t0 + j) * detail::row_bytes_f16(d);
    float s = 0.0f;
    for (int i = 0; i < d; ++i) s += q[i] * load_fp16(row + 2 * i);
    scores[j] = s;
  }
}

void f16_axpy(const KvRowGeom& g, const float* p, const void* tile, int t0, int n, float* acc) {
  const int d = g.head_dim;
  for (int j = 0; j < n; ++j) {
    const auto* row =
        static_cast<const uint8_t*>(tile) + static_cast<size_t>(t0 + j) * detail::row_bytes_f16(d);
    for (int i = 0; i < d; ++i) acc[i] += p[j] * load_fp16(row + 2 * i);
  }
}

// ---- fp8 e4m3 and int8: fp16 scale + d one-byte codes ---------------------------------------

// Decoders of one code byte (without the row scale).
struct Fp8Codec {
  static constexpr float kMax = 448.0f;
  static uint8_t encode(float v) { return fp32_to_e4m3(v); }
  static float decode(uint8_t c) { return e4m3_to_fp32(c); }
};
struct Int8Codec {
  static constexpr float kMax = 127.0f;
  static uint8_t encode(float v) {
    const float r = std::clamp(std::nearbyint(v), -127.0f, 127.0f);
    return static_cast<uint8_t>(static_cast<int8_t>(r));
  }
  static float decode(uint8_t c) { return static_cast<float>(static_cast<int8_t>(c)); }
};

template <class Codec>
void scaled_store(const KvRowGeom& g, const float* x, void* tile, int t0, int n) {
  const int d = g.head_dim;
  for (int j = 0; j < n; ++j) {
    const float* xr = x + static_cast<int64_t>(j) * d;
    auto* row =
        static_cast<uint8_t*>(tile) + static_cast<size_t>(t0 + j) * detail::row_bytes_scaled(d);
    float amax = 0.0f;
    for (int i = 0; i < d; ++i) amax = std::max(amax, std::fabs(xr[i]));
    const uint16_t sh = fp32_to_fp16(amax / Codec::kMax);
    store_fp16(row, sh);
    // Quantise against the scale as stored, so load() sees exactly what store() meant.
    const float s = fp16_to_fp32(sh);
    const float inv = s > 0.0f ? 1.0f / s : 0.0f;
    for (int i = 0; i < d; ++i) row[sizeof(KvScaleHeader) + i] = Codec::encode(xr[i] * inv);
  }
}

template <class Codec>
void scaled_load(const KvRowGeom& g, const void* tile, int t0, int n, float* y) {
  const int d = g.head_dim;
  for (int j = 0; j < n; ++j) {
    const auto* row = static_cast<const uint8_t*>(tile) +
                      static_cast<size_t>(t0 + j) * detail::row_bytes_scaled(d);
    const float s = load_fp16(row);
    for (int i = 0; i < d; ++i) y[static_cast<int64_t>(j) * d + i] = s * Codec::decode(row[2 + i]);
  }
}

template <class Codec>
void scaled_dot(const KvRowGeom& g, const float* q, const void* tile, int t0, int n,
                float* scores) {
  const int d = g.head_dim;
  for (int j = 0; j < n; ++j) {
    const auto* row = static_cast<const uint8_t*>(tile) +
                      static_cast<size_t>(t0 + j) * detail::row_bytes_scaled(d);
    float s = 0.0f;
    for (int i = 0; i < d; ++i) s += q[i] * Codec::decode(row[2 + i]);
    scores[j] = s * load_fp16(row);
  }
}

template <class Codec>
void scaled_axpy(const KvRowGeom& g, const float* p, const void* tile, int t0, int n, float* acc) {
  const int d = g.head_dim;
  for (int j = 0; j < n; ++j) {
    const auto* row = static_cast<const uint8_t*>(tile) +
                      static_cast<size_t>(t0 + j) * detail::row_bytes_scaled(d);
    const float w = p[j] * load_fp16(row);
    for (int i = 0; i < d; ++i) acc[i] += w * Codec::decode(row[2 + i]);
  }
}

// ---- int4_asym: groups of G values, { fp16 scale, fp16 zero, G/2 nibble bytes } ------------

// Element i of a group whose nibbles start at qs (split halves).
inline int nibble(const uint8_t* qs, int half, int i) {
  return i < half ? (qs[i] & 0x0F) : (qs[i - half] >> 4);
}

// Min/max quantiser shared by int4_asym groups and int4_channel channels: writes (scale, zero)
// and returns the codes via `code(k)` for the `count` values x[k * stride].
struct Int4Params {
  uint16_t scale, zero;
  float s, z, inv;
};
Int4Params int4_params_of(float scale, float zero) {
  Int4Params p{};
  p.scale = fp32_to_fp16(scale);
  p.zero = fp32_to_fp16(zero);
  p.s = fp16_to_fp32(p.scale);
  p.z = fp16_to_fp32(p.zero);
  p.inv = p.s > 0.0f ? 1.0f / p.s : 0.0f;
  return p;
}

// `levels` = largest code (15 for 4 bits, 255 for int8_channel).
Int4Params int4_params(const float* x, int count, int64_t stride, float levels = 15.0f) {
  float mn = x[0], mx = x[0];
  for (int k = 1; k < count; ++k) {
    mn = std::min(mn, x[k * stride]);
    mx = std::max(mx, x[k * stride]);
  }
  return int4_params_of((mx - mn) / levels, mn);
}
// Round to nearest, ties to even, for |y| <= 2^22 (what std::nearbyint gives in the default
// rounding mode, without a library call): adding and subtracting 1.5 * 2^23 leaves no fraction
// bits.
constexpr float kRoundMagic = 12582912.0f;
inline float round_even(float y) {
  return (y + kRoundMagic) - kRoundMagic;
}
// The nearest code in [0, levels] (clamped first, so the rounding above stays in range).
inline int nearest_code(const Int4Params& p, float v, float levels) {
  const float q = round_even(std::clamp((v - p.z) * p.inv, -1.0f, levels + 1.0f));
  return static_cast<int>(std::clamp(q, 0.0f, levels));
}
inline int int4_code(const Int4Params& p, float v) {
  return nearest_code(p, v, 15.0f);
}
inline int int8_chan_code(const Int4Params& p, float v) {
  return nearest_code(p, v, 255.0f);
}

// Squared error of `count` values x[k * stride] coded with p (nearest code, as the store writes).
float int4_sq_error(const Int4Params& p, const float* x, int count, int64_t stride) {
  float e = 0.0f;
  for (int k = 0; k < count; ++k) {
    const float v = x[k * stride];
    const float r = v - (p.s * static_cast<float>(int4_code(p, v)) + p.z);
    e += r * r;
  }
  return e;
}

// Fitted grids for the channels of one key tile. Min/max spends the 16 levels on the two extreme
// tokens of a channel; its values over a tile are bulk plus tails, and a grid a little narrower
// or wider, fitted to its codes, loses less. For each channel the search tries 7 code spacings
// (15 + delta) / (max - min), delta in -0.6 .. +0.6 in steps of 0.2 (ggml's k-quant search walks
// -1 .. +1 in steps of 0.1: 21 candidates gave the same KLD on Qwen2.5-Coder-0.5B at 3x the
// time), fits scale and zero to each candidate's codes by least squares and keeps the candidate
// with the least residual; that pair, rounded to fp16 as stored, replaces min/max's
// only if its squared error over the tile (nearest codes, as stored) is lower, so a channel
// min/max codes exactly stays exact.
//
// W channels c0 .. c0 + W - 1 side by side (the inner loops run along a token's row over W
// lanes, which the compiler vectorises), in float on values shifted by the channel minimum.
// Writes each channel's minimum and range (max - min) and the fitted (scale, zero), or scale 0
// where no candidate fits.
template <int W>
void fit_channels(const float* x, int T, int d, int c0, float* ch_min, float* ch_range,
                  float* fit_s, float* fit_z) {
  float mn[W], range[W], inv[W], sx[W] = {}, sxx[W] = {}, sq[W], sqq[W], sqx[W];
  float best[W], bs[W] = {}, bz[W] = {};
  for (int k = 0; k < W; ++k) {
    mn[k] = range[k] = x[c0 + k];
    best[k] = std::numeric_limits<float>::infinity();
  }
  for (int t = 1; t < T; ++t) {
    const float* row = x + static_cast<int64_t>(t) * d + c0;
    for (int k = 0; k < W; ++k) {
      mn[k] = std::min(mn[k], row[k]);
      range[k] = std::max(range[k], row[k]);
    }
  }
  for (int k = 0; k < W; ++k) range[k] -= mn[k];
  for (int t = 0; t < T; ++t) {
    const float* row = x + static_cast<int64_t>(t) * d + c0;
    for (int k = 0; k < W; ++k) {
      const float v = row[k] - mn[k];
      sx[k] += v;
      sxx[k] += v * v;
    }
  }
  const float n = static_cast<float>(T);
  for (int step = -3; step <= 3; ++step) {
    const float levels = 15.0f + 0.2f * static_cast<float>(step);
    for (int k = 0; k < W; ++k) {
      inv[k] = range[k] > 0.0f ? levels / range[k] : 0.0f;
      sq[k] = sqq[k] = sqx[k] = 0.0f;
    }
    for (int t = 0; t < T; ++t) {
      const float* row = x + static_cast<int64_t>(t) * d + c0;
      for (int k = 0; k < W; ++k) {
        // 0 <= v * inv <= 16; a tie rounds up here (the fit needs no exact codes, the store
        // re-codes with int4_code).
        const float v = row[k] - mn[k];
        const float q = static_cast<float>(std::min(static_cast<int>(v * inv[k] + 0.5f), 15));
        sq[k] += q;
        sqq[k] += q * q;
        sqx[k] += q * v;
      }
    }
    for (int k = 0; k < W; ++k) {
      const float det = n * sqq[k] - sq[k] * sq[k];
      const float scale = det > 0.0f ? (n * sqx[k] - sq[k] * sx[k]) / det : 0.0f;
      const float zero = (sx[k] - scale * sq[k]) / n;
      // sum (v - scale q - zero)^2, expanded
      const float resid = sxx[k] - 2.0f * scale * sqx[k] - 2.0f * zero * sx[k] +
                          scale * scale * sqq[k] + 2.0f * scale * zero * sq[k] + n * zero * zero;
      if (scale > 0.0f && resid < best[k]) {
        best[k] = resid;
        bs[k] = scale;
        bz[k] = zero + mn[k];
      }
    }
  }
  for (int k = 0; k < W; ++k) {
    ch_min[c0 + k] = mn[k];
    ch_range[c0 + k] = range[k];
    fit_s[c0 + k] = bs[k];
    fit_z[c0 + k] = bz[k];
  }
}

// The stored (scale, zero) of each of the d channels of a tile of T tokens (row t at x + t * d).
void fit_channel_grids(const float* x, int T, int d, Int4Params* out) {
  thread_local std::vector<float> fit;
  fit.resize(static_cast<size_t>(4) * d);
  float* ch_min = fit.data();
  float* ch_range = ch_min + d;
  float* fit_s = ch_range + d;
  float* fit_z = fit_s + d;
  int c = 0;
  for (; c + 16 <= d; c += 16) fit_channels<16>(x, T, d, c, ch_min, ch_range, fit_s, fit_z);
  for (; c < d; ++c) fit_channels<1>(x, T, d, c, ch_min, ch_range, fit_s, fit_z);
  for (c = 0; c < d; ++c) {
    out[c] = int4_params_of(ch_range[c] / 15.0f, ch_min[c]);  // the min/max grid, int4_params'

    if (!(fit_s[c] > 0.0f)) continue;
    const Int4Params p = int4_params_of(fit_s[c], fit_z[c]);
    if (!(p.s > 0.0f) || !std::isfinite(p.s) || !std::isfinite(p.z)) continue;
    if (int4_sq_error(p, x + c, T, d) < int4_sq_error(out[c], x + c, T, d)) out[c] = p;
  }
}

void int4_store(const KvRowGeom& g, const float* x, void* tile, int t0, int n) {
  const int d = g.head_dim, G = g.group, half = G / 2;
  const size_t gb = detail::group_bytes_int4(G);
  for (int j = 0; j < n; ++j) {
    auto* row =
        static_cast<uint8_t*>(tile) + static_cast<size_t>(t0 + j) * detail::row_bytes_int4(d, G);
    for (int b = 0; b < d / G; ++b) {
      const float* xg = x + static_cast<int64_t>(j) * d + b * G;
      uint8_t* grp = row + b * gb;
      const Int4Params p = int4_params(xg, G, 1);
      store_fp16(grp, p.scale);
      store_fp16(grp + 2, p.zero);
      for (int i = 0; i < half; ++i) {
        grp[4 + i] = static_cast<uint8_t>(int4_code(p, xg[i]) | (int4_code(p, xg[i + half]) << 4));
      }
    }
  }
}

void int4_load(const KvRowGeom& g, const void* tile, int t0, int n, float* y) {
  const int d = g.head_dim, G = g.group;
  const size_t gb = detail::group_bytes_int4(G);
  for (int j = 0; j < n; ++j) {
    const auto* row = static_cast<const uint8_t*>(tile) +
                      static_cast<size_t>(t0 + j) * detail::row_bytes_int4(d, G);
    for (int b = 0; b < d / G; ++b) {
      const uint8_t* grp = row + b * gb;
      const float s = load_fp16(grp), z = load_fp16(grp + 2);
      for (int i = 0; i < G; ++i) {
        y[static_cast<int64_t>(j) * d + b * G + i] =
            s * static_cast<float>(nibble(grp + 4, G / 2, i)) + z;
      }
    }
  }
}

void int4_dot(const KvRowGeom& g, const float* q, const void* tile, int t0, int n, float* scores) {
  const int d = g.head_dim, G = g.group;
  const size_t gb = detail::group_bytes_int4(G);
  for (int j = 0; j < n; ++j) {
    const auto* row = static_cast<const uint8_t*>(tile) +
                      static_cast<size_t>(t0 + j) * detail::row_bytes_int4(d, G);
    float total = 0.0f;
    for (int b = 0; b < d / G; ++b) {
      const uint8_t* grp = row + b * gb;
      const float* qg = q + b * G;
      // sum q (s n + z) = s * sum(q n) + z * sum(q)
      float qn = 0.0f, qsum = 0.0f;
      for (int i = 0; i < G; ++i) {
        qn += qg[i] * static_cast<float>(nibble(grp + 4, G / 2, i));
        qsum += qg[i];
      }
      total += load_fp16(grp) * qn + load_fp16(grp + 2) * qsum;
    }
    scores[j] = total;
  }
}

void int4_axpy(const KvRowGeom& g, const float* p, const void* tile, int t0, int n, float* acc) {
  const int d = g.head_dim, G = g.group;
  const size_t gb = detail::group_bytes_int4(G);
  for (int j = 0; j < n; ++j) {
    const auto* row = static_cast<const uint8_t*>(tile) +
                      static_cast<size_t>(t0 + j) * detail::row_bytes_int4(d, G);
    for (int b = 0; b < d / G; ++b) {
      const uint8_t* grp = row + b * gb;
      const float a = p[j] * load_fp16(grp), c = p[j] * load_fp16(grp + 2);
      for (int i = 0; i < G; ++i) {
        acc[b * G + i] += a * static_cast<float>(nibble(grp + 4, G / 2, i)) + c;
      }
    }
  }
}

// ---- int4_channel: tile of T tokens, (scale, zero) per channel ------------------------------

void chan_store(const KvRowGeom& g, const float* x, void* tile, int t0, int n) {
  const int d = g.head_dim, T = g.group, half = d / 2;
  assert(t0 == 0 && n == T);  // scales span the whole tile
  (void)t0;
  (void)n;
  auto* base = static_cast<uint8_t*>(tile);
  thread_local std::vector<Int4Params> params;
  params.resize(static_cast<size_t>(d));
  fit_channel_grids(x, T, d, params.data());
  // Channels c and c + d/2 share a byte of every row.
  for (int c = 0; c < half; ++c) {
    const Int4Params& lo = params[static_cast<size_t>(c)];
    const Int4Params& hi = params[static_cast<size_t>(c + half)];
    store_fp16(base + 4 * c, lo.scale);
    store_fp16(base + 4 * c + 2, lo.zero);
    store_fp16(base + 4 * (c + half), hi.scale);
    store_fp16(base + 4 * (c + half) + 2, hi.zero);
    for (int t = 0; t < T; ++t) {
      const float* xr = x + static_cast<int64_t>(t) * d;
      base[detail::chan_row_offset(d, t) + c] =
          static_cast<uint8_t>(int4_code(lo, xr[c]) | (int4_code(hi, xr[c + half]) << 4));
    }
  }
}

void chan_load(const KvRowGeom& g, const void* tile, int t0, int n, float* y) {
  const int d = g.head_dim;
  const auto* base = static_cast<const uint8_t*>(tile);
  for (int j = 0; j < n; ++j) {
    const uint8_t* row = base + detail::chan_row_offset(d, t0 + j);
    for (int c = 0; c < d; ++c) {
      y[static_cast<int64_t>(j) * d + c] =
          load_fp16(base + 4 * c) * static_cast<float>(nibble(row, d / 2, c)) +
          load_fp16(base + 4 * c + 2);
    }
  }
}

void chan_dot(const KvRowGeom& g, const float* q, const void* tile, int t0, int n, float* scores) {
  const int d = g.head_dim;
  const auto* base = static_cast<const uint8_t*>(tile);
  for (int j = 0; j < n; ++j) {
    const uint8_t* row = base + detail::chan_row_offset(d, t0 + j);
    float s = 0.0f;
    for (int c = 0; c < d; ++c) {
      s += q[c] * (load_fp16(base + 4 * c) * static_cast<float>(nibble(row, d / 2, c)) +
                   load_fp16(base + 4 * c + 2));
    }
    scores[j] = s;
  }
}

void chan_axpy(const KvRowGeom& g, const float* p, const void* tile, int t0, int n, float* acc) {
  const int d = g.head_dim;
  const auto* base = static_cast<const uint8_t*>(tile);
  for (int j = 0; j < n; ++j) {
    const uint8_t* row = base + detail::chan_row_offset(d, t0 + j);
    for (int c = 0; c < d; ++c) {
      acc[c] += p[j] * (load_fp16(base + 4 * c) * static_cast<float>(nibble(row, d / 2, c)) +
                        load_fp16(base + 4 * c + 2));
    }
  }
}

// ---- int8_channel: tile of T tokens, (scale, zero) per channel, one code byte per value --------

void chan8_store(const KvRowGeom& g, const float* x, void* tile, int t0, int n) {
  const int d = g.head_dim, T = g.group;
  assert(t0 == 0 && n == T);  // scales span the whole tile
  (void)t0;
  (void)n;
  auto* base = static_cast<uint8_t*>(tile);
  for (int c = 0; c < d; ++c) {
    const Int4Params p = int4_params(x + c, T, d, 255.0f);
    store_fp16(base + 4 * c, p.scale);
    store_fp16(base + 4 * c + 2, p.zero);
    for (int t = 0; t < T; ++t) {
      base[detail::chan8_row_offset(d, t) + c] =
          static_cast<uint8_t>(int8_chan_code(p, x[static_cast<int64_t>(t) * d + c]));
    }
  }
}

void chan8_load(const KvRowGeom& g, const void* tile, int t0, int n, float* y) {
  const int d = g.head_dim;
  const auto* base = static_cast<const uint8_t*>(tile);
  for (int j = 0; j < n; ++j) {
    const uint8_t* row = base + detail::chan8_row_offset(d, t0 + j);
    for (int c = 0; c < d; ++c) {
      y[static_cast<int64_t>(j) * d + c] =
          load_fp16(base + 4 * c) * static_cast<float>(row[c]) + load_fp16(base + 4 * c + 2);
    }
  }
}

void chan8_dot(const KvRowGeom& g, const float* q, const void* tile, int t0, int n, float* scores) {
  const int d = g.head_dim;
  const auto* base = static_cast<const uint8_t*>(tile);
  for (int j = 0; j < n; ++j) {
    const uint8_t* row = base + detail::chan8_row_offset(d, t0 + j);
    float s = 0.0f;
    for (int c = 0; c < d; ++c) {
      s += q[c] *
           (load_fp16(base + 4 * c) * static_cast<float>(row[c]) + load_fp16(base + 4 * c + 2));
    }
    scores[j] = s;
  }
}

void chan8_axpy(const KvRowGeom& g, const float* p, const void* tile, int t0, int n, float* acc) {
  const int d = g.head_dim;
  const auto* base = static_cast<const uint8_t*>(tile);
  for (int j = 0; j < n; ++j) {
    const uint8_t* row = base + detail::chan8_row_offset(d, t0 + j);
    for (int c = 0; c < d; ++c) {
      acc[c] += p[j] * (load_fp16(base + 4 * c) * static_cast<float>(row[c]) +
                        load_fp16(base + 4 * c + 2));
    }
  }
}

constexpr KvFormatTraits kScalar[] = {
    {planner::KvType::kF16, f16_store, f16_load, f16_dot, f16_axpy},
    {planner::KvType::kFp8E4M3, scaled_store<Fp8Codec>, scaled_load<Fp8Codec>, scaled_dot<Fp8Codec>,
     scaled_axpy<Fp8Codec>},
    {planner::KvType::kInt8, scaled_store<Int8Codec>, scaled_load<Int8Codec>, scaled_dot<Int8Codec>,
     scaled_axpy<Int8Codec>},
    {planner::KvType::kInt4Asym, int4_store, int4_load, int4_dot, int4_axpy},
    {planner::KvType::kInt4Channel, chan_store, chan_load, chan_dot, chan_axpy},
    {planner::KvType::kInt8Channel, chan8_store, chan8_load, chan8_dot, chan8_axpy},
};

}  // namespace

const KvFormatTraits* kv_traits_scalar(planner::KvType type) {
  for (const KvFormatTraits& t : kScalar) {
    if (t.type == type) return &t;
  }
  return nullptr;
}

const KvFormatTraits* kv_traits_avx2(planner::KvType type) {
  return has_avx2() ? detail::kv_traits_avx2_table(type) : nullptr;
}

const KvFormatTraits* kv_traits(planner::KvType type) {
  if (const KvFormatTraits* t = kv_traits_avx2(type)) return t;
  return kv_traits_scalar(type);
}

bool kv_format_supported(planner::KvFormat f) {
  return kv_traits_scalar(f.type) != nullptr && planner::kv_group_valid(f);
}

size_t kv_tile_bytes(planner::KvFormat f, int head_dim, int n_tokens) {
  assert(kv_format_supported(f) && planner::check_kv_format(f, head_dim).ok());
  // A per-channel tile holds whole groups of tokens; its bytes per head-token are exact only then.
  assert(!planner::is_per_channel(f) || n_tokens % f.group == 0);
  return static_cast<size_t>(n_tokens) * planner::bytes_per_head_token(f, head_dim);
}

}  // namespace bie::kv
