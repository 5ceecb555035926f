// Quant formats: scalar dequantisers against the formats' definitions (hand-built blocks and
// golden hashes from an independent implementation), quantise->dequantise round trips, and the
// AVX2 table against the scalar one.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "bie/quant/blocks.h"
#include "bie/quant/fp16.h"
#include "bie/quant/traits.h"
#include "bie/quant/types.h"

namespace bie::quant {
namespace {

using G = GgmlType;

// ---- helpers -------------------------------------------------------------------------------

struct SplitMix64 {
  uint64_t x;
  uint64_t next() {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

uint64_t fnv1a(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

std::vector<float> dequant(const TypeTraits* t, const std::vector<uint8_t>& data, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  t->to_float(data.data(), y.data(), n);
  return y;
}

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

const G kWeightTypes[] = {G::F32,  G::F16,  G::BF16, G::Q4_0, G::Q4_1, G::Q5_0, G::Q5_1,
                          G::Q8_0, G::Q2_K, G::Q3_K, G::Q4_K, G::Q5_K, G::Q6_K};

// ---- type table ----------------------------------------------------------------------------

TEST(QuantTypes, NamesIdsAndSizes) {
  EXPECT_EQ(type_name(G::Q4_K), "q4_K");
  EXPECT_EQ(type_name(G::IQ2_XXS), "iq2_xxs");
  EXPECT_EQ(type_name(static_cast<G>(1000)), "unknown");
  EXPECT_EQ(type_from_name("Q4_K"), G::Q4_K);
  EXPECT_EQ(type_from_name("bf16"), G::BF16);
  EXPECT_FALSE(type_from_name("q4_2").has_value());  // removed from ggml
  EXPECT_FALSE(type_from_name("nope").has_value());
  EXPECT_TRUE(is_known(G::TQ2_0));
  EXPECT_FALSE(is_supported(G::TQ2_0));
  EXPECT_FALSE(is_supported(G::IQ4_XS));
  EXPECT_EQ(traits(G::IQ4_XS), nullptr);
  EXPECT_EQ(static_cast<int>(G::BF16), 30);
  EXPECT_EQ(static_cast<int>(G::Q8_K), 15);
  EXPECT_EQ(row_size(G::Q4_0, 64), 36u);
  EXPECT_EQ(row_size(G::Q6_K, 512), 420u);
  EXPECT_EQ(row_size(G::F16, 3), 6u);
  EXPECT_EQ(block_size(G::Q4_K), 256);
  EXPECT_EQ(type_size(G::Q8_K), 292u);
  // ggml's pairing of weight type and activation type.
  EXPECT_EQ(traits(G::Q4_0)->vec_dot_type, G::Q8_0);
  EXPECT_EQ(traits(G::Q5_0)->vec_dot_type, G::Q8_0);
  EXPECT_EQ(traits(G::Q8_0)->vec_dot_type, G::Q8_0);
  EXPECT_EQ(traits(G::Q4_1)->vec_dot_type, G::Q8_1);
  EXPECT_EQ(traits(G::Q5_1)->vec_dot_type, G::Q8_1);
  for (G t : {G::Q2_K, G::Q3_K, G::Q4_K, G::Q5_K, G::Q6_K})
    EXPECT_EQ(traits(t)->vec_dot_type, G::Q8_K);
  EXPECT_EQ(traits(G::F16)->vec_dot_type, G::F16);
  EXPECT_EQ(traits(G::BF16)->vec_dot_type, G::BF16);
  EXPECT_EQ(traits(G::F32)->vec_dot_type, G::F32);
  for (G t : kWeightTypes) {
    ASSERT_NE(traits_scalar(t), nullptr) << type_name(t);
    EXPECT_EQ(traits_scalar(t)->name, type_name(t));
  }
}

// ---- fp16 / bf16 ---------------------------------------------------------------------------

TEST(QuantFp16, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_EQ(fp32_to_fp16(f), h | 0x200u) << h;  // NaNs come back quiet
      continue;
    }
    ASSERT_EQ(fp32_to_fp16(f), h) << h;
  }
}

TEST(QuantFp16, RoundsToNearestEven) {
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(fp32_to_fp16(1.0f + 0x1p-11f), 0x3C00);      // tie -> even (down)
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3C02);  // tie -> even (up)
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7BFF);
  EXPECT_EQ(fp32_to_fp16(65519.0f), 0x7BFF);
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7C00);  // rounds to inf
  EXPECT_EQ(fp32_to_fp16(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(fp32_to_fp16(0x1p-25f), 0x0000);  // tie -> even (zero)
  EXPECT_EQ(fp32_to_fp16(0x1.8p-25f), 0x0001);
  EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(fp32_to_bf16(1.0f + 0x1p-8f), 0x3F80);  // tie -> even
  EXPECT_EQ(fp32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);
  EXPECT_EQ(bf16_to_fp32(0x3F80), 1.0f);
}

// ---- golden dequantisation -----------------------------------------------------------------
// Random blocks (SplitMix64 bytes, fp16 scale fields forced finite) dequantised by gguf-py 0.19
// (gguf.quants.dequantize, a numpy port of ggml's dequantisers); the FNV-1a hash of the float32
// output is pinned here. Any single-bit difference in any value fails the test.
// scripts/make_quant_goldens.py rebuilds the same blocks and prints these hashes (--check compares
// them with this file).

struct GoldenSpec {
  G type;
  std::vector<int> half_offsets;  // fp16 fields inside a block
  uint64_t hash;
};

std::vector<uint8_t> golden_blocks(const GoldenSpec& s, int64_t* n_values) {
  const size_t bs = type_size(s.type);
  const int n_blocks = bs == 2 ? 64 : 8;
  SplitMix64 r{0x1234u + static_cast<uint64_t>(s.type)};
  std::vector<uint8_t> data(bs * static_cast<size_t>(n_blocks));
  for (auto& b : data) b = static_cast<uint8_t>(r.next() & 0xFF);
  for (int i = 0; i < n_blocks; ++i) {
    for (int o : s.half_offsets) {
      const uint64_t v = r.next();
      const uint32_t h =
          (0x1C00u + static_cast<uint32_t>(v % 0x1000)) | (((v >> 20) & 1) ? 0x8000u : 0u);
      data[i * bs + o] = static_cast<uint8_t>(h & 0xFF);
      data[i * bs + o + 1] = static_cast<uint8_t>(h >> 8);
    }
  }
  if (s.type == G::F16 || s.type == G::BF16) {
    for (int i = 0; i < n_blocks; ++i) {
      uint8_t& hi = data[2 * i + 1];
      if (s.type == G::F16 && (hi & 0x7C) == 0x7C) hi &= 0xBF;
      if (s.type == G::BF16 && (hi & 0x7F) == 0x7F && (data[2 * i] & 0x80)) hi &= 0xBF;
    }
  }
  *n_values = n_blocks * block_size(s.type);
  return data;
}

const std::vector<GoldenSpec>& golden_specs() {
  static const std::vector<GoldenSpec> specs = {
      {G::F16, {}, 0x592d46f24d5a1c90ull},      {G::BF16, {}, 0x5e57115482fe34d0ull},
      {G::Q4_0, {0}, 0x22c3baa631d3163dull},    {G::Q4_1, {0, 2}, 0xb5a174b6aacfc5f4ull},
      {G::Q5_0, {0}, 0xe91b9af000df358cull},    {G::Q5_1, {0, 2}, 0x238179cd53ecc1f3ull},
      {G::Q8_0, {0}, 0x80eeaf042d8ed1a5ull},    {G::Q2_K, {80, 82}, 0xb20518b08291504bull},
      {G::Q3_K, {108}, 0xe7533bff15672591ull},  {G::Q4_K, {0, 2}, 0xf551c0bd10744398ull},
      {G::Q5_K, {0, 2}, 0x9e27a6aaef0d0a18ull}, {G::Q6_K, {208}, 0x37d2c9b828749cfeull},
  };
  return specs;
}

TEST(QuantGolden, ScalarDequantMatchesGgufPy) {
  for (const GoldenSpec& s : golden_specs()) {
    int64_t n = 0;
    const auto data = golden_blocks(s, &n);
    const auto y = dequant(traits_scalar(s.type), data, n);
    EXPECT_EQ(fnv1a(y.data(), y.size() * sizeof(float)), s.hash) << type_name(s.type);
  }
}

TEST(QuantGolden, Avx2DequantMatchesGgufPy) {
  if (traits_avx2(G::F32) == nullptr) GTEST_SKIP() << "no AVX2 on this CPU";
  for (const GoldenSpec& s : golden_specs()) {
    int64_t n = 0;
    const auto data = golden_blocks(s, &n);
    const auto y = dequant(traits_avx2(s.type), data, n);
    EXPECT_EQ(fnv1a(y.data(), y.size() * sizeof(float)), s.hash) << type_name(s.type);
  }
}

// ---- hand-built blocks: the format definitions, value by value -------------------------------

TEST(QuantDequant, Q4_0AndQ4_1ByDefinition) {
  BlockQ4_0 a{};
  a.d = fp32_to_fp16(0.5f);
  for (int j = 0; j < 16; ++j) a.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  traits_scalar(G::Q4_0)->to_float(&a, y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * (j - 8));
    EXPECT_EQ(y[j + 16], 0.5f * (15 - j - 8));
  }
  BlockQ4_1 b{};
  b.d = fp32_to_fp16(0.25f);
  b.m = fp32_to_fp16(-1.0f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | (3 << 4));
  traits_scalar(G::Q4_1)->to_float(&b, y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.25f * j - 1.0f);
    EXPECT_EQ(y[j + 16], 0.25f * 3 - 1.0f);
  }
}

TEST(QuantDequant, Q5AndQ8ByDefinition) {
  BlockQ5_0 a{};
  a.d = fp32_to_fp16(2.0f);
  const uint32_t qh = 0x80000001u;  // fifth bit of value 0 and value 31
  std::memcpy(a.qh, &qh, 4);
  for (int j = 0; j < 16; ++j) a.qs[j] = 0x00;
  a.qs[15] = 0xF0;  // value 31 low bits = 15
  float y[32];
  traits_scalar(G::Q5_0)->to_float(&a, y, 32);
  EXPECT_EQ(y[0], 2.0f * (16 - 16));
  EXPECT_EQ(y[1], 2.0f * (0 - 16));
  EXPECT_EQ(y[31], 2.0f * (31 - 16));
  BlockQ5_1 b{};
  b.d = fp32_to_fp16(1.0f);
  b.m = fp32_to_fp16(0.5f);
  const uint32_t qh2 = 1u << 20;  // value 20
  std::memcpy(b.qh, &qh2, 4);
  b.qs[4] = 0x70;  // value 20 = high nibble of byte 4
  traits_scalar(G::Q5_1)->to_float(&b, y, 32);
  EXPECT_EQ(y[20], 16.0f + 7.0f + 0.5f);
  EXPECT_EQ(y[4], 0.5f);
  BlockQ8_0 c{};
  c.d = fp32_to_fp16(0.125f);
  for (int j = 0; j < 32; ++j) c.qs[j] = static_cast<int8_t>(j * 8 - 127);
  traits_scalar(G::Q8_0)->to_float(&c, y, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], 0.125f * (j * 8 - 127));
}

TEST(QuantDequant, KQuantsByDefinition) {
  float y[256];
  {  // Q2_K: value 130 (second half, k = 0, l = 2) -> qs[34] bits 0-1; group 8.
    BlockQ2_K b{};
    b.d = fp32_to_fp16(1.0f);
    b.dmin = fp32_to_fp16(0.5f);
    b.scales[8] = static_cast<uint8_t>(3 | (2 << 4));
    b.qs[34] = 0x02 | (0x3 << 6);  // value 130 = 2; value 32*3+128+2 = 226 = 3 (group 14)
    traits_scalar(G::Q2_K)->to_float(&b, y, 256);
    EXPECT_EQ(y[130], 1.0f * 3 * 2 - 0.5f * 2);
    EXPECT_EQ(y[131], 1.0f * 3 * 0 - 0.5f * 2);
    EXPECT_EQ(y[226], 0.0f);  // group 14 has scale 0 and min 0
  }
  {  // Q3_K: scale of group 5 = 40 - 32 = 8; value 80 (group 5): k = 2, l = 16, hmask bit 2.
    BlockQ3_K b{};
    b.d = fp32_to_fp16(0.5f);
    // s[5] = 40 = 0b10'1000: low nibble 8 in scales[5] low nibble; high bits 2 in scales[8+1] bits
    // 2-3.
    b.scales[5] = 0x08;
    b.scales[9] = 2 << 2;
    b.qs[16] = 0x1 << 4;   // low bits of value 80 = 1
    b.hmask[16] = 1 << 2;  // high bit set: q = 1 (not 1 - 4)
    traits_scalar(G::Q3_K)->to_float(&b, y, 256);
    EXPECT_EQ(y[80], 0.5f * 8 * 1);
    EXPECT_EQ(y[81], 0.5f * 8 * (0 - 4));   // high bit clear: q = 0 - 4
    EXPECT_EQ(y[0], 0.5f * -32 * (0 - 4));  // s[0] = 0 -> scale -32
  }
  {  // Q4_K: group 5 (j >= 4 packing), value 5*32+3 = 163 -> high nibble of qs[64+3].
    BlockQ4_K b{};
    b.d = fp32_to_fp16(0.25f);
    b.dmin = fp32_to_fp16(2.0f);
    // sc[5] = 0b11'0110 (54): low 4 in scales[9] low nibble, top 2 in scales[1] bits 6-7.
    // m[5] = 0b01'0011 (19): low 4 in scales[9] high nibble, top 2 in scales[5] bits 6-7.
    b.scales[9] = 0x6 | (0x3 << 4);
    b.scales[1] = 0x3 << 6;
    b.scales[5] = 0x1 << 6;
    b.qs[67] = 0x9 << 4;
    traits_scalar(G::Q4_K)->to_float(&b, y, 256);
    EXPECT_EQ(y[163], 0.25f * 54 * 9 - 2.0f * 19);
    EXPECT_EQ(y[35], 0.0f);  // group 1: sc = scales[1] & 63 = 0, m = scales[5] & 63 = 0
  }
  {  // Q5_K: value 100 (group 3, byte 32+4 high nibble, qh[4] bit 3).
    BlockQ5_K b{};
    b.d = fp32_to_fp16(1.0f);
    b.dmin = fp32_to_fp16(1.0f);
    b.scales[3] = 2;  // sc[3] = 2
    b.scales[7] = 1;  // m[3] = 1
    b.qs[36] = 0x5 << 4;
    b.qh[4] = 1 << 3;
    traits_scalar(G::Q5_K)->to_float(&b, y, 256);
    EXPECT_EQ(y[100], 2.0f * (16 + 5) - 1.0f);
  }
  {  // Q6_K: value 200 = h 1, k 2 (r = 72), l = 8: high nibble of ql[64+8], qh[32+8] bits 4-5.
    BlockQ6_K b{};
    b.d = fp32_to_fp16(0.5f);
    b.scales[12] = -3;  // group 200/16 = 12
    b.ql[72] = 0x7 << 4;
    b.qh[40] = 0x2 << 4;
    traits_scalar(G::Q6_K)->to_float(&b, y, 256);
    EXPECT_EQ(y[200], 0.5f * -3 * ((0x7 | (0x2 << 4)) - 32));
    EXPECT_EQ(y[201], 0.5f * -3 * (0 - 32));
  }
}

TEST(QuantActivations, Q8KDefinition) {
  std::vector<float> x(256, 0.0f);
  x[3] = 1.0f;
  x[7] = -2.0f;  // largest magnitude: maps to -127 * (-2)/(-2) -> q = 127 * sign
  x[8] = 2.0f;   // same magnitude later: the first one (-2) sets the sign of the scale
  x[100] = 0.5f;
  BlockQ8_K b;
  traits_scalar(G::Q8_K)->from_float(x.data(), &b, 256);
  EXPECT_EQ(b.d, 1.0f / (-127.f / -2.0f));
  EXPECT_EQ(b.qs[7], -127);
  EXPECT_EQ(b.qs[8], 127);
  EXPECT_EQ(b.qs[3], 64);    // 63.5 ties to even
  EXPECT_EQ(b.qs[100], 32);  // 31.75
  EXPECT_EQ(b.bsums[0], -127 + 127 + 64);
  EXPECT_EQ(b.bsums[6], 32);
}

TEST(QuantActivations, Q8_1StoresScaledSum) {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j) - 10.0f;  // amax 21
  BlockQ8_1 b;
  traits_scalar(G::Q8_1)->from_float(x.data(), &b, 32);
  int sum = 0;
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(b.qs[j], static_cast<int>(std::nearbyint((j - 10.0f) * (127.f / 21.f)))) << j;
    sum += b.qs[j];
  }
  EXPECT_EQ(b.d, fp32_to_fp16(21.f / 127.f));
  EXPECT_EQ(b.s, fp32_to_fp16(21.f / 127.f * static_cast<float>(sum)));
}

// ---- round trips ---------------------------------------------------------------------------

// RMS error of quantise->dequantise on N(0,1) data, relative to the data's RMS. Bounds are the
// format's step (range / levels) over sqrt(12) with headroom for scale rounding; the simple K
// quantisers here do not search for optimal scales, so they get a looser bound than ggml's.
double round_trip_rel_rms(const TypeTraits* t, const std::vector<float>& x) {
  std::vector<uint8_t> q(row_size(t->type, static_cast<int64_t>(x.size())));
  t->from_float(x.data(), q.data(), static_cast<int64_t>(x.size()));
  std::vector<float> y(x.size());
  t->to_float(q.data(), y.data(), static_cast<int64_t>(x.size()));
  double e = 0, s = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    e += (x[i] - y[i]) * static_cast<double>(x[i] - y[i]);
    s += x[i] * static_cast<double>(x[i]);
  }
  return std::sqrt(e / s);
}

TEST(QuantRoundTrip, ErrorWithinFormatBound) {
  const std::pair<G, double> bounds[] = {
      {G::F32, 0.0},   {G::F16, 4e-4},  {G::BF16, 3e-3}, {G::Q8_0, 0.01}, {G::Q8_1, 0.01},
      {G::Q8_K, 0.01}, {G::Q4_0, 0.12}, {G::Q4_1, 0.10}, {G::Q5_0, 0.06}, {G::Q5_1, 0.05},
      {G::Q2_K, 0.45}, {G::Q3_K, 0.22}, {G::Q4_K, 0.12}, {G::Q5_K, 0.06}, {G::Q6_K, 0.03},
  };
  const auto x = random_floats(4096, 7);
  for (auto [type, bound] : bounds) {
    const double e = round_trip_rel_rms(traits_scalar(type), x);
    EXPECT_LE(e, bound) << type_name(type);
    if (type != G::F32) {
      EXPECT_GT(e, 0.0) << type_name(type);  // a lossy format that lost nothing is suspect
    }
  }
}

TEST(QuantRoundTrip, ZeroAndConstantBlocks) {
  for (G type : kWeightTypes) {
    const TypeTraits* t = traits_scalar(type);
    for (float v : {0.0f, 0.75f, -3.0f}) {
      std::vector<float> x(256, v), y(256);
      std::vector<uint8_t> q(row_size(type, 256));
      t->from_float(x.data(), q.data(), 256);
      t->to_float(q.data(), y.data(), 256);
      for (int i = 0; i < 256; ++i)
        ASSERT_NEAR(y[i], v, std::fabs(v) * 0.02 + 1e-6) << type_name(type) << " " << i;
    }
  }
}

// ---- AVX2 vs scalar ------------------------------------------------------------------------

class QuantAvx2 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (traits_avx2(G::F32) == nullptr) GTEST_SKIP() << "no AVX2 on this CPU";
  }
};

// Dequantisation: both paths evaluate the same float expression in the same order, so they must
// agree exactly (no ulp allowance: a contracted FMA would be a bug to find here).
TEST_F(QuantAvx2, DequantIsBitExact) {
  const auto x = random_floats(2048, 11, 3.0f);
  for (G type : {G::F32, G::F16, G::BF16, G::Q4_0, G::Q4_1, G::Q5_0, G::Q5_1, G::Q8_0, G::Q8_1,
                 G::Q2_K, G::Q3_K, G::Q4_K, G::Q5_K, G::Q6_K, G::Q8_K}) {
    std::vector<uint8_t> q(row_size(type, 2048));
    traits_scalar(type)->from_float(x.data(), q.data(), 2048);
    const auto a = dequant(traits_scalar(type), q, 2048);
    const auto b = dequant(traits_avx2(type), q, 2048);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << type_name(type);
  }
}

// Activation quantisers: identical bytes (same scale formula, same ties-to-even rounding).
TEST_F(QuantAvx2, ActivationQuantIsByteIdentical) {
  auto x = random_floats(4096, 13, 2.0f);
  // Exact ties and special magnitudes: x * 127/amax lands on .5 for some of these.
  for (int i = 0; i < 64; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i % 17) * 0.5f - 4.0f;
  for (int i = 256; i < 512; ++i) x[static_cast<size_t>(i)] = 0.0f;  // an all-zero K block
  x[600] = 1e30f;
  x[601] = -1e-30f;
  for (G type : {G::Q8_0, G::Q8_1, G::Q8_K, G::F16, G::BF16}) {
    std::vector<uint8_t> a(row_size(type, 4096)), b(row_size(type, 4096));
    traits_scalar(type)->from_float(x.data(), a.data(), 4096);
    traits_avx2(type)->from_float(x.data(), b.data(), 4096);
    EXPECT_EQ(a, b) << type_name(type);
  }
}

// vec_dot: the paths sum in different orders (float lanes vs one scalar), so they agree to a
// few float ulps of the sum of |products|.
constexpr double kVecDotRelTol = 2e-6;

TEST_F(QuantAvx2, VecDotMatchesScalar) {
  for (int64_t n : {256, 512, 4096}) {
    const auto w = random_floats(static_cast<size_t>(n), 17);
    const auto x = random_floats(static_cast<size_t>(n), 19, 5.0f);
    for (G type : kWeightTypes) {
      const TypeTraits* ts = traits_scalar(type);
      const TypeTraits* ta = traits_avx2(type);
      std::vector<uint8_t> wq(row_size(type, n)), xq(row_size(ts->vec_dot_type, n));
      ts->from_float(w.data(), wq.data(), n);
      traits_scalar(ts->vec_dot_type)->from_float(x.data(), xq.data(), n);
      const auto wd = dequant(ts, wq, n);
      const auto xd = dequant(traits_scalar(ts->vec_dot_type), xq, n);
      double abs_sum = 0;
      for (int64_t i = 0; i < n; ++i) abs_sum += std::fabs(static_cast<double>(wd[i]) * xd[i]);
      const float s = ts->vec_dot(n, wq.data(), xq.data());
      const float a = ta->vec_dot(n, wq.data(), xq.data());
      EXPECT_NEAR(a, s, kVecDotRelTol * abs_sum + 1e-30) << type_name(type) << " n=" << n;
      EXPECT_NE(s, 0.0f) << type_name(type);
    }
  }
}

// vec_dot against its definition: sum of dequantised products. Q4_1/Q5_1 use the fp16 s = d*sum
// of Q8_1 for the min term, which carries fp16 rounding (2^-11 relative) of that term.
TEST(QuantVecDot, MatchesDequantisedDot) {
  const int64_t n = 1024;
  const auto w = random_floats(n, 23);
  const auto x = random_floats(n, 29);
  for (G type : kWeightTypes) {
    const TypeTraits* t = traits_scalar(type);
    std::vector<uint8_t> wq(row_size(type, n)), xq(row_size(t->vec_dot_type, n));
    t->from_float(w.data(), wq.data(), n);
    traits_scalar(t->vec_dot_type)->from_float(x.data(), xq.data(), n);
    const auto wd = dequant(t, wq, n);
    const auto xd = dequant(traits_scalar(t->vec_dot_type), xq, n);
    double ref = 0, abs_sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      ref += static_cast<double>(wd[i]) * xd[i];
      abs_sum += std::fabs(static_cast<double>(wd[i]) * xd[i]);
    }
    const bool fp16_sum = type == G::Q4_1 || type == G::Q5_1;
    const double tol = (fp16_sum ? 2e-3 : 2e-6) * abs_sum;
    EXPECT_NEAR(t->vec_dot(n, wq.data(), xq.data()), ref, tol) << type_name(type);
  }
}

}  // namespace
}  // namespace bie::quant
