// The Engine on the Vulkan backend (lavapipe in CI) in mixed KV regimes (FP16 sink and window
// blocks, quantised body blocks, window exits quantised on the device) gives the CPU engine's
// greedy tokens in the same regime, except after a step where the CPU's top-2 margin is a
// near-tie (as tests/test_vulkan_engine.cpp for f16). Regimes: per-token int8 rows
// (--kv-cache-dtype-k int8 --kv-cache-dtype-v int8), the int4_asym and int8 recipes, whose keys
// are per-channel tiles (int4_channel_tB / int8_channel_tB) fitted on the device, and
// int4_asym_g64 and the int4_asym recipe with --kv-rotate, whose keys are stored Hadamard-rotated.
// The prompts
// are longer than sink + window, so body blocks are written by kv_write, migrated by
// quantise_blocks and read by attention on the device.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
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

// SmolLM2's llama.cpp self-agreement floor (tests/test_model_teacher_forced.cpp, kSmolLM2).
constexpr double kMarginFloor = 0.67;
constexpr int kTokens = 8;

struct Regime {
  const char* name;
  const char* dtype;  // --kv-cache-dtype
  const char* dtype_k;
  const char* dtype_v;
  const char* label;  // the layout label the engine reports
  // > 0: the device holds each KV pool in buffers of at most this many bytes
  // (BIE_VULKAN_KV_PART_BYTES), so that blocks of one sequence sit in different buffers, as an
  // 8 GB card's 64k pool does; the context then shrinks to fit four such buffers.
  size_t part_bytes = 0;
  bool rotate = false;  // --kv-rotate
};

const Regime kRegimes[] = {
    // the per-token row formats (plain "int8" is per-channel keys)
    {"int8_rows", "f16", "int8", "int8", "int8"},
    {"int4_asym_recipe", "int4_asym", "", "", "k=int4_channel_t16 v=int4_asym_g64"},
    {"int8_recipe", "int8", "", "", "k=int8_channel_t16 v=int8"},
    // the per-token 4-bit recipe: keys Hadamard-rotated on the device, queries rotated to match
    {"int4_asym_g64_rotated", "int4_asym_g64", "", "", "int4_asym_g64 +rotate"},
    // the int4_asym recipe with its per-channel keys Hadamard-rotated (--kv-rotate): the key
    // rows of a tile written straight into the body are rotated before the channels are fitted
    {"int4_asym_recipe_rotated", "int4_asym", "", "", "k=int4_channel_t16 v=int4_asym_g64 +rotate",
     0, true},
    // the int4_asym recipe with pools split: FP16 pool one block per buffer, body 3 per buffer
    {"int4_asym_recipe_split", "int4_asym", "", "", "k=int4_channel_t16 v=int4_asym_g64",
     400 << 10},
};

EngineConfig regime_config(const Regime& rg, const std::string& device) {
  EngineConfig cfg;
  cfg.model = "default";
  cfg.device = device;
  cfg.kv.kv.dtype = rg.dtype;
  cfg.kv.kv.dtype_k = rg.dtype_k;
  cfg.kv.kv.dtype_v = rg.dtype_v;
  if (rg.rotate) cfg.kv.kv.rotate = true;
  cfg.kv.kv.block_size = 16;
  cfg.kv.kv.sink_tokens = 8;
  cfg.kv.kv.window_tokens = 16;
  cfg.kv.max_model_len = rg.part_bytes > 0 ? 104 : 256;
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

class VulkanKvEngine : public ::testing::TestWithParam<Regime> {};

TEST_P(VulkanKvEngine, MixedRegimeGivesTheCpuTokensWhereMarginsAllow) {
  BIE_REQUIRE_FILE(test::smollm2_path());
  const Regime& rg = GetParam();
  const auto t0 = std::chrono::steady_clock::now();
  if (rg.part_bytes > 0) {
    ::setenv("BIE_VULKAN_KV_PART_BYTES", std::to_string(rg.part_bytes).c_str(), 1);
  }
  auto gpu = Engine::create(regime_config(rg, "vulkan:0"));
  ::unsetenv("BIE_VULKAN_KV_PART_BYTES");
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  const KvSetupReport& r = (*gpu)->kv_report();
  EXPECT_EQ(r.layout_label, rg.label) << r.layout_label;
  EXPECT_GT(r.body_blocks, 0);
  EXPECT_GT(r.fp16_blocks, 0);
  if (rg.part_bytes > 0) {
    EXPECT_GE(r.pool_buffers(r.fp16_blocks, r.fp16_block_bytes), 3) << format_kv_report(r);
    EXPECT_GE(r.pool_buffers(r.body_blocks, r.body_block_bytes), 2) << format_kv_report(r);
  }
  for (const char* p : kPrompts) {
    EXPECT_GT((*gpu)->tokenizer().encode(p).size(), 8u + 16u + 16u) << "prompt shorter than "
                                                                       "sink + window: no body";
  }
  const std::vector<std::vector<int32_t>> got = test::run_greedy(**gpu, kPrompts, kTokens);
  (*gpu)->wait_idle();
  EXPECT_EQ(test::used_blocks(**gpu), 0);
  gpu->reset();

  const auto t1 = std::chrono::steady_clock::now();
  auto cpu = Engine::create(regime_config(rg, "cpu"));
  ASSERT_TRUE(cpu.ok()) << cpu.error();
  const std::vector<std::vector<int32_t>> want = test::run_greedy(**cpu, kPrompts, kTokens);
  const auto t2 = std::chrono::steady_clock::now();
  const auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  std::printf("device engine %.1f s, cpu engine %.1f s\n", secs(t0, t1), secs(t1, t2));
  const int identical = test::identical_where_margins_allow(want, got, kPrompts, kTokens,
                                                            (*cpu)->tokenizer(), kMarginFloor);
  std::printf("vulkan vs cpu engine, %s mixed: %d of %zu request identical for %d tokens\n",
              rg.label, identical, want.size(), kTokens);
}

// The buffer-size knob is checked: a value that is not a positive byte count is one clear error.
TEST(VulkanKvEngineConfig, AMalformedKvPartSizeIsRefused) {
  BIE_REQUIRE_FILE(test::smollm2_path());
  for (const char* var : {"BIE_VULKAN_KV_PART_BYTES", "BIE_VULKAN_MAX_BUFFER_BYTES"}) {
    for (const char* bad : {"12x", "0", "-4"}) {
      ::setenv(var, bad, 1);
      auto e = Engine::create(regime_config(kRegimes[0], "vulkan:0"));
      ::unsetenv(var);
      ASSERT_FALSE(e.ok()) << var << "=" << bad;
      EXPECT_NE(e.error().find(std::string(var) + "=" + bad + ": expected a positive byte count"),
                std::string::npos)
          << e.error();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Regimes, VulkanKvEngine, ::testing::ValuesIn(kRegimes),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace bie
