// The Engine on the Vulkan backend (lavapipe in CI) with a mixed per-token int8 KV regime
// (--kv-cache-dtype-k int8 --kv-cache-dtype-v int8: FP16 sink and window blocks, int8 body
// blocks, window exits quantised on the device) gives the CPU engine's greedy tokens in the same
// regime, except after a step where the CPU's top-2 margin is a near-tie (as
// tests/test_vulkan_engine.cpp for f16). The prompts are longer than sink + window, so body
// blocks are written by kv_write, migrated by quantise_blocks and read by attention on the device.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "bie/engine/engine.h"
#include "support/device_vs_cpu.h"
#include "support/engine_collect.h"
#include "support/paths.h"

namespace bie {
namespace {

// SmolLM2's llama.cpp self-agreement floor (tests/test_model_teacher_forced.cpp, kSmolLM2).
constexpr double kMarginFloor = 0.67;
constexpr int kTokens = 8;

EngineConfig int8_rows_config(const std::string& device) {
  EngineConfig cfg;
  cfg.model = "default";
  cfg.device = device;
  cfg.kv.kv.dtype = "f16";
  cfg.kv.kv.dtype_k = "int8";  // the per-token row formats (plain "int8" is per-channel keys)
  cfg.kv.kv.dtype_v = "int8";
  cfg.kv.kv.block_size = 16;
  cfg.kv.kv.sink_tokens = 8;
  cfg.kv.kv.window_tokens = 16;
  cfg.kv.max_model_len = 256;
  cfg.kv.max_num_seqs = 1;
  cfg.kv.chunked_prefill_size = 32;
  cfg.kv.kv_cache_memory = 32ull << 20;
  cfg.threads = 2;
  cfg.check_integrity = true;
  return cfg;
}

const char* kPrompts[] = {
    "Once upon a time, in a land far away, there lived a king who had three daughters. The eldest "
    "was proud, the second was clever, and the youngest was kind to every creature she met. One "
    "winter morning the king called them to his hall and said",
};

TEST(VulkanKvEngine, MixedInt8RowRegimeGivesTheCpuTokensWhereMarginsAllow) {
  BIE_REQUIRE_FILE(test::smollm2_path());
  const auto t0 = std::chrono::steady_clock::now();
  auto gpu = Engine::create(int8_rows_config("vulkan:0"));
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  const KvSetupReport& r = (*gpu)->kv_report();
  EXPECT_EQ(r.layout_label, "int8") << r.layout_label;  // K and V per-token int8
  EXPECT_GT(r.body_blocks, 0);
  EXPECT_GT(r.fp16_blocks, 0);
  for (const char* p : kPrompts) {
    EXPECT_GT((*gpu)->tokenizer().encode(p).size(), 8u + 16u + 16u) << "prompt shorter than "
                                                                       "sink + window: no body";
  }
  const std::vector<std::vector<int32_t>> got = test::run_greedy(**gpu, kPrompts, kTokens);
  (*gpu)->wait_idle();
  EXPECT_EQ(test::used_blocks(**gpu), 0);
  gpu->reset();

  const auto t1 = std::chrono::steady_clock::now();
  auto cpu = Engine::create(int8_rows_config("cpu"));
  ASSERT_TRUE(cpu.ok()) << cpu.error();
  const std::vector<std::vector<int32_t>> want = test::run_greedy(**cpu, kPrompts, kTokens);
  const auto t2 = std::chrono::steady_clock::now();
  const auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  std::printf("device engine %.1f s, cpu engine %.1f s\n", secs(t0, t1), secs(t1, t2));
  const int identical = test::identical_where_margins_allow(want, got, kPrompts, kTokens,
                                                            (*cpu)->tokenizer(), kMarginFloor);
  std::printf(
      "vulkan vs cpu engine, k=int8 v=int8 mixed: %d of %zu request identical for %d "
      "tokens\n",
      identical, want.size(), kTokens);
}

}  // namespace
}  // namespace bie
