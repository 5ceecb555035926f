// The Engine with the model and its paged f16 KV pools on the Vulkan backend (lavapipe in CI):
// four concurrent greedy requests give the CPU backend's tokens, except after a step where the
// CPU's own top-2 margin is a near-tie (the two backends round differently; llama.cpp's own
// flash-on/off spread on SmolLM2 moves the margin by up to 0.67, tests/golden/README.md), and
// every block comes back; a prefix-cache hit on the device gives the same tokens. The start-up
// refusal of a regime the device does not run is clear. What the device allocates equals the
// start-up report, and a context the device budget cannot hold is refused with the number.
// Speculative verify on the device keeps greedy output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bie/engine/engine.h"
#include "support/device_vs_cpu.h"
#include "support/engine_collect.h"
#include "support/paths.h"

namespace bie {
namespace {

using test::collect;
using test::Collected;

// SmolLM2's llama.cpp self-agreement floor (tests/test_model_teacher_forced.cpp, kSmolLM2).
constexpr double kMarginFloor = 0.67;

EngineConfig config(const std::string& device) {
  EngineConfig cfg;
  cfg.model = "default";
  cfg.device = device;
  cfg.kv.kv.dtype = "f16";
  cfg.kv.max_model_len = 256;
  cfg.kv.max_num_seqs = 4;
  cfg.kv.chunked_prefill_size = 32;  // prompts of more than one chunk: chunked prefill
  cfg.kv.kv_cache_memory = 64ull << 20;
  cfg.threads = 2;
  cfg.check_integrity = true;
  return cfg;
}

const char* kPrompts[] = {
    "The capital of France is",
    "Once upon a time, in a land far away, there lived a king who had three daughters, and",
    "def fibonacci(n):",
    "The three primary colors are",
};
constexpr int kTokens = 8;

// What the start-up report says the device holds: weights + workspace + KV pools. The backend
// counts its device-local buffers at each allocation (EngineMetrics::device_bytes): memory truth
// on the device is the two being equal.
uint64_t planned_device_bytes(const KvSetupReport& r) {
  std::printf("on %s: planned weights %llu + workspace %llu + KV pools %llu\n", r.device.c_str(),
              static_cast<unsigned long long>(r.weights_bytes),
              static_cast<unsigned long long>(r.workspace_bytes),
              static_cast<unsigned long long>(r.kv_pool_bytes()));
  return r.weights_bytes + r.workspace_bytes + r.all_kv_pool_bytes();
}

TEST(VulkanEngine, FourConcurrentRequestsGiveTheCpuTokensWhereMarginsAllow) {
  BIE_REQUIRE_FILE(test::smollm2_path());
  auto gpu = Engine::create(config("vulkan"));
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  const uint64_t planned = planned_device_bytes((*gpu)->kv_report());
  EXPECT_EQ((*gpu)->metrics().device_bytes, planned);  // held from start-up
  const std::vector<std::vector<int32_t>> got = test::run_greedy(**gpu, kPrompts, kTokens);
  const EngineMetrics gm = (*gpu)->metrics();
  EXPECT_GT(gm.batched_seqs, gm.steps);  // some steps ran several sequences on the device
  EXPECT_EQ(gm.device_bytes, planned);   // serving allocates nothing more
  EXPECT_EQ(gm.device_peak_bytes, planned);
  {
    // The long prompt again: its full blocks come from the device's prefix cache, same tokens.
    EngineRequest r;
    r.prompt = (*gpu)->tokenizer().encode(kPrompts[1]);
    r.sampling.temperature = 0;
    r.max_tokens = kTokens;
    Collected c;
    ASSERT_FALSE((*gpu)->submit(99, r, collect(c)).has_value());
    c.wait();
    EXPECT_GE(c.finish->metrics.cached_tokens, 16);
    EXPECT_EQ(c.tokens, got[1]);
  }
  (*gpu)->wait_idle();
  EXPECT_EQ(test::used_blocks(**gpu), 0);
  gpu->reset();

  auto cpu = Engine::create(config("cpu"));
  ASSERT_TRUE(cpu.ok()) << cpu.error();
  const std::vector<std::vector<int32_t>> want = test::run_greedy(**cpu, kPrompts, kTokens);
  // Where they differ, the CPU's margin at the first differing step must be a near-tie.
  const int identical = test::identical_where_margins_allow(want, got, kPrompts, kTokens,
                                                            (*cpu)->tokenizer(), kMarginFloor);
  std::printf("vulkan vs cpu engine, greedy: %d of %zu requests identical for %d tokens\n",
              identical, want.size(), kTokens);
  EXPECT_GE(identical, 2);
}

// Gemma 3's two layer groups (sliding-window and global pools) on the device: allocated as the
// report plans them, from the device-local budget.
TEST(VulkanEngine, DeviceAllocationsEqualTheStartUpReportWithSlidingWindowGroups) {
  BIE_REQUIRE_FILE(test::gemma3_path());
  EngineConfig cfg = config("vulkan:0");
  cfg.model = "gemma3";
  cfg.kv.kv_cache_memory.reset();
  cfg.kv.device_memory = 1ull << 30;
  auto e = Engine::create(cfg);
  ASSERT_TRUE(e.ok()) << e.error();
  const KvSetupReport& r = (*e)->kv_report();
  EXPECT_EQ(r.device_bytes, 1ull << 30);
  EXPECT_EQ(r.groups.size(), 2u);
  EXPECT_EQ((*e)->metrics().device_bytes, planned_device_bytes(r));
}

// A quantised mixed regime on the device: its FP16 and body pools allocated as the report plans
// them, and no kill-switch f16 pools beside them (the automatic kill switch takes no share of the
// device's memory; several regimes: tests/test_vulkan_kv_regimes.cpp).
TEST(VulkanEngine, AQuantisedKvRegimeOnTheDeviceIsAllocatedAsPlanned) {
  BIE_REQUIRE_FILE(test::smollm2_path());
  EngineConfig cfg = config("vulkan:0");
  cfg.kv.kv.dtype_k = "int8";  // the per-token row formats (plain "int8" is per-channel keys)
  cfg.kv.kv.dtype_v = "int8";
  auto e = Engine::create(cfg);
  ASSERT_TRUE(e.ok()) << e.error();
  const KvSetupReport& r = (*e)->kv_report();
  EXPECT_TRUE(r.layout.mixed());
  EXPECT_EQ(r.kv_regime_shares, 1);
  EXPECT_EQ((*e)->kv_policy().regimes.size(), 1u);
  EXPECT_EQ((*e)->metrics().device_bytes, planned_device_bytes(r));
}

// Weights longer than one buffer the driver allocates (maxMemoryAllocationSize: 2 GiB on
// lavapipe, 4 GiB on several GPU drivers, less than an 8B model's 4.5 GB) are uploaded in pieces
// of whole tensors: with SmolLM2's 92 MiB cut into pieces of at most 32 MiB (its largest tensor,
// the token embeddings, is 28 MiB) the engine gives the
// tokens it gives from one buffer (same kernels, same bytes), the pieces add up to the report's
// weights exactly, and a cap below one tensor's size is refused with the sizes.
TEST(VulkanEngine, WeightsLargerThanOneBufferAreUploadedInPiecesOfWholeTensors) {
  BIE_REQUIRE_FILE(test::smollm2_path());
  const std::span<const char* const> prompts(kPrompts, 2);
  std::vector<std::vector<int32_t>> whole;
  {
    auto e = Engine::create(config("vulkan:0"));
    ASSERT_TRUE(e.ok()) << e.error();
    whole = test::run_greedy(**e, prompts, kTokens);
  }
  ::setenv("BIE_VULKAN_MAX_BUFFER_BYTES", std::to_string(32 << 20).c_str(), 1);
  auto e = Engine::create(config("vulkan:0"));
  ::unsetenv("BIE_VULKAN_MAX_BUFFER_BYTES");
  ASSERT_TRUE(e.ok()) << e.error();
  EXPECT_GT((*e)->kv_report().weights_bytes, 2u * (32u << 20));  // at least three pieces
  EXPECT_EQ((*e)->metrics().device_bytes, planned_device_bytes((*e)->kv_report()));
  EXPECT_EQ(test::run_greedy(**e, prompts, kTokens), whole);
  e->reset();

  // 1 MiB buffers also cap the KV pools at four of them: a context that fits there, so that the
  // weights are what is refused.
  EngineConfig small = config("vulkan:0");
  small.kv.max_model_len = 64;
  small.kv.max_num_seqs = 1;
  small.kv.kv_cache_memory = 2ull << 20;
  ::setenv("BIE_VULKAN_MAX_BUFFER_BYTES", std::to_string(1 << 20).c_str(), 1);
  auto tiny = Engine::create(small);
  ::unsetenv("BIE_VULKAN_MAX_BUFFER_BYTES");
  ASSERT_FALSE(tiny.ok());
  EXPECT_NE(tiny.error().find("is larger than one buffer the vulkan:0 backend allocates (1 MiB)"),
            std::string::npos)
      << tiny.error();
}

// Speculative verify on the device: n-gram drafts verified in one pass give the tokens plain
// decoding gives on the same device (decode rows are batch-invariant there), drafts are accepted,
// and every block comes back.
TEST(VulkanEngine, SpeculativeVerifyOnTheDeviceKeepsGreedyOutput) {
  BIE_REQUIRE_FILE(test::smollm2_path());
  EngineConfig pc = config("vulkan:0");
  EngineConfig sc = pc;
  sc.speculative_draft_tokens = 4;
  sc.speculative_always = true;  // verify every step (the cost model would skip on lavapipe)
  auto plain = Engine::create(pc);
  ASSERT_TRUE(plain.ok()) << plain.error();
  // Its continuation repeats the prompt, so the n-gram drafter matches from the first step.
  const std::vector<int32_t> prompt = (*plain)->tokenizer().encode(
      "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy");
  const auto run = [&](Engine& e, FinishEvent* fin) {
    EngineRequest r;
    r.prompt = prompt;
    r.sampling.temperature = 0;
    r.max_tokens = 8;
    Collected c;
    EXPECT_FALSE(e.submit(1, r, collect(c)).has_value());
    c.wait();
    EXPECT_TRUE(c.finish.has_value() && c.finish->error.empty());
    if (fin != nullptr && c.finish) *fin = *c.finish;
    return c.tokens;
  };
  const std::vector<int32_t> want = run(**plain, nullptr);
  plain->reset();
  auto spec = Engine::create(sc);
  ASSERT_TRUE(spec.ok()) << spec.error();
  FinishEvent fin;
  const std::vector<int32_t> got = run(**spec, &fin);
  EXPECT_EQ(got, want);
  EXPECT_GT(fin.metrics.draft_tokens, 0);
  EXPECT_GT((*spec)->metrics().accepted_tokens, 0);
  (*spec)->wait_idle();
  EXPECT_EQ(test::used_blocks(**spec), 0);
}

// A --max-model-len the device budget cannot hold is refused at start-up with the largest that
// fits, and that one starts (nothing spills to host memory: there is no host KV on a device).
TEST(VulkanEngine, MaxModelLenBeyondTheDeviceBudgetIsRefusedWithTheNumber) {
  BIE_REQUIRE_FILE(test::smollm2_path());
  EngineConfig cfg = config("vulkan:0");
  cfg.kv.kv_cache_memory.reset();
  cfg.kv.device_memory = 200ull << 20;  // 180 MiB usable: ~75 MiB of KV after the weights
  cfg.kv.max_model_len = 8192;
  CreateError kind{};
  auto e = Engine::create(cfg, &kind);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(kind, CreateError::kOutOfBudget);
  const std::string key = "the largest context that fits is ";
  const size_t at = e.error().find(key);
  ASSERT_NE(at, std::string::npos) << e.error();
  const int64_t fit = std::stoll(e.error().substr(at + key.size()));
  EXPECT_GT(fit, 1024) << e.error();
  EXPECT_LT(fit, 8192) << e.error();
  cfg.kv.max_model_len = fit;
  auto ok = Engine::create(cfg);
  ASSERT_TRUE(ok.ok()) << ok.error();
  const KvSetupReport& r = (*ok)->kv_report();
  EXPECT_EQ(r.device.rfind("vulkan:0 (", 0), 0u) << r.device;
  EXPECT_EQ((*ok)->metrics().device_bytes, planned_device_bytes(r));
  EXPECT_LE((*ok)->metrics().device_bytes, r.usable_bytes);
  ok->reset();
  cfg.kv.max_model_len = fit + 16;  // one more block
  auto over = Engine::create(cfg);
  EXPECT_FALSE(over.ok());
}

}  // namespace
}  // namespace bie
