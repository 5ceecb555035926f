// Speculative decoding: the n-gram drafter, the verification rule (statistically, on a tiny
// vocabulary, with a deliberately wrong verifier that must fail the same test) and, end to end on
// the default model, greedy output byte-identical with and without speculation (n-gram and
// draft-model drafters).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bie/engine/draft_model.h"
#include "bie/engine/drafter.h"
#include "bie/engine/engine.h"
#include "bie/engine/model_path.h"
#include "bie/gguf/gguf_file.h"
#include "bie/sampling/sampler.h"
#include "bie/tokenizer/tokenizer.h"
#include "support/engine_collect.h"
#include "support/paths.h"
#include "support/reference_backend.h"
#include "support/tiny_llama.h"

namespace bie {
namespace {

TEST(NgramDrafter, ProposesWhatFollowedTheMostRecentMatch) {
  NgramDrafter d(3, 1);
  std::vector<int32_t> out;
  // ... 5 6 7 8 9 ... 5 6 7 -> propose 8 9 (the 3-gram 5 6 7 matched)
  const std::vector<int32_t> t = {1, 5, 6, 7, 8, 9, 2, 3, 5, 6, 7};
  d.propose(0, t, 4, out);
  EXPECT_EQ(out, (std::vector<int32_t>{8, 9, 2, 3}));
  d.propose(0, t, 2, out);
  EXPECT_EQ(out, (std::vector<int32_t>{8, 9}));
  // The longest suffix wins over a more recent shorter match; nothing matches -> nothing.
  const std::vector<int32_t> u = {4, 1, 2, 3, 9, 2, 3, 0, 1, 2, 3};
  d.propose(0, u, 3, out);
  EXPECT_EQ(out, (std::vector<int32_t>{9, 2, 3}));
  d.propose(0, std::vector<int32_t>{1, 2, 3, 4}, 3, out);
  EXPECT_TRUE(out.empty());
  d.propose(0, std::vector<int32_t>{7}, 3, out);
  EXPECT_TRUE(out.empty());
}

// G-test of the first emitted token's distribution against the target's, for draws through
// verify() with a draft distribution q that differs from p. `verifier` picks the rule.
double g_statistic(const std::vector<double>& expected_p, const std::vector<int64_t>& counts) {
  int64_t n = 0;
  for (const int64_t c : counts) n += c;
  double g = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] == 0) continue;
    const double e = expected_p[i] * static_cast<double>(n);
    g += 2.0 * static_cast<double>(counts[i]) * std::log(static_cast<double>(counts[i]) / e);
  }
  return g;
}

struct Tiny {
  static constexpr int32_t kVocab = 6;
  std::vector<float> logits = {2.0f, 1.2f, 0.5f, 0.0f, -0.7f, -1.5f};
  // The drafter's distribution: favours token 3, which the target finds unlikely.
  std::vector<TokenProb> q = {{3, 0.6}, {0, 0.2}, {1, 0.1}, {5, 0.1}};
  std::vector<double> target() const {
    std::vector<double> p(kVocab);
    double s = 0;
    for (int i = 0; i < kVocab; ++i)
      s += (p[static_cast<size_t>(i)] = std::exp(logits[static_cast<size_t>(i)]));
    for (double& x : p) x /= s;
    return p;
  }
};

// Returns the G statistic of 40000 emitted tokens. wrong: accept every draft (no correction).
double run_verification(bool wrong) {
  Tiny t;
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 0;
  sp.top_p = 1.0f;
  sp.min_p = 0.0f;
  sp.seed = 1234;
  Sampler sampler(sp, Tiny::kVocab);
  std::mt19937_64 rng(99);
  std::vector<int64_t> counts(Tiny::kVocab, 0);
  for (int it = 0; it < 40000; ++it) {
    // Draw the draft from q, as a draft model would.
    std::uniform_real_distribution<double> u(0, 1);
    double r = u(rng), cum = 0;
    int32_t draft = t.q.back().id;
    for (const TokenProb& x : t.q) {
      cum += x.p;
      if (r < cum) {
        draft = x.id;
        break;
      }
    }
    std::vector<float> l = t.logits;
    const DraftVerdict v = sampler.verify(l.data(), {}, draft, &t.q);
    ++counts[static_cast<size_t>(wrong ? draft : v.token)];
  }
  return g_statistic(t.target(), counts);
}

TEST(SpeculativeVerify, EmittedTokensFollowTheTargetDistribution) {
  // 5 degrees of freedom: the 99.9% quantile of chi-square(5) is 20.5.
  EXPECT_LT(run_verification(false), 20.5);
  EXPECT_GT(run_verification(true), 20.5);  // the test can fail
}

TEST(SpeculativeVerify, DeterministicDrafterAndGreedy) {
  Tiny t;
  SamplingParams greedy;
  greedy.temperature = 0;
  Sampler g(greedy, Tiny::kVocab);
  std::vector<float> l = t.logits;
  EXPECT_EQ(g.verify(l.data(), {}, 0).accepted, true);
  l = t.logits;
  const DraftVerdict v = g.verify(l.data(), {}, 2);
  EXPECT_FALSE(v.accepted);
  EXPECT_EQ(v.token, 0);
  // A one-hot drafter (q = nullptr): first emitted token ~ p.
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 0;
  sp.top_p = 1.0f;
  sp.min_p = 0.0f;
  Sampler s(sp, Tiny::kVocab);
  std::vector<int64_t> counts(Tiny::kVocab, 0);
  for (int it = 0; it < 40000; ++it) {
    l = t.logits;
    ++counts[static_cast<size_t>(s.verify(l.data(), {}, 4).token)];
  }
  EXPECT_LT(g_statistic(t.target(), counts), 20.5);
}

std::vector<int32_t> generate_once(Engine& eng, const std::vector<int32_t>& prompt, int n,
                                   FinishEvent* fin_out = nullptr) {
  EngineRequest r;
  r.prompt = prompt;
  r.sampling.temperature = 0;
  r.max_tokens = n;
  static RequestId id = 1;
  test::Collected c;
  test::run_to_end(eng, id++, r, c);
  EXPECT_NE(c.finish->finish_reason, "refused") << c.finish->error;
  if (fin_out != nullptr) *fin_out = *c.finish;
  return c.tokens;
}

EngineConfig spec_config(int gamma, const char* dtype) {
  EngineConfig cfg;
  cfg.kv.kv.dtype = dtype;
  cfg.kv.max_model_len = 1024;
  cfg.kv.max_num_seqs = 4;
  cfg.kv.chunked_prefill_size = 256;
  cfg.kv.kv_cache_memory = 96ull << 20;
  cfg.threads = 2;
  cfg.check_integrity = true;
  cfg.speculative_draft_tokens = gamma;
  return cfg;
}

// Input-grounded prompts: the answer repeats text from the prompt, so n-grams match.
std::vector<std::string> grounded_prompts() {
  return {
      "<|im_start|>user\nRepeat this list exactly: apples, pears, plums, cherries, grapes, "
      "lemons, limes, oranges, peaches.<|im_end|>\n<|im_start|>assistant\n",
      "<|im_start|>user\nFix the typo in this code and print it again:\ndef add(a, b):\n    "
      "retrun a + b\n\ndef sub(a, b):\n    return a - b\n<|im_end|>\n<|im_start|>assistant\n",
      "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy",
  };
}

// The grounded prompts and one open-ended chat turn (draft-model tests).
std::vector<std::string> draft_model_prompts() {
  std::vector<std::string> prompts = grounded_prompts();
  prompts.push_back(
      "<|im_start|>user\nWrite a short poem about the sea.<|im_end|>\n"
      "<|im_start|>assistant\n");
  return prompts;
}

std::vector<int32_t> encode_special(Engine& eng, const std::string& text) {
  tokenizer::EncodeOptions eo;
  eo.parse_special = true;
  return eng.tokenizer().encode(text, eo);
}

TEST(Speculative, GreedyOutputIdenticalWithAndWithoutNgramDrafts) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  for (const char* dtype : {"f16", "int8"}) {
    auto plain = Engine::create(spec_config(0, dtype));
    auto spec = Engine::create(spec_config(5, dtype));
    ASSERT_TRUE(plain.ok()) << plain.error();
    ASSERT_TRUE(spec.ok()) << spec.error();
    for (const std::string& text : grounded_prompts()) {
      tokenizer::EncodeOptions eo;
      eo.parse_special = true;
      const auto prompt = (*plain)->tokenizer().encode(text, eo);
      FinishEvent fin;
      const auto want = generate_once(**plain, prompt, 48);
      const auto got = generate_once(**spec, prompt, 48, &fin);
      EXPECT_EQ(got, want) << dtype << ": " << text;
      EXPECT_GT(fin.metrics.draft_tokens, 0) << text;
    }
    const EngineMetrics m = (*spec)->metrics();
    EXPECT_GT(m.accepted_tokens, 0) << dtype;
    (*spec)->wait_idle();
    for (const auto& p : (*spec)->metrics().pools) EXPECT_EQ(p.blocks_used, 0) << dtype;
  }
}

TEST(Speculative, BadGammaIsRefused) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  auto e = Engine::create(spec_config(99, "f16"));
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().find("--speculative-draft-tokens"), std::string::npos);
  EngineConfig c = spec_config(5, "int4_asym");
  c.kv.kv.window_tokens = 4;
  auto w = Engine::create(c);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.error().find("--kv-window"), std::string::npos);
}

// The draft model is the default model itself (another quantisation is not shipped): greedy
// outputs must match the plain engine's bit for bit, and nearly every draft is accepted.
TEST(Speculative, GreedyOutputIdenticalWithAndWithoutDraftModel) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  auto path = resolve_model_path("default");
  ASSERT_TRUE(path.ok()) << path.error();
  for (const char* dtype : {"f16", "int8"}) {
    auto plain = Engine::create(spec_config(0, dtype));
    EngineConfig c = spec_config(3, dtype);
    c.speculative_model = *path;
    c.speculative_always = true;  // a draft as slow as the target never pays: force it
    c.speculative_lookup = false;  // the model's drafts only
    auto spec = Engine::create(c);
    ASSERT_TRUE(plain.ok()) << plain.error();
    ASSERT_TRUE(spec.ok()) << spec.error();
    EXPECT_GT((*spec)->kv_report().draft_bytes, (*plain)->kv_report().weights_bytes);
    EXPECT_NE(format_kv_report((*spec)->kv_report()).find("+ draft model"), std::string::npos);
    for (const std::string& text : draft_model_prompts()) {
      const auto prompt = encode_special(**plain, text);
      FinishEvent fin;
      const auto want = generate_once(**plain, prompt, 40);
      const auto got = generate_once(**spec, prompt, 40, &fin);
      EXPECT_EQ(got, want) << dtype << ": " << text;
      EXPECT_GT(fin.metrics.draft_tokens, 0) << text;
    }
    const EngineMetrics m = (*spec)->metrics();
    EXPECT_GT(m.draft_tokens, 0) << dtype;
    EXPECT_GT(static_cast<double>(m.accepted_tokens), 0.8 * static_cast<double>(m.draft_tokens))
        << dtype;
    (*spec)->wait_idle();
    for (const auto& p : (*spec)->metrics().pools) EXPECT_EQ(p.blocks_used, 0) << dtype;
  }
}

// Prompt lookup beside a trimmed draft model (the default model with a 2,000-token head): lookup
// drafts and model drafts both run, every draft id the model proposes is below the trim, and the
// greedy outputs stay the plain engine's.
TEST(Speculative, LookupBesideATrimmedDraftModelKeepsGreedyOutput) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  auto path = resolve_model_path("default");
  ASSERT_TRUE(path.ok()) << path.error();
  auto plain = Engine::create(spec_config(0, "f16"));
  EngineConfig c = spec_config(3, "f16");
  c.speculative_model = *path;
  c.speculative_draft_vocab = 2000;
  c.speculative_always = true;
  auto spec = Engine::create(c);
  ASSERT_TRUE(plain.ok()) << plain.error();
  ASSERT_TRUE(spec.ok()) << spec.error();
  for (const std::string& text : draft_model_prompts()) {
    const auto prompt = encode_special(**plain, text);
    EXPECT_EQ(generate_once(**spec, prompt, 40), generate_once(**plain, prompt, 40)) << text;
  }
  const EngineMetrics m = (*spec)->metrics();
  EXPECT_GT(m.accepted_tokens, 0);
  (*spec)->wait_idle();
  for (const auto& p : (*spec)->metrics().pools) EXPECT_EQ(p.blocks_used, 0);
  EngineConfig bad = c;
  bad.speculative_draft_vocab = -1;
  auto refused = Engine::create(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().find("--speculative-draft-vocab"), std::string::npos);
}

// A trimmed draft (a 300-token head on SmolLM2) proposes ids below the trim or ids of its
// sequence's own text (Model::logits_of): a name copied from the prompt stays draftable. Here the
// untrimmed draft's continuation is all prompt tokens, some above 300, and the trimmed one must
// propose the same.
TEST(Speculative, TrimmedDraftHeadProposesLowIdsAndTheTextsOwn) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  auto file = gguf::GgufFile::open(test::smollm2_path());
  ASSERT_TRUE(file.ok()) << file.error();
  auto tok = tokenizer::Tokenizer::from_gguf(**file);
  ASSERT_TRUE(tok.ok()) << tok.error();
  test::ReferenceBackend be;
  const std::vector<int32_t> prompt =
      tok->encode("The capital of France is Paris. The capital of France is Paris. The capital");
  std::vector<int32_t> untrimmed;
  for (const int32_t trim : {0, 300}) {
    auto d = DraftModelDrafter::create(test::smollm2_path(), tok->vocab(), 256, 64, be, trim);
    ASSERT_TRUE(d.ok()) << d.error();
    EXPECT_EQ((*d)->model().n_logits(), trim == 0 ? tok->vocab().n_tokens() : trim);
    std::vector<int32_t> out;
    (*d)->propose(1, prompt, 4, out);
    ASSERT_EQ(out.size(), 4u);
    for (const int32_t id : out) {
      EXPECT_TRUE(trim == 0 || id < trim ||
                  std::find(prompt.begin(), prompt.end(), id) != prompt.end())
          << id;
    }
    if (trim == 0) {
      untrimmed = out;
      ASSERT_TRUE(std::any_of(out.begin(), out.end(), [](int32_t id) { return id >= 300; }))
          << "the check needs a continuation with ids >= 300";
    } else {
      EXPECT_EQ(out, untrimmed);
    }
  }
}

// Several requests at once share the draft model's cache; the tiny draft cache forces it to
// forget sequences and re-read them, which must not change any output.
TEST(Speculative, DraftModelUnderConcurrencyAndEviction) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  auto path = resolve_model_path("default");
  ASSERT_TRUE(path.ok()) << path.error();
  EngineConfig pc = spec_config(0, "f16");
  pc.kv.max_model_len = 160;
  auto plain = Engine::create(pc);
  EngineConfig c = pc;
  c.speculative_draft_tokens = 3;
  c.speculative_model = *path;
  c.speculative_always = true;
  auto spec = Engine::create(c);
  ASSERT_TRUE(plain.ok()) << plain.error();
  ASSERT_TRUE(spec.ok()) << spec.error();
  const auto prompts = grounded_prompts();
  std::vector<std::vector<int32_t>> want;
  std::vector<std::vector<int32_t>> enc;
  for (const std::string& text : prompts) {
    tokenizer::EncodeOptions eo;
    eo.parse_special = true;
    enc.push_back((*plain)->tokenizer().encode(text, eo));
    want.push_back(generate_once(**plain, enc.back(), 32));
  }
  std::vector<std::vector<int32_t>> got(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back([&, i] { got[i] = generate_once(**spec, enc[i], 32); });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], want[i]) << prompts[i];
}

// The cost model on the step times measured for SmolLM2-135M (docs/serving.md §5): n-gram drafts
// (free) pay at good acceptance and not at poor; a draft model as slow as the target never pays,
// even with every draft accepted; one 10x faster than the target does.
TEST(SpeculativeCostModel, DraftsOnlyWhereTheyPay) {
  const std::vector<double> ms = {0.0, 6.51, 9.45, 12.30, 15.20};
  EXPECT_EQ(best_draft_len(0.9, 1, 3, ms, 0.0), 3);
  EXPECT_EQ(best_draft_len(0.2, 1, 3, ms, 0.0), 0);
  EXPECT_EQ(best_draft_len(1.0, 1, 3, ms, 0.00651), 0);   // draft model = target
  EXPECT_EQ(best_draft_len(0.95, 1, 3, ms, 0.00065), 3);  // 10x faster draft
  EXPECT_EQ(best_draft_len(0.9, 2, 3, ms, 0.0), 2);       // two sequences: verify cap 4
  EXPECT_EQ(best_draft_len(0.9, 4, 3, ms, 0.0), 0);       // no room left
  // Unmeasured step sizes fall back to +44 % per token; the base estimated from a measured one.
  const std::vector<double> only4 = {0.0, 0.0, 0.0, 0.0, 15.20};
  EXPECT_EQ(best_draft_len(1.0, 1, 3, only4, 0.00651), 0);
}

// Unmeasured step sizes between measured ones are interpolated (steps of 1 and 4 measured, 2 and
// 3 not: 2 costs 1 + 2/30 of a base step, not the +44 % guess); past the last measured size the
// guess stays. free_draft_value and best_draft share the scale.
TEST(SpeculativeCostModel, InterpolatesBetweenMeasuredStepSizes) {
  const std::vector<double> ms = {0.0, 10.0, 0.0, 0.0, 12.0};
  EXPECT_DOUBLE_EQ(free_draft_value(0.5, 1, 1, ms), 1.5 / (1.0 + 2.0 / 30.0));
  EXPECT_DOUBLE_EQ(free_draft_value(0.5, 1, 2, ms), 1.75 / (1.0 + 4.0 / 30.0));
  EXPECT_DOUBLE_EQ(free_draft_value(0.5, 1, 3, ms), 1.875 / 1.2);
  const std::vector<double> only1 = {0.0, 10.0, 0.0, 0.0, 0.0};
  EXPECT_DOUBLE_EQ(free_draft_value(0.5, 1, 1, only1), 1.5 / 1.44);
  EXPECT_DOUBLE_EQ(free_draft_value(0.5, 1, 4, ms), 0.0);  // past the verify cap
  // 3 drafts (1.5625) gain less than 2 % over 2 (1.544): the cost model keeps 2.
  const DraftChoice c = best_draft(0.5, 1, 3, ms, 0.0);
  EXPECT_EQ(c.len, 2);
  EXPECT_DOUBLE_EQ(c.value, free_draft_value(0.5, 1, 2, ms));
}

// The draft model's weights are put on the backend when the drafter is made (engine start-up),
// as the target's are: no speculative request pays for it (on the CPU, the repacking).
TEST(Speculative, DraftModelHoldsItsWeightsFromStartUp) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  struct CountingBackend : test::ReferenceBackend {
    int uploads = 0;
    Result<std::unique_ptr<DeviceBuffer>> upload_weights(std::span<const uint8_t> bytes) override {
      ++uploads;
      return test::ReferenceBackend::upload_weights(bytes);
    }
  };
  auto file = gguf::GgufFile::open(test::smollm2_path());
  ASSERT_TRUE(file.ok()) << file.error();
  auto tok = tokenizer::Tokenizer::from_gguf(**file);
  ASSERT_TRUE(tok.ok()) << tok.error();
  CountingBackend be;
  auto d = DraftModelDrafter::create(test::smollm2_path(), tok->vocab(), 256, 64, be);
  ASSERT_TRUE(d.ok()) << d.error();
  EXPECT_EQ(be.uploads, 1);
}

TEST(Speculative, DraftModelWithAnotherVocabularyIsRefused) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  test::TinyLlama t;  // 40 tokens
  test::GgufBuilder g = t.gguf();
  std::vector<std::string> toks;
  for (int i = 0; i < t.n_vocab; ++i) toks.push_back("t" + std::to_string(i));
  g.kv_str("tokenizer.ggml.model", "llama");
  g.kv_str_array("tokenizer.ggml.tokens", toks);
  g.kv_f32_array("tokenizer.ggml.scores", std::vector<float>(toks.size(), 0.0f));
  g.kv_i32_array("tokenizer.ggml.token_type", std::vector<int32_t>(toks.size(), 1));
  const std::string other = std::filesystem::temp_directory_path() / "bie_draft_other_vocab.gguf";
  g.write(other);
  EngineConfig c = spec_config(3, "f16");
  c.speculative_model = other;
  auto e = Engine::create(c);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().find("--speculative-model"), std::string::npos) << e.error();
  EXPECT_NE(e.error().find("vocabulary has 40 tokens"), std::string::npos) << e.error();

  c.speculative_model = "/nonexistent/draft.gguf";
  auto missing = Engine::create(c);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().find("--speculative-model"), std::string::npos) << missing.error();

  auto path = resolve_model_path("default");
  ASSERT_TRUE(path.ok()) << path.error();
  c.speculative_model = *path;
  c.speculative_draft_tokens = 0;
  auto off = Engine::create(c);
  ASSERT_FALSE(off.ok());
  EXPECT_NE(off.error().find("--speculative-draft-tokens"), std::string::npos) << off.error();
}

}  // namespace
}  // namespace bie
