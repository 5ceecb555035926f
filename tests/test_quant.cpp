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

[[maybe_unused]] std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
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

}  // namespace
}  // namespace bie::quant
