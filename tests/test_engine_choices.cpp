// n > 1 through the Engine on the default model: the prompt is computed once and the other
// choices fork from it, sharing its KV blocks copy-on-write (one copy of the prompt in the pools:
// n choices hold the shared full blocks once plus a last block each); greedy choices equal the
// n = 1 output; seeded sampling gives each choice its own stream; cancel ends every choice;
// every choice gets exactly one finish event.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "bie/engine/engine.h"
#include "bie/tokenizer/tokenizer.h"
#include "support/engine_collect.h"
#include "support/paths.h"

namespace bie {
namespace {

EngineConfig config() {
  EngineConfig cfg;
  cfg.model = "default";
  cfg.kv.kv.dtype = "f16";
  cfg.kv.max_model_len = 1024;
  cfg.kv.max_num_seqs = 8;
  cfg.kv.chunked_prefill_size = 64;
  cfg.kv.kv_cache_memory = 128ull << 20;
  cfg.threads = 2;
  cfg.check_integrity = true;
  return cfg;
}

// Every choice's text and finish event, and the blocks in use seen at choice 0's k-th token.
struct Choices {
  std::mutex mu;
  std::condition_variable cv;
  std::map<int32_t, std::string> text;
  std::map<int32_t, int> finishes;
  std::map<int32_t, std::string> reason;
  int64_t blocks_at_k = -1;
  int total_finishes = 0;
  void wait(int n) {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return total_finishes == n; });
  }
};

RequestCallbacks collect(Choices& c, const Engine& eng, int k) {
  RequestCallbacks cb;
  auto count = std::make_shared<int>(0);
  cb.on_token = [&c, &eng, k, count](const TokenEvent& e) {
    std::lock_guard lk(c.mu);
    c.text[e.index] += e.text;
    // The engine publishes its gauges after every step: the snapshot is the previous step's,
    // when every choice already ran.
    if (e.index == 0 && ++*count == k) c.blocks_at_k = test::used_blocks(eng);
    return true;
  };
  cb.on_finish = [&c](const FinishEvent& f) {
    std::lock_guard lk(c.mu);
    c.text[f.index] += f.tail_text;
    ++c.finishes[f.index];
    c.reason[f.index] = f.finish_reason;
    ++c.total_finishes;
    c.cv.notify_all();
  };
  return cb;
}

EngineRequest request(const Engine& eng, std::vector<int32_t> prompt, int n, int max_tokens) {
  EngineRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.n = n;
  (void)eng;
  return r;
}

TEST(EngineChoices, ForkedChoicesShareThePromptsBlocks) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  EngineConfig cfg = config();
  cfg.enable_prefix_caching = false;  // the second request computes its prompt again
  auto e = Engine::create(cfg);
  ASSERT_TRUE(e.ok()) << e.error();
  Engine& eng = **e;
  const int64_t B = eng.metrics().kv_block_size;
  ASSERT_GT(B, 8);
  // 10 full blocks and one token: the generated tokens (fewer than B - 1) stay in the last block.
  std::vector<int32_t> prompt = eng.tokenizer().encode(
      "The history of the city is long and full of stories about its people, its rivers, its "
      "bridges and its markets, which have been told for many generations by travellers. ");
  while (static_cast<int64_t>(prompt.size()) < 10 * B + 1) {
    prompt.insert(prompt.end(), prompt.begin(), prompt.begin() + 8);
  }
  prompt.resize(static_cast<size_t>(10 * B + 1));
  const int max_tokens = static_cast<int>(B / 2);

  Choices one, four;
  ASSERT_FALSE(eng.submit(1, request(eng, prompt, 1, max_tokens), collect(one, eng, 4)));
  one.wait(1);
  eng.wait_idle();
  ASSERT_FALSE(eng.submit(2, request(eng, prompt, 4, max_tokens), collect(four, eng, 4)));
  four.wait(4);
  eng.wait_idle();
  // n = 1: 10 full blocks + the last one. n = 4: the 10 full blocks once, a last block each
  // (copy-on-write of the shared partial block on each choice's first append). Without
  // sharing it would be 4 * 11.
  EXPECT_EQ(one.blocks_at_k, 11);
  EXPECT_EQ(four.blocks_at_k, 10 + 4);
  EXPECT_EQ(four.blocks_at_k - one.blocks_at_k, 3);
  // Greedy: every choice is the n = 1 output; one finish per choice.
  ASSERT_EQ(four.text.size(), 4u);
  for (const auto& [i, t] : four.text) {
    EXPECT_EQ(t, one.text[0]) << "choice " << i;
    EXPECT_EQ(four.finishes[i], 1);
    EXPECT_EQ(four.reason[i], "length");
  }
  EXPECT_EQ(test::used_blocks(eng), 0);
  // The prompt was computed once for the four choices.
  EXPECT_EQ(eng.metrics().computed_prompt_tokens, 2 * static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(eng.metrics().requests_finished, 2);
}

TEST(EngineChoices, SeededChoicesDifferCancelEndsAllAndNIsBounded) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  auto e = Engine::create(config());
  ASSERT_TRUE(e.ok()) << e.error();
  Engine& eng = **e;
  const std::vector<int32_t> prompt =
      eng.tokenizer().encode("Once upon a time, in a land far away,");
  {
    EngineRequest r = request(eng, prompt, 3, 24);
    r.sampling.temperature = 1.0f;
    r.sampling.top_k = 0;
    r.sampling.top_p = 1.0f;
    r.sampling.min_p = 0.0f;
    Choices c;
    ASSERT_FALSE(eng.submit(1, r, collect(c, eng, 1)));
    c.wait(3);
    EXPECT_NE(c.text[0], c.text[1]);
    EXPECT_NE(c.text[1], c.text[2]);
  }
  {
    // Cancelled after its first tokens: every choice ends "cancelled", every block is free.
    Choices c;
    RequestCallbacks cb = collect(c, eng, 1000);
    auto inner = cb.on_token;
    cb.on_token = [inner, &eng](const TokenEvent& ev) {
      if (ev.index == 2) eng.cancel(7);
      return inner(ev);
    };
    ASSERT_FALSE(eng.submit(7, request(eng, prompt, 4, 200), cb));
    c.wait(4);
    eng.wait_idle();
    for (int i = 0; i < 4; ++i) EXPECT_EQ(c.reason[i], "cancelled") << i;
    EXPECT_EQ(test::used_blocks(eng), 0);
  }
  Choices c;
  auto refused = eng.submit(9, request(eng, prompt, 9, 4), collect(c, eng, 1));
  ASSERT_TRUE(refused.has_value());
  EXPECT_NE(refused->message.find("n must be in [1, 8]"), std::string::npos) << refused->message;
}

}  // namespace
}  // namespace bie
