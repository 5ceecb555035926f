// Scalar reference kernels of the KV storage formats, the trait tables and the byte sizes.
// Every AVX2 kernel (kv_format_avx2.cpp) is tested against these.
#include "bie/kv/kv_format.h"

#include <algorithm>
#include <cassert>
#include <cmath>

#include "bie/common/cpu_features.h"
#include "kv/kv_format_internal.h"

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
// `levels` = largest code (15 for 4 bits, 255 for int8_channel).
Int4Params int4_params(const float* x, int count, int64_t stride, float levels = 15.0f) {
  float mn = x[0], mx = x[0];
  for (int k = 1; k < count; ++k) {
    mn = std::min(mn, x[k * stride]);
    mx = std::max(mx, x[k * stride]);
  }
  Int4Params p{};
  p.scale = fp32_to_fp16((mx - mn) / levels);
  p.zero = fp32_to_fp16(mn);
  p.s = fp16_to_fp32(p.scale);
  p.z = fp16_to_fp32(p.zero);
  p.inv = p.s > 0.0f ? 1.0f / p.s : 0.0f;
  return p;
}
inline int int4_code(const Int4Params& p, float v) {
  return static_cast<int>(std::clamp(std::nearbyint((v - p.z) * p.inv), 0.0f, 15.0f));
}

// Squared error of `count` values x[k * stride] coded with p (nearest code, as the store writes).
double int4_sq_error(const Int4Params& p, const float* x, int count, int64_t stride) {
  double e = 0.0;
  for (int k = 0; k < count; ++k) {
    const float v = x[k * stride];
    const double r = static_cast<double>(v) - (p.s * static_cast<float>(int4_code(p, v)) + p.z);
    e += r * r;
  }
  return e;
}

// Range search for the 4-bit channels of a key tile. Min/max spends the 16 levels on the two
// extreme tokens; a channel's values over a tile are bulk plus tails, and a grid a little narrower
// or wider, fitted to its codes, loses less. Tries code spacings (15 + delta) / (max - min) for
// delta in -1.0 .. +1.0 in steps of 0.1 (the candidate grid ggml's k-quant search uses), fits
// scale and zero to each candidate's codes by least squares, rounds them to fp16 as stored, and
// keeps the pair with the least squared error over the tile; min/max wins ties, so a channel it
// codes exactly stays exact. The format (codes, fp16 scale and zero) is unchanged.
Int4Params int4_params_fitted(const float* x, int count, int64_t stride) {
  Int4Params best = int4_params(x, count, stride);
  double best_err = int4_sq_error(best, x, count, stride);
  if (best_err == 0.0 || count < 3) return best;
  float mn = x[0], mx = x[0];
  for (int k = 1; k < count; ++k) {
    mn = std::min(mn, x[k * stride]);
    mx = std::max(mx, x[k * stride]);
  }
  const double n = count;
  for (int step = -10; step <= 10; ++step) {
    const float inv = (15.0f + 0.1f * static_cast<float>(step)) / (mx - mn);
    double sq = 0.0, sx = 0.0, sqq = 0.0, sqx = 0.0;
    for (int k = 0; k < count; ++k) {
      const float v = x[k * stride];
      const double q = std::clamp(std::nearbyint((v - mn) * inv), 0.0f, 15.0f);
      sq += q;
      sx += v;
      sqq += q * q;
      sqx += q * v;
    }
    const double det = n * sqq - sq * sq;
    if (det <= 0.0) continue;
    const double scale = (n * sqx - sq * sx) / det;
    if (!(scale > 0.0)) continue;
    Int4Params p{};
    p.scale = fp32_to_fp16(static_cast<float>(scale));
    p.zero = fp32_to_fp16(static_cast<float>((sx - scale * sq) / n));
    p.s = fp16_to_fp32(p.scale);
    p.z = fp16_to_fp32(p.zero);
    if (!(p.s > 0.0f) || !std::isfinite(p.s) || !std::isfinite(p.z)) continue;
    p.inv = 1.0f / p.s;
    const double err = int4_sq_error(p, x, count, stride);
    if (err < best_err) {
      best_err = err;
      best = p;
    }
  }
  return best;
}
inline int int8_chan_code(const Int4Params& p, float v) {
  return static_cast<int>(std::clamp(std::nearbyint((v - p.z) * p.inv), 0.0f, 255.0f));
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
  // Channels c and c + d/2 share a byte of every row.
  for (int c = 0; c < half; ++c) {
    const Int4Params lo = int4_params_fitted(x + c, T, d);
    const Int4Params hi = int4_params_fitted(x + c + half, T, d);
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
