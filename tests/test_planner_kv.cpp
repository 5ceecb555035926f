// KV formats and byte accounting: exact per-format sizes, the published figures of
// ../shared/BRIEF.md, and the paged block rules checked against brute force.
#include <gtest/gtest.h>

#include <algorithm>

#include "bie/planner/kv_bytes.h"
#include "bie/planner/kv_format.h"
#include "bie/planner/planner.h"
#include "bie/planner/presets.h"

namespace bie::planner {
namespace {

constexpr double kGiBd = 1024.0 * 1024.0 * 1024.0;

KvFormat fmt_of(std::string_view name, int group = 64, int block = 16) {
  auto f = parse_kv_format(name, group, block);
  EXPECT_TRUE(f.ok()) << name;
  return f.ok() ? f.value() : kKvF16;
}

// A dense model: n_layer layers of n_head_kv heads of width d, all global.
ModelGeometry dense(int n_layer, int n_head_kv, int d) {
  ModelGeometry g;
  g.name = "dense";
  g.n_layer = n_layer;
  g.n_head = n_head_kv * 4;
  g.head_dim = d;
  g.layers.assign(static_cast<size_t>(n_layer), LayerKv{n_head_kv, d, d, 0});
  return g;
}

ModelGeometry preset(std::string_view name) {
  auto g = preset_geometry(name);
  EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error());
  return g.ok() ? g.value() : ModelGeometry{};
}

TEST(KvFormat, BytesPerHeadTokenD128) {
  EXPECT_EQ(bytes_per_head_token(fmt_of("f16"), 128), 256u);
  EXPECT_EQ(bytes_per_head_token(fmt_of("fp8_e4m3"), 128), 130u);  // 128 + fp16 scale
  EXPECT_EQ(bytes_per_head_token(fmt_of("int8"), 128), 130u);
  EXPECT_EQ(bytes_per_head_token(fmt_of("int4_asym_g32"), 128), 64u + 4 * 4);
  EXPECT_EQ(bytes_per_head_token(fmt_of("int4_asym_g64"), 128), 72u);  // DESIGN.md's 72 B
  EXPECT_EQ(bytes_per_head_token(fmt_of("int4_asym_g128"), 128), 68u);
  EXPECT_EQ(bytes_per_head_token(fmt_of("int4_channel_t16"), 128), 64u + 4 * 128 / 16);
  EXPECT_EQ(bytes_per_head_token(fmt_of("int4_channel_t32"), 128), 64u + 4 * 128 / 32);
  EXPECT_EQ(bytes_per_head_token(fmt_of("q8_0"), 128), 4u * 34);    // 34/32 B per value
  EXPECT_EQ(bytes_per_head_token(fmt_of("q4_0"), 128), 4u * 18);    // 18/32 B per value
  EXPECT_EQ(bytes_per_head_token(fmt_of("int4_asym_g64"), 0), 0u);  // MLA has no V stream
}

TEST(KvFormat, ParseAndNameRoundTrip) {
  EXPECT_EQ(fmt_of("int4_asym", 128), (KvFormat{KvType::kInt4Asym, 128}));
  EXPECT_EQ(fmt_of("int4_channel", 64, 32), (KvFormat{KvType::kInt4Channel, 32}));
  EXPECT_EQ(fmt_of("fp16"), kKvF16);
  EXPECT_EQ(fmt_of("fp8"), (KvFormat{KvType::kFp8E4M3, 0}));
  for (std::string_view n : {"f16", "fp8_e4m3", "int8", "int4_asym_g32", "int4_asym_g64",
                             "int4_asym_g128", "int4_channel_t16", "q8_0", "q4_0"}) {
    EXPECT_EQ(kv_format_name(fmt_of(n)), n);
  }
  for (std::string_view bad : {"", "f32", "int4", "int4_asym_g48", "int4_asym_gx", "int4_asym64",
                               "int4_channel_t0", "Q8_0 "}) {
    auto f = parse_kv_format(bad, 64, 16);
    EXPECT_FALSE(f.ok()) << "accepted '" << bad << "'";
  }
  EXPECT_FALSE(parse_kv_format("int4_asym", 48, 16).ok());
}

TEST(KvFormat, RejectsHeadWidthsItCannotStore) {
  EXPECT_FALSE(check_kv_format(fmt_of("q8_0"), 80).ok());
  EXPECT_FALSE(check_kv_format(fmt_of("int4_asym_g128"), 64).ok());
  EXPECT_FALSE(check_kv_format(fmt_of("int4_channel_t16"), 7).ok());
  EXPECT_TRUE(check_kv_format(fmt_of("int4_asym_g64"), 576).ok());  // DeepSeek latent + rope
  EXPECT_TRUE(check_kv_format(fmt_of("q4_0"), 0).ok());
  KvLayout l;
  l.k = fmt_of("int4_channel_t32");
  EXPECT_FALSE(check_kv_layout(dense(2, 2, 128), l).ok()) << "token group 32 > block 16";
  l.block_size = 0;
  l.k = kKvF16;
  EXPECT_FALSE(check_kv_layout(dense(2, 2, 128), l).ok());
}

// ---- the published figures ------------------------------------------------------------------

TEST(KvPublished, Llama3_8B) {
  const ModelGeometry g = preset("llama-3-8b");
  EXPECT_EQ(kv_bytes_per_token(g, kKvF16, kKvF16), 128u * 1024);            // 128 KiB/token
  EXPECT_EQ(contiguous_kv_bytes(g, kKvF16, kKvF16, 65536, 1), 8ull << 30);  // 8 GiB at 64k
  EXPECT_EQ(contiguous_kv_bytes(g, kKvF16, kKvF16, 8192, 1), 1ull << 30);
  EXPECT_EQ(contiguous_kv_bytes(g, kKvF16, kKvF16, 32768, 1), 4ull << 30);
  const KvFormat i4 = fmt_of("int4_asym_g64");
  EXPECT_EQ(kv_bytes_per_token(g, i4, i4), 36u * 1024);          // 36 KiB/token
  EXPECT_EQ(kv_bytes_unpaged(g, i4, i4, 65536), 2304ull << 20);  // 2.25 GiB at 64k
}

TEST(KvPublished, SizingGuideTable32Layers8KvHeadsD128) {
  const ModelGeometry g32 = dense(32, 8, 128);
  const ModelGeometry g64 = dense(64, 8, 128);
  struct Row {
    std::string_view fmt;
    double gib[3];  // at 32k, 64k, 128k
  };
  for (const Row& r :
       {Row{"f16", {4, 8, 16}}, Row{"q8_0", {2.125, 4.25, 8.5}}, Row{"q4_0", {1.125, 2.25, 4.5}}}) {
    const KvFormat f = fmt_of(r.fmt);
    for (int i = 0; i < 3; ++i) {
      const int64_t n = int64_t{32768} << i;
      EXPECT_EQ(kv_bytes_unpaged(g32, f, f, n), static_cast<uint64_t>(r.gib[i] * kGiBd))
          << r.fmt << " " << n;
      EXPECT_EQ(kv_bytes_unpaged(g64, f, f, n), 2 * static_cast<uint64_t>(r.gib[i] * kGiBd));
    }
  }
}

TEST(KvPublished, ThreeGiBBudgetTokens) {
  // The guide: ~3 GiB of KV gives "~45k tokens at q8_0 or ~87k at q4_0". Exactly, with 16-token
  // blocks: 3 GiB / 69632 B = 46261 -> 46256 tokens (45.2 x 1024) and 3 GiB / 36864 B = 87381 ->
  // 87376 tokens. The guide's two figures are each within 3 % of these.
  const ModelGeometry g = dense(32, 8, 128);
  KvLayout l;
  l.k = l.v = fmt_of("q8_0");
  const int64_t q8 = kv_max_tokens(g, l, 3ull << 30, 1, kMaxPlanContext);
  EXPECT_EQ(q8, 46256);
  EXPECT_NEAR(q8 / 45000.0, 1.0, 0.03);
  l.k = l.v = fmt_of("q4_0");
  const int64_t q4 = kv_max_tokens(g, l, 3ull << 30, 1, kMaxPlanContext);
  EXPECT_EQ(q4, 87376);
  EXPECT_NEAR(q4 / 87000.0, 1.0, 0.03);
}

TEST(KvPublished, MlaDeepSeekV3AgainstMhaEquivalent) {
  const ModelGeometry g = preset("deepseek-v3");
  ASSERT_TRUE(g.mla);
  EXPECT_EQ(kv_bytes_per_token(g, kKvF16, kKvF16), 61u * (512 + 64) * 2);  // 70,272 B
  ModelGeometry mha = g;  // the same attention without the latent: 128 heads, K 192 wide, V 128
  mha.mla = false;
  for (auto& l : mha.layers) l = LayerKv{128, 192, 128, 0};
  const double reduction = 1.0 - static_cast<double>(kv_bytes_per_token(g, kKvF16, kKvF16)) /
                                     static_cast<double>(kv_bytes_per_token(mha, kKvF16, kKvF16));
  EXPECT_GT(reduction, 0.90);
  EXPECT_NEAR(reduction, 1.0 - 576.0 / (128 * 320), 1e-12);  // 98.6 %
}

TEST(KvPublished, SlidingWindowHybridGemma3) {
  const ModelGeometry g = preset("gemma-3-27b");
  ASSERT_EQ(g.n_layer, 62);
  EXPECT_EQ(g.n_swa_layers(), 52);  // layers 5, 11, ..., 59 are global
  for (int64_t il = 0; il < 62; ++il) EXPECT_EQ(g.layers[il].window == 0, il % 6 == 5) << il;
  const int64_t S = 131072;
  const uint64_t flat = contiguous_kv_bytes(g, kKvF16, kKvF16, S, 1);
  const uint64_t swa = kv_bytes_unpaged(g, kKvF16, kKvF16, S);
  EXPECT_EQ(swa, (10ull * S + 52ull * 1024) * 2 * 16 * 128 * 2);         // BRIEF §4 SWA formula
  EXPECT_LT(static_cast<double>(swa), 0.2 * static_cast<double>(flat));  // 16.8 % of flat
  // Paged, the local layers hold at most ceil((1024 - 1) / 16) + 1 = 65 blocks.
  KvLayout l;
  const uint64_t paged = kv_sequence_bytes(g, l, S);
  EXPECT_GE(paged, swa);
  EXPECT_LE(paged, swa + 52ull * 16 * 2 * 16 * 128 * 2);
}

// ---- paged accounting ---------------------------------------------------------------------

// Brute force: classify each block of a sequence of n tokens by the rule in kv_bytes.h.
KvBlockCount brute_count(const KvLayout& l, int64_t n, int64_t window) {
  KvBlockCount c;
  const int64_t B = l.block_size;
  for (int64_t b = 0; b * B < n; ++b) {
    const int64_t first = b * B, last = std::min(n, (b + 1) * B) - 1;
    if (window > 0 && last < n - window) continue;  // outside the sliding window: freed
    const bool sink = window == 0 && first < l.sink_tokens;
    const bool recent = last >= n - l.window_tokens;
    if (l.mixed() && (sink || recent)) {
      ++c.fp16;
    } else {
      ++c.body;
    }
  }
  return c;
}

TEST(KvPaged, BlockCountMatchesBruteForce) {
  for (int B : {1, 4, 16}) {
    for (int sink : {0, 3, 8, 20}) {
      for (int win : {0, 6, 16, 33}) {
        for (int64_t window : {0, 10, 64}) {
          KvLayout l;
          l.block_size = B;
          l.sink_tokens = sink;
          l.window_tokens = win;
          l.k = l.v = fmt_of("int4_asym_g64");
          for (int64_t n = 0; n <= 200; ++n) {
            ASSERT_EQ(kv_block_count(l, n, window), brute_count(l, n, window))
                << "B " << B << " sink " << sink << " win " << win << " swa " << window << " n "
                << n;
          }
          l.k = l.v = kKvF16;  // unmixed: everything kept is body
          for (int64_t n = 0; n <= 100; ++n) {
            ASSERT_EQ(kv_block_count(l, n, window), brute_count(l, n, window));
          }
        }
      }
    }
  }
}

TEST(KvPaged, PoolPlanIsThePeakOverAllLengths) {
  ModelGeometry g = dense(3, 2, 64);
  g.layers[1].window = 40;  // one local layer: two groups
  ASSERT_EQ(kv_layer_groups(g, KvLayout{}).size(), 2u);
  for (int B : {4, 16}) {
    for (int64_t L : {1, 5, 16, 17, 100, 257}) {
      KvLayout l;
      l.block_size = B;
      l.sink_tokens = 5;
      l.window_tokens = 12;
      l.k = fmt_of("int8");
      l.v = fmt_of("int4_asym_g32");
      const KvPoolPlan plan = kv_pool_plan(g, l, L, 3);
      ASSERT_EQ(plan.groups.size(), 2u);
      for (const KvGroupPool& p : plan.groups) {
        int64_t fp16 = 0, body = 0;
        for (int64_t n = 1; n <= L; ++n) {
          const KvBlockCount c = kv_block_count(l, n, p.group.shape.window);
          fp16 = std::max(fp16, c.fp16);
          body = std::max(body, c.body);
        }
        EXPECT_EQ(p.fp16_blocks, 3 * fp16) << "B " << B << " L " << L;
        EXPECT_EQ(p.body_blocks, 3 * body) << "B " << B << " L " << L;
      }
      // kv_max_tokens is the longest sequence whose pools fit (what the engine reserves), never
      // less than the running peak of the bytes held allows by more than one FP16 block.
      uint64_t budget = plan.total_bytes() / 3;
      uint64_t peak = 0;
      int64_t scan = 0, scan_held = 0;
      for (int64_t n = 1; n <= 400; ++n) {
        if (kv_pool_plan(g, l, n, 1).total_bytes() <= budget) scan = n;
        peak = std::max(peak, kv_sequence_bytes(g, l, n));
        if (peak <= budget) scan_held = n;
      }
      EXPECT_EQ(kv_max_tokens(g, l, budget, 1, 400), scan) << "B " << B << " L " << L;
      EXPECT_GE(scan, L) << "B " << B;  // the budget holds the pools for L
      EXPECT_LE(scan_held - scan, B) << "B " << B << " L " << L;
    }
  }
}

TEST(KvPaged, Llama3Int4SequenceBytesExact) {
  const ModelGeometry g = preset("llama-3-8b");
  KvLayout l;
  l.k = l.v = fmt_of("int4_asym_g64");
  // 65536 tokens = 4096 blocks: block 0 (sinks) and blocks 4088..4095 (last 128) in FP16.
  const uint64_t f16_block = 16 * 131072, body_block = 16 * 36864;
  EXPECT_EQ(block_bytes(g, kKvF16, kKvF16, 16), f16_block);
  EXPECT_EQ(kv_sequence_bytes(g, l, 65536), 9 * f16_block + 4087 * body_block);
  // Peak FP16 use is 10 blocks (the window straddles 9 blocks when not aligned).
  EXPECT_EQ(kv_fp16_overhead_bytes(g, l), 10 * (f16_block - body_block));
  const KvPoolPlan pools = kv_pool_plan(g, l, 65536, 2);
  ASSERT_EQ(pools.groups.size(), 1u);
  EXPECT_EQ(pools.groups[0].fp16_blocks, 2 * 10);
  EXPECT_EQ(pools.groups[0].body_blocks, 2 * 4087);
}

TEST(KvPaged, F16PoolEqualsContiguousCacheWhenAligned) {
  // The foundation's contiguous f16 cache and a paged f16 pool agree to the byte whenever the
  // length is a multiple of the block size; otherwise paging rounds up to whole blocks.
  const ModelGeometry g = dense(30, 3, 64);  // SmolLM2's KV shape
  KvLayout l;
  EXPECT_EQ(kv_pool_plan(g, l, 8192, 4).total_bytes(),
            contiguous_kv_bytes(g, kKvF16, kKvF16, 8192, 4));
  EXPECT_EQ(kv_pool_plan(g, l, 8193, 1).total_bytes(),
            contiguous_kv_bytes(g, kKvF16, kKvF16, 8208, 1));
}

}  // namespace
}  // namespace bie::planner
