// Budget equation, device profiles, weights table and speed bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "bie/planner/device_profile.h"
#include "bie/planner/plan_report.h"
#include "bie/planner/planner.h"
#include "bie/planner/presets.h"
#include "bie/planner/weights.h"

namespace bie::planner {
namespace {

constexpr double kGiBd = 1024.0 * 1024.0 * 1024.0;

PlanRequest seed_request(std::string_view kv) {
  PlanRequest r;
  r.model = preset_geometry("llama-3-8b").value();
  r.weights = find_weight_quant("AWQ").value();
  r.device = find_device("rtx-4060ti-8gb").value();
  r.max_model_len = 65536;
  r.layout.k = r.layout.v = parse_kv_format(kv).value();
  return r;
}

TEST(Weights, BriefTable) {
  EXPECT_NEAR(weight_bytes_for(32.8e9, find_weight_quant("Q4_K_M")->bits_per_weight) / kGiBd, 18.52,
              0.005);
  EXPECT_NEAR(weight_bytes_for(70.6e9, find_weight_quant("Q4_K_M")->bits_per_weight) / kGiBd, 39.86,
              0.005);
  EXPECT_NEAR(weight_bytes_for(70.6e9, find_weight_quant("F16")->bits_per_weight) / kGiBd, 131.50,
              0.005);
  EXPECT_EQ(find_weight_quant("gptq")->name, "AWQ");
  EXPECT_EQ(find_weight_quant("bf16")->bits_per_weight, 16.0);
  EXPECT_EQ(find_weight_quant("iq4_xs")->bits_per_weight, 4.25);
  EXPECT_FALSE(find_weight_quant("Q7_K").ok());
  EXPECT_FALSE(find_weight_quant("").ok());
}

TEST(Devices, BriefUsableFigures) {
  struct Row {
    std::string_view name;
    double usable, tuned, bandwidth;
  };
  for (const Row& r :
       {Row{"rtx-3090", 22.1, 23.0, 936}, Row{"rtx-4090", 22.1, 23.0, 1008},
        Row{"rtx-5090", 29.4, 30.7, 1792}, Row{"m4-max-64gb", 48.0, 56.3, 546},
        Row{"m4-max-128gb", 96.0, 112.6, 546}, Row{"m2-ultra-192gb", 144.0, 169.0, 800},
        Row{"a100-80gb", 73.6, 76.8, 2039}, Row{"h100-sxm-80gb", 73.6, 76.8, 3350}}) {
    auto d = find_device(r.name);
    ASSERT_TRUE(d.ok()) << r.name;
    EXPECT_NEAR(d->memory_gib * d->usable_fraction, r.usable, 0.05) << r.name;
    EXPECT_NEAR(d->memory_gib * d->tuned_fraction, r.tuned, 0.05) << r.name;
    EXPECT_EQ(d->bandwidth_gbs, r.bandwidth) << r.name;
  }
  for (const DeviceProfile& d : device_profiles()) {
    EXPECT_GT(d.memory_gib, 0) << d.name;
    EXPECT_GT(d.bandwidth_gbs, 0) << d.name;
    EXPECT_FALSE(d.source.empty()) << d.name;
  }
  EXPECT_FALSE(find_device("rtx-9090").ok());
  EXPECT_TRUE(find_device("RTX-4060TI-8GB").ok());
}

TEST(Devices, CpuProfileAndMeasuredBandwidth) {
  auto cpu = find_device("cpu", /*measure_cpu=*/false);
  ASSERT_TRUE(cpu.ok()) << cpu.error();
  EXPECT_EQ(cpu->kind, DeviceKind::kCpu);
  EXPECT_GT(cpu->memory_gib, 0.1);
  const double gbs = measure_memory_bandwidth_gbs(0.05);
  EXPECT_GT(gbs, 0.1);  // even a loaded 2-core VM copies more than 100 MB/s
  EXPECT_LT(gbs, 10000.0);
}

TEST(Plan, SeedScenarioInt4FitsF16DoesNot) {
  auto i4 = make_plan(seed_request("int4_asym"));
  ASSERT_TRUE(i4.ok()) << i4.error();
  const Budget& b = i4->budget;
  EXPECT_EQ(b.device_bytes, 8ull << 30);
  EXPECT_NEAR(b.usable_bytes / kGiBd, 8 * 0.92, 1e-6);
  EXPECT_NEAR(b.weights_bytes / kGiBd, 4.21, 0.005);  // 8.03e9 x 4.5 / 8
  EXPECT_NEAR(b.workspace_bytes / kGiBd, 0.55, 1e-6);
  EXPECT_LT(b.activation_bytes, 250'000'000u);  // seed: chunked prefill keeps activations < 250 MB
  EXPECT_EQ(b.kv_budget_bytes, static_cast<int64_t>(b.usable_bytes - b.fixed_bytes()));
  const KvOption& r = i4->options.front();
  EXPECT_EQ(r.label, "int4_asym_g64");
  EXPECT_TRUE(r.fits);
  EXPECT_GT(r.headroom_bytes, 0);
  EXPECT_EQ(r.kv_bytes, kv_pool_plan(i4->model, r.layout, 65536, 1).total_bytes());
  EXPECT_GE(r.max_context, 65536);
  EXPECT_EQ(r.max_seqs, 1);
  EXPECT_NEAR(r.kv_bytes / kGiBd, 2.25, 0.02);  // 2.25 GiB + 14 MiB of FP16 sink/window

  auto f16 = make_plan(seed_request("f16"));
  ASSERT_TRUE(f16.ok());
  const KvOption& o = f16->options.front();
  EXPECT_FALSE(o.fits);
  EXPECT_EQ(o.kv_bytes, 8ull << 30);
  // Stops fitting where 128 KiB/token exhausts the KV budget, in whole 16-token blocks.
  EXPECT_EQ(o.max_context, static_cast<int64_t>(f16->budget.kv_budget_bytes / (16 * 131072)) * 16);
  EXPECT_GT(o.max_context, 15000);
  EXPECT_LT(o.max_context, 25000);
  EXPECT_EQ(o.max_seqs, 0);
  EXPECT_LT(o.spill_tok_s, o.speed.back().tok_s / 5);  // the PCIe cliff
  // Every compared format appears once; q4_0 KV equals int4_asym_g64 without the FP16 extras.
  ASSERT_GE(f16->options.size(), 9u);
  int q4 = 0;
  for (const KvOption& x : f16->options) {
    if (x.label != "q4_0") continue;
    ++q4;
    EXPECT_EQ(x.kv_bytes, 2304ull << 20);
  }
  EXPECT_EQ(q4, 1);
}

TEST(Plan, ParallelSequencesAndSpeculativeState) {
  PlanRequest r = seed_request("int4_asym");
  r.max_model_len = 8192;
  r.max_num_seqs = 4;
  auto p = make_plan(r);
  ASSERT_TRUE(p.ok());
  const KvOption& o = p->options.front();
  EXPECT_EQ(o.kv_bytes, 4 * kv_pool_plan(p->model, o.layout, 8192, 1).total_bytes());
  EXPECT_GE(o.max_seqs, 4);
  EXPECT_GT(o.speed.back().tok_s_all_seqs, o.speed.back().tok_s);  // batching amortises weights

  r.speculative_draft_tokens = 5;
  r.draft = preset_geometry("llama-3.2-1b").value();
  r.draft_weights = find_weight_quant("Q4_K_M").value();
  auto s = make_plan(r);
  ASSERT_TRUE(s.ok());
  const uint64_t draft_w = weight_bytes_for(r.draft->n_params, 4.85);
  const uint64_t draft_kv = 4ull * 8192 * 2 * 16 * 8 * 64 * 2;
  EXPECT_GT(s->budget.speculative_bytes, draft_w + draft_kv);
  EXPECT_LT(s->budget.speculative_bytes, draft_w + draft_kv + 200'000'000);
  EXPECT_EQ(s->budget.kv_budget_bytes,
            p->budget.kv_budget_bytes - static_cast<int64_t>(s->budget.speculative_bytes));
}

TEST(Plan, MoeDecodeReadsActiveWeightsOnly) {
  PlanRequest r;
  r.model = preset_geometry("qwen3-30b-a3b").value();
  r.weights = find_weight_quant("Q4_K_M").value();
  r.device = find_device("rtx-4090").value();
  r.max_model_len = 4096;
  auto p = make_plan(r);
  ASSERT_TRUE(p.ok()) << p.error();
  EXPECT_LT(p->weights.active_bytes * 8, p->weights.bytes);  // ~3 B of 30.5 B read per token
  const SpeedPoint& sp = p->options.front().speed.front();
  EXPECT_DOUBLE_EQ(sp.tok_s, decode_tok_s_bound(1008, p->weights.active_bytes + sp.kv_read_bytes));
}

TEST(Plan, SpeedFormulas) {
  EXPECT_DOUBLE_EQ(decode_tok_s_bound(1000, 1'000'000'000), 1000.0);
  EXPECT_DOUBLE_EQ(decode_tok_s_bound(1000, 0), 0.0);
  // 1 GB per token at 100 GB/s, 100 MB of it over 10 GB/s: 9 ms + 10 ms.
  EXPECT_NEAR(decode_tok_s_spilled(100, 10, 1'000'000'000, 100'000'000), 1.0 / 0.019, 1e-9);
  EXPECT_NEAR(decode_tok_s_spilled(100, 10, 1'000'000'000, 0), 100.0, 1e-9);
}

TEST(Plan, RejectsBadRequests) {
  const auto err = [](PlanRequest r) {
    auto p = make_plan(r);
    return p.ok() ? std::string() : p.error();
  };
  PlanRequest r = seed_request("f16");
  r.max_model_len = -1;
  EXPECT_NE(err(r).find("max model length"), std::string::npos);
  r = seed_request("f16");
  r.max_model_len = kMaxPlanContext + 1;
  EXPECT_FALSE(err(r).empty());
  r = seed_request("f16");
  r.max_num_seqs = 0;
  EXPECT_FALSE(err(r).empty());
  r = seed_request("f16");
  r.utilization = 1.5;
  EXPECT_NE(err(r).find("utilisation"), std::string::npos);
  r = seed_request("f16");
  r.device.memory_gib = -8;
  EXPECT_FALSE(err(r).empty());
  r = seed_request("f16");
  r.device.memory_gib = std::nan("");
  EXPECT_FALSE(err(r).empty());
  r = seed_request("f16");
  r.margin_gib = -1;
  EXPECT_FALSE(err(r).empty());
  r = seed_request("f16");
  r.weights.reset();  // a preset has no tensor bytes
  EXPECT_NE(err(r).find("--weights"), std::string::npos);
  r = seed_request("f16");
  r.layout.k = parse_kv_format("q8_0").value();
  r.model.layers[3].head_dim_k = 80;
  EXPECT_FALSE(err(r).empty());
}

TEST(Plan, WeightsAloneTooBig) {
  PlanRequest r;
  r.model = preset_geometry("llama-3-70b").value();
  r.weights = find_weight_quant("F16").value();
  r.device = find_device("rtx-4090").value();
  r.max_model_len = 8192;
  auto p = make_plan(r);
  ASSERT_TRUE(p.ok());
  EXPECT_LT(p->budget.kv_budget_bytes, 0);
  for (const KvOption& o : p->options) {
    EXPECT_FALSE(o.fits);
    EXPECT_EQ(o.max_context, 0);
    EXPECT_EQ(o.max_seqs, 0);
  }
  EXPECT_NE(render_plan_text(*p).find("nothing is left for the KV cache"), std::string::npos);
}

TEST(Report, JsonAndSvgCarryThePlan) {
  auto p = make_plan(seed_request("int4_asym"));
  ASSERT_TRUE(p.ok());
  const auto j = nlohmann::json::parse(render_plan_json(*p));
  EXPECT_TRUE(j["fits"].get<bool>());
  EXPECT_EQ(j["options"][0]["kv_bytes"].get<uint64_t>(), p->options[0].kv_bytes);
  EXPECT_EQ(j["budget"]["usable_bytes"].get<uint64_t>(), p->budget.usable_bytes);
  EXPECT_EQ(j["model"]["attention"], "GQA");
  const std::string svg = render_plan_svg(*p);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("id=\"usable\""), std::string::npos);
  size_t curves = 0;
  for (size_t at = svg.find("class=\"kv\""); at != std::string::npos;
       at = svg.find("class=\"kv\"", at + 1))
    ++curves;
  EXPECT_EQ(curves, p->options.size());
  // The requested format's crossing of the usable line is marked at its largest context.
  EXPECT_NE(svg.find("data-format=\"int4_asym_g64\" data-tokens=\"" +
                     std::to_string(p->options[0].max_context) + "\""),
            std::string::npos);
  EXPECT_EQ(format_bytes(36864), "36.0 KiB");
  EXPECT_EQ(format_bytes(8.0 * kGiBd), "8.00 GiB");
}

}  // namespace
}  // namespace bie::planner
