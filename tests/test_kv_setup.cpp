// kv_setup: byte sizes, and the engine's budget and pools equal the planner's numbers for the same
// inputs (make_plan's KV budget, max sequences and max context; kv_pool_plan's blocks), the
// --kv-cache-memory fill, and one-line errors when something does not fit.
#include <gtest/gtest.h>

#include "bie/engine/kv_setup.h"
#include "bie/planner/plan_report.h"
#include "bie/planner/planner.h"
#include "support/paths.h"

namespace bie {
namespace {

TEST(KvSetup, ParseByteSize) {
  EXPECT_EQ(parse_byte_size("1000000").value(), 1000000u);
  EXPECT_EQ(parse_byte_size("512MiB").value(), 512ull << 20);
  EXPECT_EQ(parse_byte_size("512mib").value(), 512ull << 20);
  EXPECT_EQ(parse_byte_size("2GiB").value(), 2ull << 30);
  EXPECT_EQ(parse_byte_size("1.5G").value(), 3ull << 29);
  EXPECT_EQ(parse_byte_size("64k").value(), 64ull << 10);
  EXPECT_EQ(parse_byte_size("800MB").value(), 800000000u);
  EXPECT_EQ(parse_byte_size("7B").value(), 7u);
  for (const char* bad : {"", "abc", "-5", "1.2.3", "5XB", "GiB", "1 GiB", "2GiBs", "."}) {
    auto r = parse_byte_size(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().find("not a byte size"), std::string::npos) << r.error();
  }
}

planner::ModelGeometry smollm2() {
  auto g = planner::geometry_from_gguf_path(test::smollm2_path());
  EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error());
  return g.ok() ? *g : planner::ModelGeometry{};
}

// The `bie plan` request for the same inputs as o (its device bytes, utilisation, context,
// sequences and chunk; no workspace beyond the activations), for the engine's resolved layout.
planner::PlanRequest plan_request_for(const planner::ModelGeometry& g, const KvEngineOptions& o,
                                      const planner::KvLayout& layout) {
  planner::PlanRequest req;
  req.model = g;
  req.device.name = "test";
  req.device.memory_gib = static_cast<double>(*o.device_memory) / (1ull << 30);
  req.device.bandwidth_gbs = 10;
  req.utilization = o.gpu_memory_utilization;
  req.workspace_gib = 0.0;
  req.max_model_len = o.max_model_len;
  req.max_num_seqs = o.max_num_seqs;
  req.chunked_prefill_size = o.chunked_prefill_size;
  req.layout = layout;
  req.compare_formats = false;
  return req;
}

TEST(KvSetup, BudgetAndPoolsEqualThePlanner) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  const planner::ModelGeometry g = smollm2();
  ASSERT_TRUE(g.weight_bytes.has_value());
  for (const char* dtype : {"f16", "int8", "int4_asym", "int4_channel"}) {
    for (const int64_t seqs : {int64_t{1}, int64_t{3}}) {
      SCOPED_TRACE(testing::Message() << dtype << " seqs " << seqs);
      KvEngineOptions o;
      o.kv.dtype = dtype;
      o.max_model_len = 4096;
      o.max_num_seqs = seqs;
      o.chunked_prefill_size = 256;
      o.gpu_memory_utilization = 0.8;
      o.device_memory = 1ull << 30;
      auto r = plan_kv_setup(g, *g.weight_bytes, 8192, o);
      ASSERT_TRUE(r.ok()) << r.error();

      auto plan = planner::make_plan(plan_request_for(g, o, r->layout));
      ASSERT_TRUE(plan.ok()) << plan.error();
      const planner::KvOption& opt = plan->options[0];
      EXPECT_EQ(r->weights_bytes, plan->budget.weights_bytes);
      EXPECT_EQ(r->workspace_bytes, plan->budget.activation_bytes);
      EXPECT_EQ(static_cast<int64_t>(r->kv_budget_bytes), plan->budget.kv_budget_bytes);
      EXPECT_EQ(r->max_concurrency, opt.max_seqs);
      EXPECT_EQ(r->kv_pool_bytes(), opt.kv_bytes);  // capped at max_model_len x max_num_seqs
      EXPECT_EQ(r->bytes_per_token, opt.bytes_per_token);
      const planner::KvPoolPlan pools = planner::kv_pool_plan(g, r->layout, 4096, seqs);
      EXPECT_EQ(r->fp16_blocks, pools.groups[0].fp16_blocks);
      EXPECT_EQ(r->body_blocks, pools.groups[0].body_blocks);
      EXPECT_EQ(r->tokens_fit, planner::kv_max_tokens(g, r->layout, r->kv_budget_bytes, 1,
                                                      planner::kMaxPlanContext));
      if (seqs == 1) {
        EXPECT_EQ(r->tokens_fit, opt.max_context);
      }
      const std::string text = format_kv_report(*r);
      EXPECT_NE(text.find(r->layout_label), std::string::npos) << text;
      EXPECT_NE(text.find(std::to_string(r->max_concurrency) + " sequences of 4096"),
                std::string::npos)
          << text;
    }
  }
}

// Gemma 3 270M (15 local layers, window 512): the pools are the SWA-hybrid plan, group by group,
// and the start-up report shows the bytes `bie plan` reports for the same context.
TEST(KvSetup, GemmaHybridPoolsEqualThePlanner) {
  BIE_REQUIRE_FILE(test::gemma3_path());
  auto gg = planner::geometry_from_gguf_path(test::gemma3_path());
  ASSERT_TRUE(gg.ok()) << gg.error() << " (run `make models`)";
  const planner::ModelGeometry& g = *gg;
  ASSERT_EQ(g.n_swa_layers(), 15);
  ASSERT_TRUE(g.weight_bytes.has_value());
  // 16-token blocks (the block counts below): f16 and the per-token 4-bit recipe (mixed pools).
  for (const char* dtype : {"f16", "int4_asym_g64"}) {
    SCOPED_TRACE(dtype);
    KvEngineOptions o;
    o.kv.dtype = dtype;
    o.max_model_len = 32768;
    o.max_num_seqs = 1;
    o.chunked_prefill_size = 512;
    o.gpu_memory_utilization = 0.9;
    o.device_memory = 2ull << 30;
    auto r = plan_kv_setup(g, *g.weight_bytes, 32768, o);
    ASSERT_TRUE(r.ok()) << r.error();

    auto plan = planner::make_plan(plan_request_for(g, o, r->layout));
    ASSERT_TRUE(plan.ok()) << plan.error();
    const planner::KvOption& opt = plan->options[0];
    EXPECT_EQ(r->kv_pool_bytes(), opt.kv_bytes);
    EXPECT_EQ(r->max_concurrency, opt.max_seqs);
    EXPECT_EQ(r->tokens_fit, opt.max_context);
    const planner::KvPoolPlan pools = planner::kv_pool_plan(g, r->layout, 32768, 1, 512);
    const planner::KvPoolPlan steady = planner::kv_pool_plan(g, r->layout, 32768, 1);
    ASSERT_EQ(r->groups.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(r->groups[i].group.shape.window, pools.groups[i].group.shape.window);
      EXPECT_EQ(r->groups[i].fp16_blocks, pools.groups[i].fp16_blocks);
      EXPECT_EQ(r->groups[i].body_blocks, pools.groups[i].body_blocks);
    }
    // The local group keeps its window: 33 blocks (a window straddling 32 + 1 blocks); a 512-token
    // pass adds 32 + 1 body blocks and, mixed, one FP16 window (8 + 1 blocks). Global: no headroom.
    EXPECT_EQ(pools.groups[0].group.shape.window, 512);
    EXPECT_EQ(steady.groups[0].fp16_blocks + steady.groups[0].body_blocks, 33);
    const bool mixed = r->layout.mixed();
    EXPECT_EQ(pools.groups[0].body_blocks, steady.groups[0].body_blocks + 33);
    EXPECT_EQ(pools.groups[0].fp16_blocks, steady.groups[0].fp16_blocks + (mixed ? 9 : 0));
    EXPECT_EQ(pools.groups[1].body_blocks, steady.groups[1].body_blocks);
    EXPECT_EQ(pools.groups[1].fp16_blocks, steady.groups[1].fp16_blocks);
    if (std::string(dtype) == "f16") {
      // 3 global layers x 32768 tokens + 15 local layers x (528 + 528 pass headroom) tokens,
      // 1 KiB per layer-token.
      EXPECT_EQ(steady.total_bytes(), (3ull * 32768 + 15ull * 528) * 1024);
      EXPECT_EQ(r->kv_pool_bytes(), (3ull * 32768 + 15ull * 1056) * 1024);
    }
    const std::string text = format_kv_report(*r);
    EXPECT_NE(
        text.find("SWA-hybrid pools " + planner::format_bytes(static_cast<double>(opt.kv_bytes))),
        std::string::npos)
        << text;
    EXPECT_EQ(text.find("keep every token"), std::string::npos) << text;
  }
}

TEST(KvSetup, ExplicitKvMemoryIsFilledWithBlocks) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  const planner::ModelGeometry g = smollm2();
  KvEngineOptions o;
  o.kv.dtype = "int8";
  o.max_model_len = 1024;
  o.kv_cache_memory = 64ull << 20;
  auto r = plan_kv_setup(g, *g.weight_bytes, 8192, o);
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_TRUE(r->explicit_kv_memory);
  EXPECT_LE(r->kv_pool_bytes(), 64ull << 20);
  EXPECT_GT(r->kv_pool_bytes() + r->body_block_bytes, 64ull << 20);
  EXPECT_EQ(r->max_concurrency, static_cast<int64_t>((64ull << 20) / r->seq_bytes));
  EXPECT_EQ(r->fp16_blocks,
            planner::kv_pool_plan(g, r->layout, 1024, r->max_concurrency).groups[0].fp16_blocks);
}

TEST(KvSetup, DefaultMaxModelLenIsTrainedContextCappedAt8192) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  const planner::ModelGeometry g = smollm2();
  KvEngineOptions o;
  o.kv_cache_memory = 1ull << 30;
  EXPECT_EQ(plan_kv_setup(g, *g.weight_bytes, 8192, o)->max_model_len, 8192);
  EXPECT_EQ(plan_kv_setup(g, *g.weight_bytes, 2048, o)->max_model_len, 2048);
  EXPECT_EQ(plan_kv_setup(g, *g.weight_bytes, 131072, o)->max_model_len, kDefaultMaxModelLen);
}

TEST(KvSetup, ErrorsSayWhatDoesNotFit) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  const planner::ModelGeometry g = smollm2();
  KvEngineOptions o;
  o.max_model_len = 8192;
  o.kv_cache_memory = 1ull << 20;  // 1 MiB: far below one 8192-token f16 sequence
  auto r = plan_kv_setup(g, *g.weight_bytes, 8192, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("--kv-cache-memory"), std::string::npos) << r.error();
  EXPECT_EQ(r.error().find('\n'), std::string::npos);

  o.kv_cache_memory.reset();
  o.device_memory = 64ull << 20;  // below the weights
  r = plan_kv_setup(g, *g.weight_bytes, 8192, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("do not fit the memory budget"), std::string::npos) << r.error();

  o.device_memory = 1ull << 30;
  o.kv.dtype = "int5";
  r = plan_kv_setup(g, *g.weight_bytes, 8192, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("--kv-cache-dtype"), std::string::npos) << r.error();
}

}  // namespace
}  // namespace bie
