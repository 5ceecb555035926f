// The Engine facade end to end on the default model: greedy output equals the single-sequence
// generate() path, a concurrent batch equals its requests run alone, prefix-cache hits change
// nothing but the work done, preemption under a tight KV budget loses nothing, cancellation and
// refusals free every block.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "bie/engine/engine.h"
#include "support/generate.h"
#include "bie/engine/kv_setup.h"
#include "bie/engine/model_path.h"
#include "bie/planner/kv_layout_flags.h"
#include "bie/tokenizer/tokenizer.h"
#include "support/engine_collect.h"
#include "support/paths.h"

namespace bie {
namespace {

using test::collect;
using test::Collected;

EngineConfig base_config() {
  EngineConfig cfg;
  cfg.model = "default";
  cfg.kv.kv.dtype = "f16";
  cfg.kv.max_model_len = 1024;
  cfg.kv.max_num_seqs = 8;
  cfg.kv.chunked_prefill_size = 64;
  cfg.kv.kv_cache_memory = 192ull << 20;
  cfg.threads = 2;
  cfg.check_integrity = true;
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

using test::used_blocks;

// The greedy tokens of `prompt` through the single-sequence path: generate() on a paged cache of
// the options' layout (the default model, batches of max_batch tokens, prompt chunks of `chunk`
// aligned to `align`).
std::vector<int32_t> single_sequence_greedy(const KvEngineOptions& o,
                                            const std::vector<int32_t>& prompt, int max_tokens,
                                            int32_t max_batch, int32_t chunk, int32_t align = 1) {
  LoadOptions lo;
  lo.max_batch_tokens = max_batch;
  auto model = load_named_model("default", lo);
  EXPECT_TRUE(model.ok());
  if (!model.ok()) return {};
  auto kv = setup_kv_cache(**model, o);
  EXPECT_TRUE(kv.ok()) << kv.error();
  if (!kv.ok()) return {};
  CpuBackend pool(2);
  GenerateRequest g;
  g.prompt = prompt;
  g.sampling.temperature = 0;
  g.max_tokens = max_tokens;
  g.prefill_chunk = chunk;
  g.prefill_align = align;
  std::vector<int32_t> out;
  auto st = generate(**model, *kv->cache, pool, g, [&](int32_t t) {
    out.push_back(t);
    return true;
  });
  EXPECT_TRUE(st.ok()) << st.error();
  return out;
}

TEST(Engine, GreedyMatchesSingleSequenceGenerate) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
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
  EXPECT_EQ(c.tokens, single_sequence_greedy(base_config().kv, req.prompt, 24, 64, 64));
  eng.wait_idle();
  EXPECT_EQ(used_blocks(eng), 0);
}

// Blocks that leave the FP16 window while the engine decodes are re-quantised into the body pool
// by the data work the KV coordinator hands back (ModelRunner::prepare_kv, finish_pass): a
// window of 16 tokens makes that happen every 16 decode steps. The greedy tokens equal the
// single-sequence path's on a cache of the same layout, whose exits run at once.
TEST(Engine, WindowExitsDuringDecodeMatchSingleSequenceGenerate) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  for (const char* dtype : {"int8", "int4_asym"}) {
    EngineConfig cfg = base_config();
    cfg.kv.kv.dtype = dtype;
    cfg.kv.kv.block_size = 16;
    cfg.kv.kv.window_tokens = 16;
    cfg.kv.kv.sink_tokens = 8;
    auto e = Engine::create(cfg);
    ASSERT_TRUE(e.ok()) << e.error();
    Engine& eng = **e;
    const EngineRequest req = greedy(eng.tokenizer(), kPrompts[1], 48);
    Collected c;
    ASSERT_FALSE(eng.submit(1, req, collect(c)).has_value());
    c.wait();
    ASSERT_EQ(c.finish->finish_reason, "length") << c.finish->error;

    EXPECT_EQ(c.tokens,
              single_sequence_greedy(cfg.kv, req.prompt, 48, 64, 64, cfg.kv.kv.block_size))
        << dtype;
    eng.wait_idle();
    EXPECT_EQ(used_blocks(eng), 0);
  }
}

// A long prompt in the default 4-bit regime (64-token blocks, 128-token FP16 window): the engine
// cuts it into 64-token chunks (KvLayout::prefill_chunk_cap) and holds one chunk at a time, so each
// prompt token attends to the last 64..128 tokens in FP16. Its greedy tokens equal the
// single-sequence path's fed in chunks of that size. (Holding the whole prompt at admission, as
// the engine did before, wrote blocks outside the final window straight into the body format and
// gave other tokens on this prompt.)
TEST(Engine, LongQuantisedPromptRunsInWindowSizedChunks) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  std::string text = test::read_file(test::source_dir() + "/../shared/data/tinyshakespeare.txt");
  ASSERT_GT(text.size(), 1500u);
  text.resize(1500);
  EngineConfig cfg = base_config();
  cfg.kv.kv.dtype = "int4_asym";
  cfg.kv.chunked_prefill_size = 512;
  auto e = Engine::create(cfg);
  ASSERT_TRUE(e.ok()) << e.error();
  Engine& eng = **e;
  const EngineRequest req = greedy(eng.tokenizer(), text, 16);
  ASSERT_GT(req.prompt.size(), 400u);
  Collected c;
  ASSERT_FALSE(eng.submit(1, req, collect(c)).has_value());
  c.wait();
  ASSERT_EQ(c.finish->finish_reason, "length") << c.finish->error;

  auto layout = planner::resolve_kv_layout(cfg.kv.kv);
  ASSERT_TRUE(layout.ok()) << layout.error();
  ASSERT_EQ(layout->prefill_chunk_cap(), 64);
  EXPECT_EQ(c.tokens, single_sequence_greedy(cfg.kv, req.prompt, 16, 512, 64, 64));
  eng.wait_idle();
  EXPECT_EQ(used_blocks(eng), 0);
}

// Runs each prompt alone, then all together; returns (alone, together) token lists.
std::pair<std::vector<std::vector<int32_t>>, std::vector<std::vector<int32_t>>> alone_and_together(
    Engine& eng, int max_tokens) {
  std::vector<std::vector<int32_t>> alone, together;
  RequestId id = 100;

  for (const char* p : kPrompts) {
    Collected c;
    EXPECT_FALSE(eng.submit(id++, greedy(eng.tokenizer(), p, max_tokens), collect(c)).has_value());
    c.wait();
    alone.push_back(c.tokens);
  }
  std::vector<std::unique_ptr<Collected>> cs;
  for (const char* p : kPrompts) {
    cs.push_back(std::make_unique<Collected>());
    EXPECT_FALSE(
        eng.submit(id++, greedy(eng.tokenizer(), p, max_tokens), collect(*cs.back())).has_value());
  }
  for (auto& c : cs) {
    c->wait();
    together.push_back(c->tokens);
  }

  return {alone, together};
}

TEST(Engine, ConcurrentBatchEqualsRequestsAlone) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  auto e = Engine::create(base_config());
  ASSERT_TRUE(e.ok()) << e.error();
  auto [alone, together] = alone_and_together(**e, 16);
  EXPECT_EQ(alone, together);
  const EngineMetrics m = (*e)->metrics();
  EXPECT_GT(m.batched_seqs, m.steps);  // some steps ran several sequences
  (*e)->wait_idle();
  EXPECT_EQ(used_blocks(**e), 0);
}

TEST(Engine, PrefixCacheHitGivesSameOutputAndSkipsWork) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  EngineConfig cfg = base_config();
  auto e = Engine::create(cfg);
  ASSERT_TRUE(e.ok()) << e.error();
  Engine& eng = **e;
  std::string system = "You are a helpful assistant. ";
  for (int i = 0; i < 12; ++i) system += "Answer briefly and precisely, with facts only. ";
  Collected a, b;
  ASSERT_FALSE(eng.submit(1, greedy(eng.tokenizer(), system + "Q: 2+2?", 12), collect(a)));
  a.wait();
  ASSERT_FALSE(eng.submit(2, greedy(eng.tokenizer(), system + "Q: 2+2?", 12), collect(b)));
  b.wait();
  EXPECT_EQ(a.finish->metrics.cached_tokens, 0);
  const int64_t n_prompt = b.finish->metrics.prompt_tokens;
  EXPECT_EQ(b.finish->metrics.cached_tokens, (n_prompt - 1) / 16 * 16);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_GT(eng.metrics().prefix_hit_blocks, 0);

  cfg.enable_prefix_caching = false;
  auto off = Engine::create(cfg);
  ASSERT_TRUE(off.ok());
  Collected c;
  ASSERT_FALSE((*off)->submit(1, greedy(eng.tokenizer(), system + "Q: 2+2?", 12), collect(c)));
  c.wait();
  EXPECT_EQ(c.finish->metrics.cached_tokens, 0);
  EXPECT_EQ(c.tokens, a.tokens);
}

// Quantised KV: a prompt's body blocks are cached in the body format, its sink/window blocks in
// FP16. A repeat of the prompt hits every full block (FP16 where it needs FP16, body where body)
// and reproduces the output exactly; a longer prompt that needs some of those FP16 blocks in the
// body format quantises the cached FP16 copy (docs/serving.md "Prefix caching and quantised KV")
// and still matches a cold run.
void prefix_cache_with_quantised_body(EngineConfig cfg, const std::string& label) {
  auto e = Engine::create(cfg);
  ASSERT_TRUE(e.ok()) << e.error();
  Engine& eng = **e;
  std::string text;
  for (int i = 0; i < 40; ++i) text += "Line " + std::to_string(i) + " of the shared context. ";
  const EngineRequest a = greedy(eng.tokenizer(), text, 12);
  ASSERT_GT(a.prompt.size(), 300u);  // well past the 128-token window
  // int8 = per-channel int8 keys over 64-token blocks (kDefaultInt8Block), per-token int8 values.
  const int64_t B = eng.kv_report().layout.block_size;
  EXPECT_EQ(eng.kv_report().layout_label, label);
  Collected first, again, longer;
  ASSERT_FALSE(eng.submit(1, a, collect(first)));
  first.wait();
  ASSERT_FALSE(eng.submit(2, a, collect(again)));
  again.wait();
  EXPECT_EQ(again.finish->metrics.cached_tokens, static_cast<int64_t>(a.prompt.size() - 1) / B * B);
  EXPECT_EQ(again.tokens, first.tokens);

  EngineRequest b = a;
  const auto more = eng.tokenizer().encode(" And one more line that pushes the window on.");
  b.prompt.insert(b.prompt.end(), more.begin(), more.end());
  ASSERT_FALSE(eng.submit(3, b, collect(longer)));
  longer.wait();
  EXPECT_GE(longer.finish->metrics.cached_tokens, static_cast<int64_t>(a.prompt.size()) / B * B);
  EXPECT_EQ(longer.finish->finish_reason, "length");
  eng.wait_idle();
  EXPECT_EQ(used_blocks(eng), 0);
  // Body blocks are always quantised from FP16-rounded rows, so quantising a cached FP16 copy
  // gives the bytes a cold run writes: the output equals an engine without prefix caching.
  cfg.enable_prefix_caching = false;
  auto cold = Engine::create(cfg);
  ASSERT_TRUE(cold.ok()) << cold.error();
  Collected cold_longer;
  ASSERT_FALSE((*cold)->submit(1, b, collect(cold_longer)));
  cold_longer.wait();
  EXPECT_EQ(cold_longer.finish->metrics.cached_tokens, 0);
  EXPECT_EQ(longer.tokens, cold_longer.tokens);
}

// EngineRequest::synthetic_kv_prefix (`bie bench --fill synthetic`): the prefix's K/V are
// written without a forward pass (only the prompt's last token runs), window exits happen as after
// a pass, the blocks enter the prefix cache like computed ones, and a value outside
// [0, prompt length) is refused.
TEST(Engine, SyntheticKvPrefixSkipsItsPrefillAndIsCachedLikeAComputedOne) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  EngineConfig cfg = base_config();
  cfg.kv.kv.dtype = "int4_asym";  // sink, window and quantised body blocks
  auto e = Engine::create(cfg);
  ASSERT_TRUE(e.ok()) << e.error();
  Engine& eng = **e;
  const int64_t B = eng.kv_report().layout.block_size;
  EngineRequest r;
  for (int i = 0; i < 400; ++i) r.prompt.push_back(100 + (i * 7919) % 20000);
  r.sampling.temperature = 0;
  r.max_tokens = 2;
  r.ignore_eos = true;
  r.synthetic_kv_prefix = 399;
  const int64_t before = eng.metrics().computed_prompt_tokens;
  Collected a;
  ASSERT_FALSE(eng.submit(1, r, collect(a)));
  a.wait();
  EXPECT_EQ(a.finish->finish_reason, "length") << a.finish->error;
  EXPECT_EQ(a.tokens.size(), 2u);
  eng.wait_idle();
  EXPECT_EQ(eng.metrics().computed_prompt_tokens - before, 1);  // the last prompt token alone
  EngineRequest again = r;
  again.synthetic_kv_prefix = 0;
  Collected b;
  ASSERT_FALSE(eng.submit(2, again, collect(b)));
  b.wait();
  EXPECT_EQ(b.finish->metrics.cached_tokens, (400 - 1) / B * B);
  for (const int64_t bad : {int64_t{-1}, int64_t{400}}) {
    EngineRequest x = r;
    x.synthetic_kv_prefix = bad;
    Collected c;
    const auto refused = eng.submit(3, x, collect(c));
    ASSERT_TRUE(refused.has_value());
    EXPECT_EQ(refused->kind, SubmitError::kInvalid);
    EXPECT_NE(refused->message.find("synthetic_kv_prefix"), std::string::npos) << refused->message;
  }
  eng.wait_idle();
  EXPECT_EQ(used_blocks(eng), 0);
}

TEST(Engine, PrefixCacheWithQuantisedBody) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  EngineConfig cfg = base_config();
  cfg.kv.kv.dtype = "int8";
  prefix_cache_with_quantised_body(cfg, "k=int8_channel_t64 v=int8");
}

// The same with a KV layer map: SmolLM2's 30 layers in two groups of different value formats, so
// every hit must be served by both groups' pools.
TEST(Engine, PrefixCacheWithALayerMap) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  EngineConfig cfg = base_config();
  for (int il = 0; il < 30; ++il) {
    cfg.kv.kv.layer_map.push_back({"int8_channel", il % 2 == 0 ? "int8" : "fp8_e4m3"});
  }
  prefix_cache_with_quantised_body(cfg, "layer-map k=int8_channel_t64 x30 v=int8 x15,fp8_e4m3 x15");
}

// Every 4-bit regime under continuous batching with prefill chunks that do not fall on block
// boundaries (per-channel keys need whole tiles): all requests finish, invariants hold after
// every step, nothing leaks. With 64-token blocks the 24-token chunk is shorter than a tile: a
// chunk that cannot reach the next block boundary runs to it (within the step's budget) instead
// of being rounded down to nothing, which left every prompt waiting forever.
TEST(Engine, QuantisedRegimesUnderBatchingWithOddChunks) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  struct Case {
    const char* dtype;
    int block_size;
    int64_t batched;
  };
  for (const Case c :
       {Case{"int4_asym", 16, 40}, Case{"int4_channel", 16, 40}, Case{"fp8_e4m3", 16, 40},
        Case{"int4_channel", 64, 80}, Case{"int8_channel", 64, 80}}) {
    const std::string dtype = fmt::format("{} B={}", c.dtype, c.block_size);
    EngineConfig cfg = base_config();
    cfg.kv.kv.dtype = c.dtype;
    cfg.kv.kv.block_size = c.block_size;
    cfg.kv.chunked_prefill_size = 24;
    cfg.max_num_batched_tokens = c.batched;
    auto e = Engine::create(cfg);
    ASSERT_TRUE(e.ok()) << dtype << ": " << e.error();
    Engine& eng = **e;
    std::vector<std::unique_ptr<Collected>> cs;
    for (int i = 0; i < 4; ++i) {
      std::string text;
      for (int j = 0; j < 20 + 15 * i; ++j) text += "word" + std::to_string(j * (i + 1)) + " ";
      cs.push_back(std::make_unique<Collected>());
      ASSERT_FALSE(eng.submit(i, greedy(eng.tokenizer(), text, 20), collect(*cs.back())));
    }
    for (auto& c : cs) {
      c->wait();
      EXPECT_EQ(c->finish->finish_reason, "length") << dtype << ": " << c->finish->error;
    }
    eng.wait_idle();
    EXPECT_EQ(used_blocks(eng), 0) << dtype;
  }
  // A step budget below a per-channel tile could never run a chunk past it: refused up front.
  EngineConfig cfg = base_config();
  cfg.kv.kv.dtype = "int4_channel";
  cfg.kv.kv.block_size = 64;
  cfg.kv.chunked_prefill_size = 24;
  cfg.max_num_batched_tokens = 40;
  auto e = Engine::create(cfg);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().find("--max-num-batched-tokens 40 must be at least the block size 64"),
            std::string::npos)
      << e.error();
}

TEST(Engine, PreemptionUnderATightBudgetLosesNothing) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  EngineConfig cfg = base_config();
  cfg.kv.max_model_len = 128;
  cfg.kv.max_num_seqs = 8;
  // 20 blocks of 16 tokens (23040 bytes per f16 token): 8 sequences of ~60 tokens need 32.
  cfg.kv.kv_cache_memory = 20 * 16 * 23040ull;
  cfg.enable_prefix_caching = false;
  auto e = Engine::create(cfg);
  ASSERT_TRUE(e.ok()) << e.error();
  auto [alone, together] = alone_and_together(**e, 52);
  EXPECT_EQ(alone, together);
  EXPECT_GT((*e)->metrics().preemptions, 0);
  (*e)->wait_idle();
  EXPECT_EQ(used_blocks(**e), 0);
}

TEST(Engine, CancelFreesBlocksAndRefusalsAreClear) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  EngineConfig cfg = base_config();
  cfg.kv.max_num_seqs = 1;
  cfg.max_queue = 1;
  auto e = Engine::create(cfg);
  ASSERT_TRUE(e.ok()) << e.error();
  Engine& eng = **e;
  // A client that goes away after 3 tokens.
  Collected gone;
  RequestCallbacks cb = collect(gone);
  auto inner = cb.on_token;
  cb.on_token = [&gone, inner](const TokenEvent& ev) {
    inner(ev);
    std::lock_guard lk(gone.mu);
    return gone.tokens.size() < 3;
  };
  ASSERT_FALSE(eng.submit(1, greedy(eng.tokenizer(), kPrompts[1], 200), cb));
  gone.wait();
  EXPECT_EQ(gone.finish->finish_reason, "cancelled");
  EXPECT_EQ(gone.tokens.size(), 3u);

  // Running + one queued fill the engine; the third is refused with kQueueFull.
  Collected r1, r2, r3;
  ASSERT_FALSE(eng.submit(2, greedy(eng.tokenizer(), kPrompts[2], 64), collect(r1)));
  ASSERT_FALSE(eng.submit(3, greedy(eng.tokenizer(), kPrompts[3], 64), collect(r2)));
  auto full = eng.submit(4, greedy(eng.tokenizer(), kPrompts[4], 64), collect(r3));
  ASSERT_TRUE(full.has_value());
  EXPECT_EQ(full->kind, SubmitError::kQueueFull);
  eng.cancel(3);
  eng.cancel(2);
  r1.wait();
  r2.wait();
  EXPECT_EQ(r2.finish->finish_reason, "cancelled");

  EngineRequest too_long = greedy(eng.tokenizer(), "x", 8);
  too_long.prompt.assign(1024, too_long.prompt[0]);
  auto tl = eng.submit(5, too_long, collect(r3));
  ASSERT_TRUE(tl.has_value());
  EXPECT_EQ(tl->kind, SubmitError::kTooLong);
  EngineRequest bad = greedy(eng.tokenizer(), "x", 8);
  bad.sampling.top_p = 1.5f;
  auto bp = eng.submit(6, bad, collect(r3));
  ASSERT_TRUE(bp.has_value());
  EXPECT_EQ(bp->kind, SubmitError::kInvalid);
  EXPECT_NE(bp->message.find("top_p"), std::string::npos);
  eng.wait_idle();
  EXPECT_EQ(used_blocks(eng), 0);
  EXPECT_GE(eng.metrics().admission_refusals, 3);
}

TEST(Engine, CreateSaysWhatKindOfFailure) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  EngineConfig bad = base_config();
  bad.kv.kv.dtype = "int3";
  CreateError kind = CreateError::kModel;
  EXPECT_FALSE(Engine::create(bad, &kind).ok());
  EXPECT_EQ(kind, CreateError::kInvalidConfig);
  EngineConfig missing = base_config();
  missing.model = "/nonexistent/model.gguf";
  EXPECT_FALSE(Engine::create(missing, &kind).ok());
  EXPECT_EQ(kind, CreateError::kModel);
  EngineConfig tiny = base_config();
  tiny.kv.kv_cache_memory = 1 << 20;  // less than one 1024-token sequence
  auto t = Engine::create(tiny, &kind);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(kind, CreateError::kOutOfBudget) << t.error();
}

TEST(Engine, StopStringsEndGenerationBeforeTheMatch) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  auto e = Engine::create(base_config());
  ASSERT_TRUE(e.ok()) << e.error();
  Engine& eng = **e;
  Collected free_run;
  ASSERT_FALSE(eng.submit(1, greedy(eng.tokenizer(), kPrompts[0], 16), collect(free_run)));
  free_run.wait();
  const std::string full = free_run.text;
  ASSERT_GT(full.size(), 6u);
  const std::string stop = full.substr(4, 3);
  EngineRequest r = greedy(eng.tokenizer(), kPrompts[0], 16);
  r.stop = {stop};
  Collected c;
  ASSERT_FALSE(eng.submit(2, r, collect(c)));
  c.wait();
  EXPECT_EQ(c.finish->finish_reason, "stop");
  EXPECT_EQ(c.text, full.substr(0, full.find(stop)));
}

TEST(Engine, ShutdownFinishesRunningRequests) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  auto e = Engine::create(base_config());
  ASSERT_TRUE(e.ok()) << e.error();
  Engine& eng = **e;
  Collected c;
  ASSERT_FALSE(eng.submit(1, greedy(eng.tokenizer(), kPrompts[0], 8), collect(c)));
  eng.shutdown(true);
  ASSERT_TRUE(c.finish.has_value());
  EXPECT_NE(c.finish->finish_reason, "error");
  auto late = eng.submit(2, greedy(eng.tokenizer(), kPrompts[0], 8), collect(c));
  ASSERT_TRUE(late.has_value());
  EXPECT_EQ(late->kind, SubmitError::kShuttingDown);
}


// ---- prompt logits (teacher-forced scoring, `bie quality`) ----------------------------------

// What one request's on_prompt_logits received: positions in call order, a copy of each row.
struct PromptRows {
  std::vector<int64_t> pos;
  std::vector<std::vector<float>> rows;
};

EngineRequest scored(const tokenizer::Tokenizer& tok, const std::string& text, int max_tokens,
                     int64_t from, PromptRows& out) {
  EngineRequest r = greedy(tok, text, max_tokens);
  r.prompt_logits_from = from;
  r.on_prompt_logits = [&out](int64_t pos, std::span<const float> logits) {
    out.pos.push_back(pos);
    out.rows.emplace_back(logits.begin(), logits.end());
  };
  return r;
}

std::vector<int64_t> iota_positions(int64_t from, int64_t to) {
  std::vector<int64_t> v;
  for (int64_t p = from; p < to; ++p) v.push_back(p);
  return v;
}

const char* kLongPrompt =
    "First Citizen: Before we proceed any further, hear me speak. All: Speak, speak. First "
    "Citizen: You are all resolved rather to die than to famish? All: Resolved. resolved. First "
    "Citizen: First, you know Caius Marcius is chief enemy to the people. All: We know't, we "
    "know't. First Citizen: Let us kill him, and we'll have corn at our own price.";

EngineConfig prompt_logits_config() {
  EngineConfig cfg = base_config();
  cfg.prompt_logits = true;
  cfg.enable_prefix_caching = false;
  return cfg;
}

// Every prompt position from prompt_logits_from comes once, in order, across chunk boundaries;
// the rows do not depend on the chunk size or on the requests batched beside them; the last
// row is the one the first greedy token is sampled from.
TEST(Engine, PromptLogitsComeOncePerPositionAndDoNotDependOnChunksOrBatch) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  EngineConfig cfg = prompt_logits_config();
  cfg.kv.chunked_prefill_size = 32;
  auto e = Engine::create(cfg);
  ASSERT_TRUE(e.ok()) << e.error();
  Engine& eng = **e;
  PromptRows alone;
  EngineRequest req = scored(eng.tokenizer(), kLongPrompt, 4, 20, alone);
  const auto n = static_cast<int64_t>(req.prompt.size());
  ASSERT_GT(n, 2 * cfg.kv.chunked_prefill_size);  // three chunks
  Collected c;
  test::run_to_end(eng, 1, req, c);
  ASSERT_EQ(c.finish->finish_reason, "length") << c.finish->error;
  EXPECT_EQ(alone.pos, iota_positions(20, n));
  const std::vector<float>& last = alone.rows.back();
  EXPECT_EQ(std::max_element(last.begin(), last.end()) - last.begin(), c.tokens[0]);

  // 16-token chunks (12-token steps), beside three other requests.
  cfg.kv.chunked_prefill_size = 16;
  cfg.max_num_batched_tokens = 12;
  auto e2 = Engine::create(cfg);
  ASSERT_TRUE(e2.ok()) << e2.error();
  PromptRows batched;
  std::vector<std::unique_ptr<Collected>> others;
  for (int i = 0; i < 3; ++i) {
    others.push_back(std::make_unique<Collected>());
    ASSERT_FALSE((*e2)->submit(10 + i, greedy((*e2)->tokenizer(), kPrompts[i], 8),
                               collect(*others.back()))
                     .has_value());
  }
  Collected c2;
  test::run_to_end(**e2, 20, scored((*e2)->tokenizer(), kLongPrompt, 4, 20, batched), c2);
  for (auto& o : others) o->wait();
  EXPECT_EQ(batched.pos, alone.pos);
  EXPECT_TRUE(batched.rows == alone.rows) << "rows differ with the chunk size or the batch";
  EXPECT_EQ(c2.tokens, c.tokens);
  (*e2)->wait_idle();
  EXPECT_EQ(used_blocks(**e2), 0);
}

// A preempted request recomputes its prompt; its rows are not given twice.
TEST(Engine, PromptLogitsSurvivePreemptionWithoutRepeats) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  EngineConfig cfg = prompt_logits_config();
  cfg.kv.max_model_len = 128;
  cfg.kv.kv_cache_memory = 20 * 16 * 23040ull;  // as PreemptionUnderATightBudgetLosesNothing
  auto e = Engine::create(cfg);
  ASSERT_TRUE(e.ok()) << e.error();
  Engine& eng = **e;
  std::vector<PromptRows> rows(std::size(kPrompts));
  std::vector<std::unique_ptr<Collected>> cs;
  std::vector<int64_t> n_prompt;
  for (size_t i = 0; i < std::size(kPrompts); ++i) {
    EngineRequest r = scored(eng.tokenizer(), kPrompts[i], 52, 0, rows[i]);
    n_prompt.push_back(static_cast<int64_t>(r.prompt.size()));
    cs.push_back(std::make_unique<Collected>());
    ASSERT_FALSE(eng.submit(200 + i, std::move(r), collect(*cs.back())).has_value());
  }
  for (auto& c : cs) c->wait();
  EXPECT_GT(eng.metrics().preemptions, 0);
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].pos, iota_positions(0, n_prompt[i])) << kPrompts[i];
  }
  eng.wait_idle();
  EXPECT_EQ(used_blocks(eng), 0);
}

TEST(Engine, PromptLogitsNeedAnEngineMadeForThem) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  EngineConfig cfg = prompt_logits_config();
  cfg.enable_prefix_caching = true;
  auto bad = Engine::create(cfg);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("prefix caching off"), std::string::npos) << bad.error();

  auto e = Engine::create(base_config());
  ASSERT_TRUE(e.ok()) << e.error();
  PromptRows rows;
  auto refused = (*e)->submit(1, scored((*e)->tokenizer(), kPrompts[0], 4, 0, rows), {});
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->kind, SubmitError::kInvalid);
  EXPECT_NE(refused->message.find("EngineConfig::prompt_logits"), std::string::npos);

  auto ok = Engine::create(prompt_logits_config());
  ASSERT_TRUE(ok.ok()) << ok.error();
  EngineRequest past = scored((*ok)->tokenizer(), kPrompts[0], 4, 0, rows);
  past.prompt_logits_from = static_cast<int64_t>(past.prompt.size());
  auto r2 = (*ok)->submit(2, past, {});
  ASSERT_TRUE(r2.has_value());
  EXPECT_NE(r2->message.find("prompt_logits_from must be in"), std::string::npos) << r2->message;
  EXPECT_TRUE(rows.pos.empty());
}

}  // namespace
}  // namespace bie
