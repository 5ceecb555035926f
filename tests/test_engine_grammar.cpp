// Grammar-constrained sampling wired through the Engine: RequestGrammar on a tiny vocabulary
// (drafts cut at the first token the grammar rejects, on a copy of the state; EOS only where
// the grammar is complete; the forced prefix), then the real engine on the default model (the
// grammar forces valid output where the model alone writes prose; speculative decoding with a
// grammar gives exactly the output without it).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bie/engine/engine.h"
#include "bie/grammar/json_schema.h"
#include "bie/tokenizer/tokenizer.h"
#include "engine/request_grammar.h"
#include "support/engine_collect.h"
#include "support/paths.h"

namespace bie {
namespace {

using grammar::TokenTrie;
using ojson = nlohmann::ordered_json;

// Token ids of the tiny vocabulary.
enum : int32_t { kEos, kOpen, kClose, kQuote, kA, kKeyA, kColon, kOne, kX, kNVocab };

TokenTrie tiny_trie() {
  return TokenTrie({"", "{", "}", "\"", "a", "\"a\"", ":", "1", "x"}, {kEos});
}

std::shared_ptr<const grammar::Grammar> object_with_a() {
  auto g = grammar::compile_json_schema(ojson::parse(
      R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})"));
  EXPECT_TRUE(g.ok()) << g.error();
  return std::make_shared<const grammar::Grammar>(std::move(g).value());
}

TEST(RequestGrammar, DraftsAreCutAtTheFirstRejectedTokenOnACopy) {
  const TokenTrie trie = tiny_trie();
  auto rg = RequestGrammar::create(object_with_a(), trie, "");
  ASSERT_TRUE(rg.ok()) << rg.error();
  RequestGrammar& g = **rg;
  std::vector<int32_t> draft = {kOpen, kKeyA, kColon, kX, kOne};
  g.trim_drafts(draft);
  EXPECT_EQ(draft, (std::vector<int32_t>{kOpen, kKeyA, kColon}));
  // The request's own state did not move: '{' is still the only way in.
  EXPECT_TRUE(g.constraint()->allows(kOpen));
  EXPECT_FALSE(g.constraint()->allows(kKeyA));
  draft = {kX, kOpen};
  g.trim_drafts(draft);
  EXPECT_TRUE(draft.empty());
}

TEST(RequestGrammar, EosOnlyWhereTheGrammarIsComplete) {
  const TokenTrie trie = tiny_trie();
  auto rg = RequestGrammar::create(object_with_a(), trie, "");
  ASSERT_TRUE(rg.ok());
  RequestGrammar& g = **rg;
  for (const int32_t t : {kOpen, kKeyA, kColon, kOne}) {
    EXPECT_FALSE(g.constraint()->allows(kEos)) << "before token " << t;
    ASSERT_TRUE(g.accept(t)) << t;
  }
  EXPECT_FALSE(g.constraint()->allows(kEos));  // {"a":1 is not complete
  std::vector<int32_t> draft = {kEos};
  g.trim_drafts(draft);
  EXPECT_TRUE(draft.empty());
  draft = {kClose, kEos, kX};  // the end, and nothing after it
  g.trim_drafts(draft);
  EXPECT_EQ(draft, (std::vector<int32_t>{kClose, kEos}));
  ASSERT_TRUE(g.accept(kClose));
  EXPECT_TRUE(g.is_complete());
  EXPECT_TRUE(g.constraint()->allows(kEos));
  EXPECT_FALSE(g.constraint()->allows(kOne));
  EXPECT_TRUE(g.accept(kEos));   // a stop token leaves the state as it is
  EXPECT_FALSE(g.accept(kOne));  // rejected: the state is unchanged
  EXPECT_TRUE(g.is_complete());
}

TEST(RequestGrammar, PrefixIsMatchedFirstAndABadOneIsAnError) {
  const TokenTrie trie = tiny_trie();
  auto rg = RequestGrammar::create(object_with_a(), trie, R"({"a":)");
  ASSERT_TRUE(rg.ok()) << rg.error();
  EXPECT_TRUE((*rg)->constraint()->allows(kOne));
  EXPECT_FALSE((*rg)->constraint()->allows(kOpen));
  auto bad = RequestGrammar::create(object_with_a(), trie, R"({"b")");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("rejects"), std::string::npos) << bad.error();
}

// ---- the real engine ------------------------------------------------------------------------

EngineConfig config(int32_t draft_tokens) {
  EngineConfig cfg;
  cfg.model = "default";
  cfg.kv.kv.dtype = "f16";
  cfg.kv.max_model_len = 1024;
  cfg.kv.max_num_seqs = 4;
  cfg.kv.chunked_prefill_size = 64;
  cfg.kv.kv_cache_memory = 128ull << 20;
  cfg.threads = 2;
  cfg.check_integrity = true;
  cfg.speculative_draft_tokens = draft_tokens;
  cfg.speculative_always = draft_tokens > 0;
  return cfg;
}

const char* kSchema = R"({"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Paris", "Lyon", "Nice"]},
    "rank": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["city", "rank"], "additionalProperties": false})";

EngineRequest request(const tokenizer::Tokenizer& tok, const std::string& prompt, bool grammar) {
  EngineRequest r;
  r.prompt = tok.encode(prompt);
  r.sampling.temperature = 0;
  r.max_tokens = 40;
  if (grammar) {
    auto g = grammar::compile_json_schema(ojson::parse(kSchema));
    EXPECT_TRUE(g.ok());
    r.grammar = std::make_shared<const grammar::Grammar>(std::move(g).value());
  }
  return r;
}

void expect_valid(const std::string& text) {
  const auto j = nlohmann::json::parse(text, nullptr, false);
  ASSERT_TRUE(j.is_object()) << text;
  ASSERT_EQ(j.size(), 2u) << text;
  const std::string city = j.at("city").get<std::string>();
  EXPECT_TRUE(city == "Paris" || city == "Lyon" || city == "Nice") << text;
  ASSERT_TRUE(j.at("rank").is_number_integer()) << text;
  EXPECT_GE(j["rank"].get<int>(), 1);
  EXPECT_LE(j["rank"].get<int>(), 9);
}

TEST(EngineGrammar, GrammarForcesValidOutputAndEndsAtCompletion) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  auto e = Engine::create(config(0));
  ASSERT_TRUE(e.ok()) << e.error();
  Engine& eng = **e;
  const std::string prompt = "The most beautiful city in France is";
  test::Collected free, forced;
  test::run_to_end(eng, 1, request(eng.tokenizer(), prompt, false), free);
  // The model alone writes prose (so the grammar below is what makes it JSON).
  EXPECT_FALSE(nlohmann::json::parse(free.text, nullptr, false).is_object()) << free.text;
  test::run_to_end(eng, 2, request(eng.tokenizer(), prompt, true), forced);
  ASSERT_EQ(forced.finish->finish_reason, "stop") << forced.finish->error << " " << forced.text;
  expect_valid(forced.text);
  // It ended on EOS at the grammar's completion, well before max_tokens.
  EXPECT_LT(forced.finish->metrics.generated_tokens, 40);
  EXPECT_TRUE(eng.tokenizer().is_eog(forced.tokens.back()) || forced.text.back() == '}');
}

TEST(EngineGrammar, SpeculativeDraftsUnderAGrammarChangeNothing) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  // The prompt repeats the answer's shape, so the n-gram drafter proposes: some of its drafts
  // follow the grammar, others (the prose after the examples) it rejects.
  std::string prompt;
  for (const char* c : {"Paris", "Lyon", "Nice", "Paris"}) {
    prompt += std::string("Answer: {\"city\": \"") + c + "\", \"rank\": 3}\nMore text here.\n";
  }
  prompt += "Answer:";
  std::string plain_text, spec_text;
  for (const int32_t draft : {0, 3}) {
    auto e = Engine::create(config(draft));
    ASSERT_TRUE(e.ok()) << e.error();
    Engine& eng = **e;
    // Two at once: the grammar works inside a batch.
    test::Collected a, b;
    ASSERT_FALSE(eng.submit(1, request(eng.tokenizer(), prompt, true), test::collect(a)));
    ASSERT_FALSE(eng.submit(2, request(eng.tokenizer(), prompt + " {", false), test::collect(b)));
    a.wait();
    b.wait();
    ASSERT_EQ(a.finish->finish_reason, "stop") << a.finish->error << " " << a.text;
    expect_valid(a.text);
    (draft == 0 ? plain_text : spec_text) = a.text + "|" + b.text;
    if (draft > 0) {
      EXPECT_GT(eng.metrics().draft_tokens, 0);
      EXPECT_GT(a.finish->metrics.draft_tokens, 0);
    }
  }
  EXPECT_EQ(plain_text, spec_text);
}

}  // namespace
}  // namespace bie
