// One accounting: what the engine's KV cache allocates equals what the planner predicts.
#include <gtest/gtest.h>

#include "support/contiguous_kv_cache.h"
#include "bie/model/model.h"
#include "bie/planner/kv_bytes.h"
#include "bie/planner/model_geometry.h"
#include "bie/planner/presets.h"
#include "support/paths.h"

namespace bie {
namespace {

TEST(KvAccounting, ContiguousCacheEqualsPlannerOnSmolLM2) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  auto model = load_model(test::smollm2_path());
  ASSERT_TRUE(model.ok()) << model.error();
  auto geo = planner::geometry_from_gguf((*model)->file());
  ASSERT_TRUE(geo.ok()) << geo.error();
  for (int64_t n_ctx : {1, 16, 4096, 8192}) {
    ContiguousKvCache kv(kv::kv_geometry((*model)->geometry()), n_ctx);
    EXPECT_EQ(kv.allocated_bytes(),
              planner::contiguous_kv_bytes(*geo, planner::kKvF16, planner::kKvF16, n_ctx, 1))
        << n_ctx;
  }
  ContiguousKvCache kv8k(kv::kv_geometry((*model)->geometry()), 8192);
  EXPECT_EQ(kv8k.allocated_bytes(), 188743680u);  // 23,040 B/token x 8192
}

// Issue 3's byte accounting for Llama-3-8B geometry (32 layers, 8 KV heads, d 128).
TEST(KvAccounting, Llama3_8BBytesPerToken) {
  const auto g = planner::preset_geometry("llama-3-8b").value();
  const planner::KvFormat g64{planner::KvType::kInt4Asym, 64};
  EXPECT_EQ(planner::kv_bytes_per_token(g, planner::kKvF16, planner::kKvF16), 128u * 1024);
  EXPECT_EQ(planner::kv_bytes_per_token(g, g64, g64), 36u * 1024);
  // The FP16 sink + window overhead of the default int4 regime (8 sink tokens, 128 window tokens,
  // blocks of 16) at 64k tokens: block 0 (sinks) and the last 8 blocks stay FP16, i.e. 9 blocks
  // x 16 tokens x (128 - 36) KiB = 12.9 MiB on top of 64k x 36 KiB = 2.25 GiB (+0.56 %).
  planner::KvLayout l;
  l.k = l.v = g64;
  const uint64_t n = 65536;
  const uint64_t seq = planner::kv_sequence_bytes(g, l, n);
  EXPECT_EQ(seq, 9u * 16 * 131072 + (n / 16 - 9) * 16 * 36864);
  EXPECT_EQ(seq - n * 36864, 9u * 16 * (131072 - 36864));
  // The pools hold the peak over all lengths up to n: one more FP16 block, for the token that
  // opens a new window block before the oldest window block has been quantised out.
  EXPECT_EQ(planner::kv_pool_plan(g, l, n, 1).total_bytes(), seq + 16u * 131072);
}

}  // namespace
}  // namespace bie
