// KV storage formats: byte sizes against the planner, exact hand-computed layouts, round-trip
// error bounds, fused kernels against dequantise-then-fp32, AVX2 against scalar, and the
// Hadamard rotation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "bie/common/cpu_features.h"
#include "bie/backend/kv_format.h"
#include "bie/backend/kv_format_rotate.h"
#include "bie/backend/kv_layout.h"
#include "bie/planner/kv_format.h"
#include "bie/quant/fp16.h"

namespace bie::kv {
namespace {

using planner::KvFormat;
using planner::KvType;

// Fused kernels sum in a different order (and fold scales differently) than the references;
// errors are relative to sum |q_i| |k_i| (dot) or sum_j |p_j| |v_ji| (axpy).
constexpr double kFusedRelTol = 2e-6;
constexpr double kAvx2RelTol = 2e-6;

const KvFormat kAllFormats[] = {
    {KvType::kF16, 0},          {KvType::kFp8E4M3, 0},      {KvType::kInt8, 0},
    {KvType::kInt4Asym, 32},    {KvType::kInt4Asym, 64},    {KvType::kInt4Asym, 128},
    {KvType::kInt4Channel, 16}, {KvType::kInt4Channel, 32}, {KvType::kInt4Channel, 64},
    {KvType::kInt8Channel, 16}, {KvType::kInt8Channel, 64},
};

std::vector<float> randn(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

// Keys with persistent outlier channels: every 16th channel carries a large per-channel offset
// and scale (10-50x the others), like real post-RoPE keys.
std::vector<float> outlier_keys(int n_tok, int d, uint32_t seed) {
  std::vector<float> v = randn(static_cast<size_t>(n_tok) * d, seed);
  std::mt19937 rng(seed + 1);
  std::uniform_real_distribution<float> mag(10.0f, 50.0f);
  for (int c = 0; c < d; c += 16) {
    const float m = mag(rng);
    const float off = (c % 32 == 0 ? 1.0f : -1.0f) * m;
    for (int t = 0; t < n_tok; ++t)
      v[static_cast<size_t>(t) * d + c] = off + 0.2f * m * v[static_cast<size_t>(t) * d + c];
  }
  return v;
}

// Tokens per store call: whole tiles for per-channel formats.
int store_unit(KvFormat f) {
  return planner::is_per_channel(f) ? f.group : 1;
}

std::vector<uint8_t> store_all(const KvFormatTraits& tr, KvFormat f, int d, const float* x,
                               int n_tok) {
  std::vector<uint8_t> buf(kv_tile_bytes(f, d, n_tok));
  const int unit = store_unit(f);
  const KvRowGeom g = kv_row_geom(f, d);
  if (planner::is_per_channel(f)) {
    for (int t = 0; t < n_tok; t += unit) {
      tr.store(g, x + static_cast<size_t>(t) * d, buf.data() + kv_tile_bytes(f, d, t), 0, unit);
    }
  } else {
    tr.store(g, x, buf.data(), 0, n_tok);
  }
  return buf;
}

std::vector<float> load_all(const KvFormatTraits& tr, KvFormat f, int d, const uint8_t* buf,
                            int n_tok) {
  std::vector<float> y(static_cast<size_t>(n_tok) * d);
  const KvRowGeom g = kv_row_geom(f, d);
  if (planner::is_per_channel(f)) {
    for (int t = 0; t < n_tok; t += f.group) {
      tr.load(g, buf + kv_tile_bytes(f, d, t), 0, f.group, y.data() + static_cast<size_t>(t) * d);
    }
  } else {
    tr.load(g, buf, 0, n_tok, y.data());
  }
  return y;
}

// ---- sizes ---------------------------------------------------------------------------------

// The bytes the kernels' layout (bie/backend/kv_layout.h: where each row and tile starts) spans for n
// tokens of one head: written out per format, independently of the format table.
size_t layout_bytes(KvFormat f, int d, int n) {
  const auto tiles = [&](size_t tile) { return static_cast<size_t>(n / f.group) * tile; };
  switch (f.type) {
    case KvType::kF16:
      return static_cast<size_t>(n) * row_bytes_f16(d);
    case KvType::kFp8E4M3:
    case KvType::kInt8:
      return static_cast<size_t>(n) * row_bytes_scaled(d);
    case KvType::kInt4Asym:
      return static_cast<size_t>(n) * row_bytes_int4(d, f.group);
    case KvType::kInt4Channel:
      return tiles(chan_tile_bytes(d, f.group));
    case KvType::kInt8Channel:
      return tiles(chan8_tile_bytes(d, f.group));
    default:
      return 0;
  }
}

TEST(KvFormatSize, EqualsPlannerForEveryFormatAndHeadDim) {
  for (KvFormat f : kAllFormats) {
    for (int d : {64, 128, 256}) {
      if (f.type == KvType::kInt4Asym && f.group > d) continue;  // g128 needs d >= 128
      ASSERT_TRUE(planner::check_kv_format(f, d).ok()) << planner::kv_format_name(f) << " d=" << d;
      ASSERT_TRUE(kv_format_supported(f));
      const uint64_t per = planner::bytes_per_head_token(f, d);
      // The table's bytes are the layout the kernels walk.
      EXPECT_EQ(layout_bytes(f, d, 4 * store_unit(f)), 4 * store_unit(f) * per)
          << planner::kv_format_name(f) << " d=" << d;
      EXPECT_EQ(kv_tile_bytes(f, d, 16 * store_unit(f)), 16 * store_unit(f) * per)
          << planner::kv_format_name(f) << " d=" << d;
      if (!planner::is_per_channel(f)) {
        EXPECT_EQ(kv_tile_bytes(f, d, 1), per) << planner::kv_format_name(f) << " d=" << d;
      } else {
        EXPECT_EQ(kv_tile_bytes(f, d, f.group), f.group * per) << planner::kv_format_name(f);
      }
    }
  }
  EXPECT_EQ(kv_tile_bytes({KvType::kInt4Asym, 64}, 128, 1), 72u);            // DESIGN.md
  EXPECT_EQ(kv_tile_bytes({KvType::kInt4Channel, 16}, 128, 16), 16u * 96u);  // docs/planner.md
  EXPECT_FALSE(kv_format_supported({KvType::kQ8_0, 0}));
  EXPECT_FALSE(kv_format_supported({KvType::kQ4_0, 0}));
  EXPECT_EQ(kv_traits_scalar(KvType::kQ4_0), nullptr);
}

// store() writes inside its rows and nowhere else (guard bytes around a run in the middle).
TEST(KvFormatSize, StoreStaysInsideItsRows) {
  for (KvFormat f : kAllFormats) {
    const int d = 128, unit = store_unit(f);
    const KvFormatTraits& tr = *kv_traits(f.type);
    const size_t one = kv_tile_bytes(f, d, unit);
    std::vector<uint8_t> buf(3 * one, 0xA5);
    const std::vector<float> x = randn(static_cast<size_t>(unit) * d, 3);
    if (planner::is_per_channel(f)) {
      tr.store(kv_row_geom(f, d), x.data(), buf.data() + one, 0, unit);
    } else {
      tr.store(kv_row_geom(f, d), x.data(), buf.data(), 1, 1);
    }
    for (size_t i = 0; i < one; ++i) {
      ASSERT_EQ(buf[i], 0xA5) << planner::kv_format_name(f);
      ASSERT_EQ(buf[2 * one + i], 0xA5) << planner::kv_format_name(f);
    }
  }
}

// ---- exact layouts -------------------------------------------------------------------------

uint16_t u16_at(const std::vector<uint8_t>& b, size_t off) {
  uint16_t v;
  std::memcpy(&v, b.data() + off, 2);
  return v;
}

TEST(KvFormatLayout, Int8HandComputed) {
  const KvFormat f{KvType::kInt8, 0};
  // amax 127 -> scale exactly 1.0; 0.5 and 2.5 round half to even.
  const float x[8] = {127.0f, -127.0f, 0.5f, 1.5f, -2.5f, 3.0f, 0.49f, -64.0f};
  for (const KvFormatTraits* tr : {kv_traits_scalar(f.type), kv_traits(f.type)}) {
    std::vector<uint8_t> b = store_all(*tr, f, 8, x, 1);
    ASSERT_EQ(b.size(), 10u);
    EXPECT_EQ(u16_at(b, 0), 0x3C00);  // fp16 1.0
    const int8_t want[8] = {127, -127, 0, 2, -2, 3, 0, -64};
    for (int i = 0; i < 8; ++i) EXPECT_EQ(static_cast<int8_t>(b[2 + i]), want[i]) << i;
    const std::vector<float> y = load_all(*tr, f, 8, b.data(), 1);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(y[i], static_cast<float>(want[i]));
  }
}

TEST(KvFormatLayout, Fp8E4M3HandComputed) {
  const KvFormat f{KvType::kFp8E4M3, 0};
  // amax 448 -> scale exactly 1.0.
  const float x[8] = {448.0f, -448.0f, 1.0f, 0.5f, 0.001953125f, 3.0f, -1.75f, 0.0f};
  std::vector<uint8_t> b = store_all(*kv_traits_scalar(f.type), f, 8, x, 1);
  ASSERT_EQ(b.size(), 10u);
  EXPECT_EQ(u16_at(b, 0), 0x3C00);
  const uint8_t want[8] = {0x7E, 0xFE, 0x38, 0x30, 0x01, 0x44, 0xBE, 0x00};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(b[2 + i], want[i]) << i;
  const std::vector<float> y = load_all(*kv_traits_scalar(f.type), f, 8, b.data(), 1);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(y[i], x[i]) << i;
}

TEST(KvFormatLayout, E4M3CodecRoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(fp32_to_e4m3(1.0625f), 0x38);  // halfway 1.0 / 1.125 -> even (1.0)
  EXPECT_EQ(fp32_to_e4m3(1.1875f), 0x3A);  // halfway 1.125 / 1.25 -> even (1.25)
  EXPECT_EQ(fp32_to_e4m3(1000.0f), 0x7E);  // saturates to 448
  EXPECT_EQ(fp32_to_e4m3(-1e9f), 0xFE);
  EXPECT_EQ(fp32_to_e4m3(0.0009765625f), 0x00);  // 2^-10: halfway 0 / 2^-9 -> even (0)
  EXPECT_EQ(fp32_to_e4m3(0.0029296875f), 0x02);  // 1.5 * 2^-9 -> even (2 * 2^-9)
  EXPECT_EQ(fp32_to_e4m3(0.0146484375f), 0x08);  // 7.5 * 2^-9 rounds up into the first normal
  EXPECT_EQ(e4m3_to_fp32(0x08), 0.015625f);
  EXPECT_EQ(e4m3_to_fp32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_fp32(0x01), 0.001953125f);
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;  // NaN codes are never written
    EXPECT_EQ(fp32_to_e4m3(e4m3_to_fp32(static_cast<uint8_t>(c))), c) << c;
  }
}

TEST(KvFormatLayout, Int4AsymG32HandComputed) {
  const KvFormat f{KvType::kInt4Asym, 32};
  // x[i] = 2 + 0.5 * (i % 16): min 2, max 9.5 -> scale 0.5, zero 2, code i % 16. Byte j holds
  // element j (low nibble) and element j + 16 (high nibble).
  float x[32];
  for (int i = 0; i < 32; ++i) x[i] = 2.0f + 0.5f * static_cast<float>(i % 16);
  std::vector<uint8_t> b = store_all(*kv_traits_scalar(f.type), f, 32, x, 1);
  ASSERT_EQ(b.size(), 20u);
  EXPECT_EQ(u16_at(b, 0), 0x3800);  // fp16 0.5
  EXPECT_EQ(u16_at(b, 2), 0x4000);  // fp16 2.0
  for (int j = 0; j < 16; ++j) EXPECT_EQ(b[4 + j], 0x11 * j) << j;
  float q[32];
  for (float& v : q) v = 1.0f;
  for (const KvFormatTraits* tr : {kv_traits_scalar(f.type), kv_traits(f.type)}) {
    const std::vector<float> y = load_all(*tr, f, 32, b.data(), 1);
    for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], x[i]);
    float s = 0.0f;
    tr->dot(kv_row_geom(f, 32), q, b.data(), 0, 1, &s);
    EXPECT_EQ(s, 184.0f);  // 32 * 2 + 0.5 * 2 * (0 + 1 + ... + 15)
    float acc[32] = {};
    const float p = 2.0f;
    tr->axpy(kv_row_geom(f, 32), &p, b.data(), 0, 1, acc);
    for (int i = 0; i < 32; ++i) EXPECT_EQ(acc[i], 2.0f * x[i]);
  }
}

TEST(KvFormatLayout, Int4ChannelHandComputed) {
  // d = 4, T = 2 (4d % T == 0). Channels: [0, 15] -> (1, 0); [1, 16] -> (1, 1);
  // [10, 10] -> (0, 10); [-3, 4.5] -> (0.5, -3). Row t: byte j = channel j | channel j+2 << 4.
  const KvFormat f{KvType::kInt4Channel, 2};
  ASSERT_TRUE(planner::check_kv_format(f, 4).ok());
  const float x[8] = {0.0f, 1.0f, 10.0f, -3.0f, 15.0f, 16.0f, 10.0f, 4.5f};
  std::vector<uint8_t> b = store_all(*kv_traits_scalar(f.type), f, 4, x, 2);
  ASSERT_EQ(b.size(), 20u);
  ASSERT_EQ(b.size(), 2 * planner::bytes_per_head_token(f, 4));
  const uint16_t params[8] = {0x3C00, 0x0000, 0x3C00, 0x3C00, 0x0000, 0x4900, 0x3800, 0xC200};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(u16_at(b, 2 * i), params[i]) << i;
  EXPECT_EQ(b[16], 0x00);
  EXPECT_EQ(b[17], 0x00);
  EXPECT_EQ(b[18], 0x0F);
  EXPECT_EQ(b[19], 0xFF);
  const std::vector<float> y = load_all(*kv_traits_scalar(f.type), f, 4, b.data(), 2);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(y[i], x[i]) << i;
  const float q[4] = {1.0f, 2.0f, 0.5f, -1.0f};
  float s[2];
  kv_traits_scalar(f.type)->dot(kv_row_geom(f, 4), q, b.data(), 0, 2, s);
  EXPECT_EQ(s[0], 0.0f + 2.0f + 5.0f + 3.0f);
  EXPECT_EQ(s[1], 15.0f + 32.0f + 5.0f - 4.5f);
}

TEST(KvFormatLayout, Int8ChannelHandComputed) {
  // d = 4, T = 2. Channels: [0, 255] -> (1, 0); [1, 511] -> (2, 1); [10, 10] -> (0, 10);
  // [-3, 48] -> (0.2, -3), 48 -> code 255. Row t: byte c = channel c.
  const KvFormat f{KvType::kInt8Channel, 2};
  ASSERT_TRUE(planner::check_kv_format(f, 4).ok());
  const float x[8] = {0.0f, 1.0f, 10.0f, -3.0f, 255.0f, 511.0f, 10.0f, 48.0f};
  std::vector<uint8_t> b = store_all(*kv_traits_scalar(f.type), f, 4, x, 2);
  ASSERT_EQ(b.size(), 24u);
  ASSERT_EQ(b.size(), 2 * planner::bytes_per_head_token(f, 4));
  const uint16_t params[8] = {0x3C00, 0x0000, 0x4000, 0x3C00, 0x0000, 0x4900, 0x3266, 0xC200};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(u16_at(b, 2 * i), params[i]) << i;
  const uint8_t rows[8] = {0, 0, 0, 0, 255, 255, 0, 255};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(b[16 + i], rows[i]) << i;
  const std::vector<float> y = load_all(*kv_traits_scalar(f.type), f, 4, b.data(), 2);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(y[i], x[i]) << i;
  EXPECT_NEAR(y[7], 48.0f, 0.02f);  // fp16 scale 0.19995
  EXPECT_EQ(planner::kv_format_name(f), "int8_channel_t2");
  EXPECT_EQ(kv_tile_bytes({KvType::kInt8Channel, 64}, 128, 64), 64u * 136u);  // q8_0's 8.5 bits
}

TEST(KvFormatLayout, F16IsPlainHalves) {
  const KvFormat f{KvType::kF16, 0};
  const float x[8] = {1.0f, -2.0f, 0.5f, 65504.0f, 0.0f, 3.0f, -0.25f, 1.0f / 3.0f};
  for (const KvFormatTraits* tr : {kv_traits_scalar(f.type), kv_traits(f.type)}) {
    std::vector<uint8_t> b = store_all(*tr, f, 8, x, 1);
    ASSERT_EQ(b.size(), 16u);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(u16_at(b, 2 * i), quant::fp32_to_fp16(x[i])) << i;
  }
}

// ---- round-trip error bounds ---------------------------------------------------------------

// Largest |x - load(store(x))| allowed for value x of a row/group/channel whose range is
// [lo, hi] (amax = max |lo|, |hi|). fp16 metadata rounding adds a relative 2^-11 of the range.
double roundtrip_bound(KvFormat f, double x, double lo, double hi) {
  const double amax = std::max(std::fabs(lo), std::fabs(hi));
  const double fp16_eps = 1.0 / 2048.0;
  switch (f.type) {
    case KvType::kF16:
      return std::fabs(x) * fp16_eps + 1e-7;
    case KvType::kFp8E4M3:  // 3 mantissa bits: half an ulp is 2^-4 relative; subnormal step
      return std::fabs(x) / 16.0 + amax / 448.0 * std::pow(2.0, -10) + amax * 2 * fp16_eps;
    case KvType::kInt8:
      return amax / 127.0 / 2.0 + amax * 2 * fp16_eps;
    case KvType::kInt8Channel:  // half a step of (hi - lo) / 255, plus the rounded zero point
      return (hi - lo) / 255.0 / 2.0 + (hi - lo + std::fabs(lo)) * 2 * fp16_eps;
    default:  // int4: half a step of (hi - lo) / 15, plus the rounded zero point
      return (hi - lo) / 15.0 / 2.0 + (hi - lo + std::fabs(lo)) * 2 * fp16_eps;
  }
}

void check_roundtrip(KvFormat f, int d, const std::vector<float>& x, int n_tok) {
  if (!planner::check_kv_format(f, d).ok()) return;
  const KvFormatTraits& tr = *kv_traits(f.type);
  const std::vector<uint8_t> b = store_all(tr, f, d, x.data(), n_tok);
  const std::vector<float> y = load_all(tr, f, d, b.data(), n_tok);
  for (int t = 0; t < n_tok; ++t) {
    for (int c = 0; c < d; ++c) {
      // The value range the format's metadata covers for element (t, c).
      int t_lo = t, t_hi = t + 1, c_lo = 0, c_hi = d;
      if (f.type == KvType::kInt4Asym) {
        c_lo = c / f.group * f.group;
        c_hi = c_lo + f.group;
      } else if (planner::is_per_channel(f)) {
        t_lo = t / f.group * f.group;
        t_hi = t_lo + f.group;
        c_lo = c;
        c_hi = c + 1;
      }
      double lo = 1e30, hi = -1e30;
      for (int tt = t_lo; tt < t_hi; ++tt) {
        for (int cc = c_lo; cc < c_hi; ++cc) {
          lo = std::min<double>(lo, x[static_cast<size_t>(tt) * d + cc]);
          hi = std::max<double>(hi, x[static_cast<size_t>(tt) * d + cc]);
        }
      }
      const size_t i = static_cast<size_t>(t) * d + c;
      // int4_channel fits its grid to the tile (least squares) and may clip a tail value by more
      // than min/max's half step (1.5 steps allowed here); its squared error is held to
      // min/max's below.
      const double slack = f.type == KvType::kInt4Channel ? (hi - lo) / 15.0 : 0.0;
      ASSERT_LE(std::fabs(static_cast<double>(x[i]) - y[i]),
                roundtrip_bound(f, x[i], lo, hi) + slack)
          << planner::kv_format_name(f) << " d=" << d << " t=" << t << " c=" << c;
    }
  }
  if (f.type != KvType::kInt4Channel) return;
  // Each channel of each tile: no more squared error than the plain min/max grid (written out
  // here: scale (max - min) / 15 and zero min, both fp16, nearest code).
  for (int t0 = 0; t0 < n_tok; t0 += f.group) {
    for (int c = 0; c < d; ++c) {
      float lo = x[static_cast<size_t>(t0) * d + c], hi = lo;
      for (int t = t0; t < t0 + f.group; ++t) {
        lo = std::min(lo, x[static_cast<size_t>(t) * d + c]);
        hi = std::max(hi, x[static_cast<size_t>(t) * d + c]);
      }
      const float s = quant::fp16_to_fp32(quant::fp32_to_fp16((hi - lo) / 15.0f));
      const float z = quant::fp16_to_fp32(quant::fp32_to_fp16(lo));
      double fitted = 0.0, minmax = 0.0;
      for (int t = t0; t < t0 + f.group; ++t) {
        const size_t i = static_cast<size_t>(t) * d + c;
        const float q = s > 0.0f ? std::clamp(std::nearbyint((x[i] - z) / s), 0.0f, 15.0f) : 0.0f;
        minmax += std::pow(static_cast<double>(x[i]) - (s * q + z), 2);
        fitted += std::pow(static_cast<double>(x[i]) - y[i], 2);
      }
      ASSERT_LE(fitted, minmax * (1.0 + 1e-6) + 1e-12)
          << planner::kv_format_name(f) << " d=" << d << " tile " << t0 / f.group << " c=" << c;
    }
  }
}

TEST(KvFormatRoundTrip, RandomDataWithinBounds) {
  for (KvFormat f : kAllFormats) {
    for (int d : {64, 128, 256}) {
      const int n_tok = 64;
      check_roundtrip(f, d, randn(static_cast<size_t>(n_tok) * d, 10 + d, 2.0f), n_tok);
    }
  }
}

TEST(KvFormatRoundTrip, OutlierChannelsWithinBounds) {
  for (KvFormat f : kAllFormats) {
    for (int d : {64, 128}) {
      const int n_tok = 64;
      check_roundtrip(f, d, outlier_keys(n_tok, d, 20 + d), n_tok);
    }
  }
}

double rms_error(KvFormat f, int d, const std::vector<float>& x, int n_tok, bool rotate) {
  std::vector<float> xr = x;
  if (rotate) {
    for (int t = 0; t < n_tok; ++t)
      hadamard_rotate_scalar(xr.data() + static_cast<size_t>(t) * d, d);
  }
  const KvFormatTraits& tr = *kv_traits_scalar(f.type);
  std::vector<float> y = load_all(tr, f, d, store_all(tr, f, d, xr.data(), n_tok).data(), n_tok);
  if (rotate) {  // back to the original basis (H is its own inverse)
    for (int t = 0; t < n_tok; ++t)
      hadamard_rotate_scalar(y.data() + static_cast<size_t>(t) * d, d);
  }
  double se = 0.0;
  for (size_t i = 0; i < x.size(); ++i) se += (x[i] - y[i]) * (x[i] - y[i]);
  return std::sqrt(se / static_cast<double>(x.size()));
}

// The reason int4_channel and --kv-rotate exist: with outlier channels, per-token int4 groups
// spend their 16 levels on the outlier. Both remedies must beat plain int4_asym_g64 clearly.
TEST(KvFormatRoundTrip, OutlierChannelsFavourPerChannelAndRotation) {
  const int d = 128, n_tok = 256;
  const std::vector<float> x = outlier_keys(n_tok, d, 7);
  const double plain = rms_error({KvType::kInt4Asym, 64}, d, x, n_tok, false);
  const double chan = rms_error({KvType::kInt4Channel, 16}, d, x, n_tok, false);
  const double rot = rms_error({KvType::kInt4Asym, 64}, d, x, n_tok, true);
  EXPECT_LT(chan, 0.5 * plain) << "plain " << plain << " channel " << chan;
  EXPECT_LT(rot, 0.8 * plain) << "plain " << plain << " rotated " << rot;
  // 8-bit per-channel keys beat 4-bit ones (per-token int8 need not: one scale spans the outlier).
  EXPECT_LT(rms_error({KvType::kInt8Channel, 16}, d, x, n_tok, false), chan);
}

// ---- fused kernels -------------------------------------------------------------------------

struct RunCase {
  int t0, n;
};

// Runs of rows inside a tile of n_tile rows: single rows, partial and whole blocks, odd lengths.
std::vector<RunCase> runs_for(KvFormat f, int n_tile) {
  if (planner::is_per_channel(f)) {
    const int T = f.group;
    return {{0, 1}, {0, T}, {1, T - 1}, {T / 2, 1}, {3, T - 5}, {T - 1, 1}};
  }
  return {{0, 1}, {0, 15}, {0, 16}, {0, 17}, {5, 17}, {1, n_tile - 1}, {0, n_tile}};
}

// Largest |value| among the dequantised values sharing element (t, c)'s metadata: int4 kernels
// compute s * n + z, whose rounding scales with the group's range, not with the element itself.
double meta_amax(KvFormat f, const std::vector<float>& k, int d, int t, int c) {
  int t_lo = t, t_hi = t + 1, c_lo = 0, c_hi = d;
  if (f.type == KvType::kInt4Asym) {
    c_lo = c / f.group * f.group;
    c_hi = c_lo + f.group;
  } else if (planner::is_per_channel(f)) {
    t_lo = t / f.group * f.group;
    t_hi = t_lo + f.group;
    c_lo = c;
    c_hi = c + 1;
  } else {
    return std::fabs(k[static_cast<size_t>(t) * d + c]);
  }
  double m = 0.0;
  for (int tt = t_lo; tt < t_hi; ++tt) {
    for (int cc = c_lo; cc < c_hi; ++cc)
      m = std::max<double>(m, std::fabs(k[static_cast<size_t>(tt) * d + cc]));
  }
  return 3.0 * m;  // |s n| + |z| <= 3 amax
}

// dot and axpy of `tr` against the dequantised rows (load) in double precision.
void check_fused_vs_reference(const KvFormatTraits& tr, KvFormat f, int d, double rel_tol) {
  if (!planner::check_kv_format(f, d).ok()) return;
  const int n_tile = planner::is_per_channel(f) ? f.group : 48;
  const std::vector<float> x = outlier_keys(n_tile, d, 100 + d);
  const std::vector<uint8_t> b = store_all(*kv_traits_scalar(f.type), f, d, x.data(), n_tile);
  const std::vector<float> k = load_all(*kv_traits_scalar(f.type), f, d, b.data(), n_tile);
  const std::vector<float> q = randn(d, 5);
  const std::vector<float> p = randn(n_tile, 6);
  const KvRowGeom g = kv_row_geom(f, d);
  for (RunCase rc : runs_for(f, n_tile)) {
    std::vector<float> scores(rc.n, -1.0f);
    tr.dot(g, q.data(), b.data(), rc.t0, rc.n, scores.data());
    for (int j = 0; j < rc.n; ++j) {
      const float* kr = k.data() + static_cast<size_t>(rc.t0 + j) * d;
      double want = 0.0, mag = 0.0;
      for (int i = 0; i < d; ++i) {
        want += static_cast<double>(q[i]) * kr[i];
        mag += std::fabs(static_cast<double>(q[i])) * meta_amax(f, k, d, rc.t0 + j, i);
      }
      ASSERT_NEAR(scores[j], want, rel_tol * mag + 1e-30)
          << planner::kv_format_name(f) << " d=" << d << " t0=" << rc.t0 << " j=" << j;
    }
    std::vector<float> acc = randn(d, 8);
    const std::vector<float> acc0 = acc;
    tr.axpy(g, p.data() + rc.t0, b.data(), rc.t0, rc.n, acc.data());
    for (int i = 0; i < d; ++i) {
      double want = acc0[i], mag = std::fabs(acc0[i]);
      for (int j = 0; j < rc.n; ++j) {
        const double term =
            static_cast<double>(p[rc.t0 + j]) * k[static_cast<size_t>(rc.t0 + j) * d + i];
        want += term;
        mag += std::fabs(static_cast<double>(p[rc.t0 + j])) * meta_amax(f, k, d, rc.t0 + j, i);
      }
      ASSERT_NEAR(acc[i], want, rel_tol * mag + 1e-30)
          << planner::kv_format_name(f) << " d=" << d << " t0=" << rc.t0 << " i=" << i;
    }
  }
}

TEST(KvFormatFused, ScalarDotAndAxpyMatchDequantisedReference) {
  for (KvFormat f : kAllFormats) {
    for (int d : {64, 128, 256})
      check_fused_vs_reference(*kv_traits_scalar(f.type), f, d, kFusedRelTol);
  }
}

TEST(KvFormatFused, Avx2DotAndAxpyMatchDequantisedReference) {
  if (!has_avx2()) GTEST_SKIP() << "no AVX2+FMA+F16C";
  for (KvFormat f : kAllFormats) {
    for (int d : {64, 128, 256})
      check_fused_vs_reference(*kv_traits_avx2(f.type), f, d, kAvx2RelTol);
  }
  // Widths the vector loops hand to the scalar twin or finish with a tail.
  check_fused_vs_reference(*kv_traits_avx2(KvType::kF16), {KvType::kF16, 0}, 40, kAvx2RelTol);
  check_fused_vs_reference(*kv_traits_avx2(KvType::kInt8), {KvType::kInt8, 0}, 12, kAvx2RelTol);
  check_fused_vs_reference(*kv_traits_avx2(KvType::kFp8E4M3), {KvType::kFp8E4M3, 0}, 24,
                           kAvx2RelTol);
  check_fused_vs_reference(*kv_traits_avx2(KvType::kInt4Channel), {KvType::kInt4Channel, 16}, 48,
                           kAvx2RelTol);
  check_fused_vs_reference(*kv_traits_avx2(KvType::kInt8Channel), {KvType::kInt8Channel, 16}, 40,
                           kAvx2RelTol);
}

// AVX2 against scalar directly, every kernel, on the same packed bytes.
TEST(KvFormatAvx2, MatchesScalarEveryKernel) {
  if (!has_avx2()) GTEST_SKIP() << "no AVX2+FMA+F16C";
  for (KvFormat f : kAllFormats) {
    for (int d : {64, 128, 256}) {
      if (!planner::check_kv_format(f, d).ok()) continue;
      const KvFormatTraits& sc = *kv_traits_scalar(f.type);
      const KvFormatTraits& av = *kv_traits_avx2(f.type);
      const int n_tile = planner::is_per_channel(f) ? f.group : 40;
      const std::vector<float> x = randn(static_cast<size_t>(n_tile) * d, 30 + d, 3.0f);
      const std::vector<uint8_t> bs = store_all(sc, f, d, x.data(), n_tile);
      const std::vector<uint8_t> ba = store_all(av, f, d, x.data(), n_tile);
      EXPECT_EQ(bs, ba) << "store " << planner::kv_format_name(f) << " d=" << d;  // bit-exact
      EXPECT_EQ(load_all(sc, f, d, bs.data(), n_tile), load_all(av, f, d, bs.data(), n_tile));
      const std::vector<float> q = randn(d, 31);
      const std::vector<float> p = randn(n_tile, 32);
      const KvRowGeom g = kv_row_geom(f, d);
      std::vector<float> s1(n_tile), s2(n_tile);
      sc.dot(g, q.data(), bs.data(), 0, n_tile, s1.data());
      av.dot(g, q.data(), bs.data(), 0, n_tile, s2.data());
      std::vector<float> a1(d, 0.0f), a2(d, 0.0f);
      sc.axpy(g, p.data(), bs.data(), 0, n_tile, a1.data());
      av.axpy(g, p.data(), bs.data(), 0, n_tile, a2.data());
      double smag = 0.0, amag = 0.0;  // scale of the results: sum |q| * 3 sigma etc.
      for (float v : q) smag += std::fabs(v) * 3.0;
      for (float v : p) amag += std::fabs(v) * 3.0;
      for (int j = 0; j < n_tile; ++j) {
        EXPECT_NEAR(s1[j], s2[j], kAvx2RelTol * smag * 4)
            << planner::kv_format_name(f) << " d=" << d;
      }
      for (int i = 0; i < d; ++i) {
        EXPECT_NEAR(a1[i], a2[i], kAvx2RelTol * amag * 4)
            << planner::kv_format_name(f) << " d=" << d;
      }
    }
  }
}

// ---- Hadamard rotation ---------------------------------------------------------------------

TEST(KvFormatRotate, HandComputed) {
  float a[4] = {1.0f, 0.0f, 0.0f, 0.0f};
  hadamard_rotate_scalar(a, 4);
  for (float v : a) EXPECT_EQ(v, 0.5f);
  float b[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  hadamard_rotate_scalar(b, 4);
  EXPECT_EQ(b[0], 2.0f);
  EXPECT_EQ(b[1], 0.0f);
  EXPECT_EQ(b[2], 0.0f);
  EXPECT_EQ(b[3], 0.0f);
  float c[2] = {3.0f, 1.0f};  // H2 / sqrt2
  hadamard_rotate_scalar(c, 2);
  EXPECT_FLOAT_EQ(c[0], 4.0f / std::sqrt(2.0f));
  EXPECT_FLOAT_EQ(c[1], 2.0f / std::sqrt(2.0f));
}

TEST(KvFormatRotate, PreservesDotAndIsAnInvolution) {
  for (int d : {8, 16, 64, 128, 256}) {
    std::vector<float> q = randn(d, 40 + d), k = outlier_keys(1, d, 41 + d);
    double ref = 0.0, nq = 0.0, nk = 0.0;
    for (int i = 0; i < d; ++i) {
      ref += static_cast<double>(q[i]) * k[i];
      nq += static_cast<double>(q[i]) * q[i];
      nk += static_cast<double>(k[i]) * k[i];
    }
    std::vector<float> qr = q, kr = k;
    hadamard_rotate(qr.data(), d);
    hadamard_rotate(kr.data(), d);
    double rot = 0.0;
    for (int i = 0; i < d; ++i) rot += static_cast<double>(qr[i]) * kr[i];
    // log2(d) rounded butterfly stages + the normalisation: a few fp32 ulps of |q||k| each.
    const double eps = std::ldexp(1.0, -24) * (std::log2(d) + 2) * 2;
    EXPECT_NEAR(rot, ref, eps * std::sqrt(nq * nk)) << d;
    hadamard_rotate(kr.data(), d);
    for (int i = 0; i < d; ++i) EXPECT_NEAR(kr[i], k[i], eps * std::sqrt(nk)) << d;
  }
}

TEST(KvFormatRotate, Avx2BitIdenticalToScalar) {
  if (!has_avx2()) GTEST_SKIP() << "no AVX2+FMA+F16C";
  for (int d : {1, 2, 4, 8, 16, 32, 64, 128, 256, 1024}) {
    std::vector<float> a = randn(d, 50 + d), b = a;
    hadamard_rotate_scalar(a.data(), d);
    hadamard_rotate_avx2(b.data(), d);
    EXPECT_EQ(a, b) << d;
  }
}

}  // namespace
}  // namespace bie::kv
