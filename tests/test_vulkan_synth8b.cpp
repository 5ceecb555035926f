// The product page's headline model on a device, as a functional test on lavapipe: the synthetic
// Llama-3-8B (`bie synth --preset llama-3-8b`: the real geometry, random Q4_K weights, 4.2 GiB of
// tensor data) served by the Engine with the int4 sink+window regime (K int4_channel_t64 / V
// int4_asym_g64, FP16 sink and window) inside an 8 GiB device budget. The weights are uploaded
// in pieces (lavapipe allocates at most 2 GiB per buffer), the body pool in several buffers, and
// everything the device holds equals the start-up report from the first byte to the last token.
// The depth is small: lavapipe runs an 8B model at about a minute per pass, and binds at most 128
// MiB per buffer, so its KV pools stop at four bindings (8,192 tokens here); a GPU binding 2-4 GiB
// per buffer holds the 65,536 of the headline in the same budget (docs/gpu.md). Random weights
// give noise text, so the tokens are not compared with the CPU's; the kernels are held to the CPU
// on the shipped models (test_vulkan_kv_engine.cpp, test_vulkan_kv_regimes.cpp).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "bie/engine/engine.h"
#include "bie/engine/synth_model.h"
#include "bie/planner/presets.h"
#include "bie/tokenizer/tokenizer.h"
#include "support/engine_collect.h"
#include "support/paths.h"

namespace bie {
namespace {

TEST(VulkanSynth8B, Int4SinkWindowRegimeRunsInAn8GiBDeviceBudgetAsPlanned) {
  BIE_REQUIRE_FILE(test::smollm2_path());  // the synthetic model's tokenizer
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / "bie_test_synth_llama-3-8b-Q4_K.gguf";
  struct Remove {
    std::filesystem::path p;
    ~Remove() { std::filesystem::remove(p); }
  } remove{path};
  auto g = planner::preset_geometry("llama-3-8b");
  ASSERT_TRUE(g.ok()) << g.error();
  SynthOptions so;
  so.geometry = *g;
  so.label = "llama-3-8b";
  so.tokenizer_from = test::smollm2_path();
  auto written = write_synthetic_model(path.string(), so);
  ASSERT_TRUE(written.ok()) << written.error();
  EXPECT_GT(written->weight_bytes, 4ull << 30);

  EngineConfig cfg;
  cfg.model = path.string();
  cfg.device = "vulkan:0";
  cfg.kv.kv.dtype = "int4_asym";
  cfg.kv.device_memory = 8ull << 30;
  cfg.kv.max_model_len = 8192;
  cfg.kv.max_num_seqs = 1;
  cfg.threads = 2;
  cfg.check_integrity = true;
  auto e = Engine::create(cfg);
  ASSERT_TRUE(e.ok()) << e.error();
  const KvSetupReport& r = (*e)->kv_report();
  EXPECT_EQ(r.layout_label, "k=int4_channel_t64 v=int4_asym_g64");
  EXPECT_TRUE(r.layout.mixed());
  EXPECT_EQ(r.layout.sink_tokens, 8);
  EXPECT_EQ(r.layout.window_tokens, 128);
  const uint64_t planned = r.weights_bytes + r.workspace_bytes + r.all_kv_pool_bytes();
  EXPECT_LE(planned, r.usable_bytes);  // inside 0.90 x 8 GiB
  EXPECT_EQ((*e)->metrics().device_bytes, planned);
  std::printf("synthetic 8B on %s: weights %llu + workspace %llu + KV pools %llu of %llu usable\n",
              r.device.c_str(), static_cast<unsigned long long>(r.weights_bytes),
              static_cast<unsigned long long>(r.workspace_bytes),
              static_cast<unsigned long long>(r.all_kv_pool_bytes()),
              static_cast<unsigned long long>(r.usable_bytes));

  EngineRequest req;
  req.prompt = (*e)->tokenizer().encode("Hello there, how");
  req.sampling.temperature = 0;
  req.max_tokens = 1;  // one pass: lavapipe runs an 8B pass in about a minute on 2 cores
  req.ignore_eos = true;
  test::Collected c;
  ASSERT_FALSE((*e)->submit(1, req, test::collect(c)).has_value());
  c.wait();
  ASSERT_TRUE(c.finish.has_value());
  EXPECT_EQ(c.finish->finish_reason, "length") << c.finish->error;
  EXPECT_EQ(c.tokens.size(), 1u);
  EXPECT_EQ(c.finish->metrics.kv_regime, r.layout_label);
  (*e)->wait_idle();
  const EngineMetrics m = (*e)->metrics();
  EXPECT_EQ(m.device_bytes, planned);
  EXPECT_EQ(m.device_peak_bytes, planned);  // serving allocated nothing beyond the plan
  EXPECT_EQ(test::used_blocks(**e), 0);
}

}  // namespace
}  // namespace bie
