// SmolLM2 and Gemma 3 end to end with the Vulkan backend on lavapipe: the decoder's dense work
// (embedding, every matmul, norms, RoPE, GLU, softcap, logits) runs in the GPU's shaders, the KV
// cache and attention on the host reading the mapped device buffers (lavapipe's memory is host
// visible). Top-10 next-token logits against llama.cpp's goldens with the CPU backend's
// tolerance, on a few prompts (lavapipe is slow).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/vulkan/vulkan_backend.h"
#include "bie/engine/generate.h"
#include "bie/kv/contiguous_kv_cache.h"
#include "bie/model/model.h"
#include "support/paths.h"

namespace bie {
namespace {

// The CPU backend's bars (test_model_golden.cpp, test_model_gemma3_golden.cpp): llama.cpp's own
// spread on these prompts (flash attention on vs off).
constexpr double kSmolLM2TopLogitTol = 0.6;
constexpr double kGemma3TopLogitTol = 1.25;
constexpr int kPrompts = 3;  // the first prompts of each golden file

int lavapipe_index() {
  auto list = list_vulkan_devices();
  if (!list.ok()) return -1;
  for (const GpuDeviceInfo& d : *list) {
    if (d.name.find("llvmpipe") != std::string::npos) return d.index;
  }
  return -1;
}

void check_golden(const std::string& model_path, const std::string& golden, double tol) {
  BIE_REQUIRE_FILE(model_path);
  std::ifstream gf(test::source_dir() + "/tests/golden/" + golden + "/logits.json");
  ASSERT_TRUE(gf) << golden << " goldens missing";
  const nlohmann::json g = nlohmann::json::parse(gf);
  auto model = load_model(model_path);
  ASSERT_TRUE(model.ok()) << model.error();
  VulkanBackendOptions o;
  o.device_index = lavapipe_index();
  o.n_host_threads = 2;
  auto be = VulkanBackend::create(o);
  ASSERT_TRUE(be.ok()) << be.error();
  double worst = 0.0;
  int n = 0;
  for (const auto& p : g["prompts"]) {
    if (n++ == kPrompts) break;
    const auto ids = p["prompt_ids"].get<std::vector<int32_t>>();
    ContiguousKvCache kv((*model)->hparams().kv_geometry(), 2048);
    auto logits = prompt_logits(**model, kv, **be, ids);
    ASSERT_TRUE(logits.ok()) << logits.error();
    // The decoder returns the mapped logits buffer without waiting for the device (the CPU
    // backend is synchronous); wait here until its producer is fixed.
    (*be)->synchronize();
    ASSERT_TRUE((*be)->status().ok()) << (*be)->status().error();
    const auto& top = p["top_logits"];
    EXPECT_EQ(argmax(logits->data(), (*model)->hparams().n_vocab), top[0][0].get<int32_t>())
        << p["name"];
    for (const auto& e : top) {
      const int32_t id = e[0].get<int32_t>();
      const double want = e[1].get<double>();
      const double got = (*logits)[static_cast<size_t>(id)];
      worst = std::max(worst, std::fabs(got - want));
      EXPECT_NEAR(got, want, tol) << p["name"] << " token " << id;
    }
  }
  std::printf("%s on %s: worst top-10 logit difference vs llama.cpp over %d prompts: %.4f\n",
              golden.c_str(), (*be)->name().c_str(), kPrompts, worst);
}

TEST(VulkanGolden, SmolLM2TopLogitsMatchLlamaCpp) {
  check_golden(test::smollm2_path(), "smollm2", kSmolLM2TopLogitTol);
}

TEST(VulkanGolden, Gemma3TopLogitsMatchLlamaCpp) {
  check_golden(test::gemma3_path(), "gemma3", kGemma3TopLogitTol);
}

}  // namespace
}  // namespace bie
