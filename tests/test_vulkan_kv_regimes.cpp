// The serving engine's KV regimes on the Vulkan backend (lavapipe in CI), as on the CPU
// (tests/test_kv_regimes.cpp): several regimes in one engine, each with its own device pools in
// an equal share of the KV memory (allocated up front, so what the device holds is the report's
// plan), the per-request choice, the kill switch and the length policy picking among them, each
// regime giving the tokens an engine of that regime alone gives; prefix hits whose blocks include
// quantised body blocks; and preemption under a tight device budget losing nothing.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "bie/engine/engine.h"
#include "bie/tokenizer/tokenizer.h"
#include "support/engine_collect.h"
#include "support/paths.h"

namespace bie {
namespace {

using test::collect;
using test::Collected;

constexpr int kTokens = 8;

// Longer than sink + window (8 + 16 tokens): body blocks are written, migrated and read.
const char* const kLong =
    "Once upon a time, in a land far away, there lived a king who had three daughters. The eldest "
    "was proud, the second was clever, and the youngest was kind to every creature she met. One "
    "winter morning the king called them to his hall and said";

EngineConfig config(const std::string& dtype) {
  EngineConfig cfg;
  cfg.model = "default";
  cfg.device = "vulkan:0";
  cfg.kv.kv.dtype = dtype;
  cfg.kv.kv.block_size = 16;
  cfg.kv.kv.sink_tokens = 8;
  cfg.kv.kv.window_tokens = 16;
  cfg.kv.max_model_len = 128;
  cfg.kv.max_num_seqs = 4;
  cfg.kv.chunked_prefill_size = 32;
  cfg.kv.kv_cache_memory = 48ull << 20;
  cfg.threads = 2;
  cfg.check_integrity = true;
  return cfg;
}

EngineRequest greedy(const Engine& e, const std::string& text, int n) {
  EngineRequest r;
  r.prompt = e.tokenizer().encode(text);
  r.sampling.temperature = 0;
  r.max_tokens = n;
  return r;
}

struct Done {
  std::vector<int32_t> tokens;
  FinishEvent fin;
};

Done run(Engine& e, EngineRequest r) {
  static RequestId id = 1;
  Collected c;
  test::run_to_end(e, id++, std::move(r), c);
  return {c.tokens, *c.finish};
}

// What the device holds: weights + workspace + every regime's pools.
uint64_t planned_device_bytes(const KvSetupReport& r) {
  return r.weights_bytes + r.workspace_bytes + r.all_kv_pool_bytes();
}

TEST(VulkanKvRegimes, RegimesShareTheDeviceMemoryAndServeEachRequestInItsOwn) {
  BIE_REQUIRE_FILE(test::smollm2_path());
  // Each regime alone on the device: the tokens the shared engine must give in it.
  std::vector<int32_t> alone16, alone4;
  {
    auto e = Engine::create(config("f16"));
    ASSERT_TRUE(e.ok()) << e.error();
    EXPECT_EQ((*e)->kv_policy().regimes.size(), 1u);  // no kill-switch pools beside f16
    alone16 = run(**e, greedy(**e, kLong, kTokens)).tokens;
  }
  {
    auto e = Engine::create(config("int4_asym"));
    ASSERT_TRUE(e.ok()) << e.error();
    // The automatic kill switch takes no share of the device's memory.
    EXPECT_EQ((*e)->kv_policy().regimes.size(), 1u);
    EXPECT_EQ((*e)->kv_report().kv_regime_shares, 1);
    alone4 = run(**e, greedy(**e, kLong, kTokens)).tokens;
  }
  ASSERT_EQ(alone16.size(), static_cast<size_t>(kTokens));
  ASSERT_EQ(alone4.size(), static_cast<size_t>(kTokens));

  EngineConfig cfg = config("int4_asym");
  cfg.kv_regimes = {"f16"};
  // The policy moves requests one token longer than the others here to int8.
  int64_t n_prompt = 0;
  {
    auto e = Engine::create(config("f16"));
    ASSERT_TRUE(e.ok()) << e.error();
    n_prompt = static_cast<int64_t>((*e)->tokenizer().encode(kLong).size());
  }
  cfg.kv_policy = "int8:" + std::to_string(n_prompt + kTokens + 1) + "-";
  auto e = Engine::create(cfg);
  ASSERT_TRUE(e.ok()) << e.error();
  Engine& eng = **e;
  const KvSetupReport& r = eng.kv_report();
  const KvPolicyInfo info = eng.kv_policy();
  ASSERT_EQ(info.regimes.size(), 3u);  // int4_asym (default), f16, int8
  EXPECT_EQ(info.regimes[1].label, "f16");
  EXPECT_EQ(r.kv_regime_shares, 3);
  EXPECT_EQ(r.kv_budget_bytes, (48ull << 20) / 3);
  EXPECT_GT(r.other_regime_pool_bytes, 0u);
  EXPECT_NE(r.regimes.find("share of the KV memory"), std::string::npos) << r.regimes;
  // Allocated up front, every regime's pools, as planned; serving allocates nothing more.
  EXPECT_EQ(eng.metrics().device_bytes, planned_device_bytes(r));
  for (const auto& rg : info.regimes) EXPECT_GE(rg.tokens_fit, 128) << rg.label;

  const std::string label4 = info.regimes[0].label;
  const Done d = run(eng, greedy(eng, kLong, kTokens));
  EXPECT_EQ(d.fin.metrics.kv_regime, label4);
  EXPECT_EQ(d.tokens, alone4);
  EngineRequest want16 = greedy(eng, kLong, kTokens);
  want16.kv_cache_dtype = "f16";
  const Done d16 = run(eng, want16);
  EXPECT_EQ(d16.fin.metrics.kv_regime, "f16");
  EXPECT_EQ(d16.tokens, alone16);
  EngineRequest longer = greedy(eng, kLong, kTokens + 1);
  EXPECT_EQ(eng.kv_regime_for(longer), info.regimes[2].label);
  const Done d8 = run(eng, longer);
  EXPECT_EQ(d8.fin.metrics.kv_regime, info.regimes[2].label);
  EXPECT_EQ(d8.fin.finish_reason, "length") << d8.fin.error;

  eng.set_force_f16(true);  // the kill switch beats the policy and the request's own choice
  EXPECT_EQ(eng.kv_regime_for(longer), "f16");
  const Done forced = run(eng, greedy(eng, kLong, kTokens));
  EXPECT_EQ(forced.fin.metrics.kv_regime, "f16");
  EXPECT_EQ(forced.tokens, alone16);
  eng.set_force_f16(false);
  EXPECT_EQ(run(eng, greedy(eng, kLong, kTokens)).fin.metrics.kv_regime, label4);
  eng.wait_idle();
  EXPECT_EQ(test::used_blocks(eng), 0);
  EXPECT_EQ(eng.metrics().device_bytes, planned_device_bytes(r));
}

// A regime that does not fit its share is refused at start-up with the share named.
TEST(VulkanKvRegimes, ARegimeThatDoesNotFitItsShareIsRefusedWithTheShare) {
  BIE_REQUIRE_FILE(test::smollm2_path());
  EngineConfig cfg = config("int4_asym");
  cfg.kv.max_model_len = 512;
  cfg.kv.kv_cache_memory = 16ull << 20;  // f16: 23040 bytes/token, 512 tokens = 11.2 MiB
  ASSERT_TRUE(Engine::create(config("f16")).ok());
  cfg.kv_regimes = {"f16"};
  auto e = Engine::create(cfg);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().find("one of 2 equal shares"), std::string::npos) << e.error();
}

// Prefix hits on the device whose cached blocks include quantised body blocks give the tokens
// the first run gave.
TEST(VulkanKvRegimes, PrefixHitsWithAQuantisedBodyGiveTheSameTokens) {
  BIE_REQUIRE_FILE(test::smollm2_path());
  auto e = Engine::create(config("int4_asym"));
  ASSERT_TRUE(e.ok()) << e.error();
  Engine& eng = **e;
  const Done first = run(eng, greedy(eng, kLong, kTokens));
  const Done again = run(eng, greedy(eng, kLong, kTokens));
  EXPECT_EQ(first.fin.metrics.cached_tokens, 0);
  // Past the 8 sink + 16 window tokens: body blocks come from the cache.
  EXPECT_GE(again.fin.metrics.cached_tokens, 32);
  EXPECT_EQ(again.tokens, first.tokens);
  eng.wait_idle();
  EXPECT_EQ(test::used_blocks(eng), 0);
}

// Three sequences in a quantised regime on a device budget that holds fewer at once: preempted
// sequences are computed again and give the tokens they give alone; every block comes back.
TEST(VulkanKvRegimes, PreemptionUnderATightDeviceBudgetLosesNothing) {
  BIE_REQUIRE_FILE(test::smollm2_path());
  EngineConfig cfg = config("int4_asym");
  cfg.kv.kv_cache_memory = 1900ull << 10;  // one sequence of 128 tokens: 1.7 MiB
  cfg.enable_prefix_caching = false;
  auto e = Engine::create(cfg);
  ASSERT_TRUE(e.ok()) << e.error();
  Engine& eng = **e;
  const char* const prompts[] = {
      kLong,
      "The history of the city begins with a small fishing village on the river, where traders "
      "from the north came every summer to buy salt, amber and furs, and",
      "In mathematics, a prime number is a natural number greater than one that has no positive "
      "divisors other than one and itself. The first primes are",
  };
  constexpr int kLongTokens = 8;
  std::vector<std::vector<int32_t>> alone;
  for (const char* p : prompts) alone.push_back(run(eng, greedy(eng, p, kLongTokens)).tokens);
  std::vector<std::unique_ptr<Collected>> cs;
  RequestId id = 500;
  for (const char* p : prompts) {
    cs.push_back(std::make_unique<Collected>());
    EXPECT_FALSE(eng.submit(id++, greedy(eng, p, kLongTokens), collect(*cs.back())).has_value());
  }
  for (size_t i = 0; i < cs.size(); ++i) {
    cs[i]->wait();
    EXPECT_EQ(cs[i]->finish->finish_reason, "length") << cs[i]->finish->error;
    EXPECT_EQ(cs[i]->tokens, alone[i]) << "prompt " << i;
  }
  EXPECT_GT(eng.metrics().preemptions, 0);
  eng.wait_idle();
  EXPECT_EQ(test::used_blocks(eng), 0);
}

}  // namespace
}  // namespace bie
