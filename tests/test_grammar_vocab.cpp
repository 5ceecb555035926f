// Grammar-constrained sampling over real vocabularies: SmolLM2 with random logits under seven
// schemas (every output must parse and validate), and the mask cost on Qwen2.5's 151,936 tokens
// (a measurement printed by a disabled test, not a timed assertion).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "bie/gguf/gguf_file.h"
#include "bie/grammar/grammar_constraint.h"
#include "bie/grammar/json_schema.h"
#include "bie/grammar/token_trie.h"
#include "bie/sampling/sampler.h"
#include "bie/tokenizer/tokenizer.h"
#include "support/paths.h"

namespace bie::grammar {
namespace {

using json = nlohmann::ordered_json;

// Loads once per process; a missing model is a failure, not a skip.
const tokenizer::Tokenizer* load(const std::string& path) {
  auto f = gguf::GgufFile::open(path);
  if (!f.ok()) {
    ADD_FAILURE() << "cannot open " << path << ": " << f.error();
    return nullptr;
  }
  auto t = tokenizer::Tokenizer::from_gguf(**f);
  if (!t.ok()) {
    ADD_FAILURE() << t.error();
    return nullptr;
  }
  return new tokenizer::Tokenizer(std::move(t.value()));  // lives for the whole test run
}

TokenTrie trie_of(const tokenizer::Tokenizer& tok) {
  std::vector<std::string> pieces(static_cast<size_t>(tok.n_tokens()));
  std::vector<int32_t> stops;
  for (int32_t id = 0; id < tok.n_tokens(); ++id) {
    pieces[id] = std::string(tok.token_to_piece(id, false));
    if (tok.is_eog(id)) stops.push_back(id);
  }
  if (tok.eos() >= 0 && !tok.is_eog(tok.eos())) stops.push_back(tok.eos());
  return TokenTrie(std::move(pieces), std::move(stops));
}

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// A validator for the schema subset the compiler supports; empty string when `v` is valid.
std::string validate(const json& s, const json& v, const json& root) {
  if (s.contains("$ref")) {
    return validate(root.at(json::json_pointer(s["$ref"].get<std::string>().substr(1))), v, root);
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    if (!s.contains(key)) continue;
    int n_ok = 0;
    for (const json& sub : s[key]) n_ok += validate(sub, v, root).empty();
    if (n_ok == 0 || (std::string(key) == "oneOf" && n_ok > 1)) return std::string(key) + " fails";
    return {};
  }
  if (s.contains("const") && v != s["const"]) return "const";
  if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end()) {
    return "enum";
  }
  if (s.contains("type")) {
    const std::string t = s["type"];
    const bool ok = (t == "object" && v.is_object()) || (t == "array" && v.is_array()) ||
                    (t == "string" && v.is_string()) || (t == "integer" && v.is_number_integer()) ||
                    (t == "number" && v.is_number()) || (t == "boolean" && v.is_boolean()) ||
                    (t == "null" && v.is_null());
    if (!ok) return "type " + t + " vs " + v.dump();
  }
  if (v.is_object()) {
    for (const json& r : s.value("required", json::array())) {
      if (!v.contains(r.get<std::string>())) return "missing " + r.get<std::string>();
    }
    const json props = s.value("properties", json::object());
    for (const auto& [k, x] : v.items()) {
      if (!props.contains(k)) {
        if (s.value("additionalProperties", true) == false) return "extra property " + k;
        continue;
      }
      if (std::string e = validate(props[k], x, root); !e.empty()) return k + ": " + e;
    }
  }
  if (v.is_array()) {
    if (v.size() < s.value("minItems", size_t{0})) return "minItems";
    if (v.size() > s.value("maxItems", SIZE_MAX)) return "maxItems";
    if (s.contains("items")) {
      for (const json& x : v) {
        if (std::string e = validate(s["items"], x, root); !e.empty()) return "item: " + e;
      }
    }
  }
  if (v.is_string()) {
    const size_t n = utf8_length(v.get<std::string>());
    if (n < s.value("minLength", size_t{0}) || n > s.value("maxLength", SIZE_MAX)) return "length";
    if (s.contains("pattern") &&
        !std::regex_search(v.get<std::string>(), std::regex(s["pattern"].get<std::string>()))) {
      return "pattern";
    }
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    if (s.contains("minimum") && x < s["minimum"].get<double>()) return "minimum";
    if (s.contains("maximum") && x > s["maximum"].get<double>()) return "maximum";
    if (s.contains("exclusiveMinimum") && x <= s["exclusiveMinimum"].get<double>()) return "exMin";
    if (s.contains("exclusiveMaximum") && x >= s["exclusiveMaximum"].get<double>()) return "exMax";
  }
  return {};
}

TEST(GrammarValidator, RejectsWhatItShould) {  // the checker itself can fail
  const json s = json::parse(R"({"type":"object","properties":{"a":{"type":"integer","maximum":3},
      "b":{"type":"array","items":{"enum":["x"]},"maxItems":1}},"required":["a"],
      "additionalProperties":false})");
  EXPECT_EQ(validate(s, json::parse(R"({"a":3,"b":["x"]})"), s), "");
  EXPECT_NE(validate(s, json::parse(R"({"a":4})"), s), "");
  EXPECT_NE(validate(s, json::parse(R"({"b":[]})"), s), "");
  EXPECT_NE(validate(s, json::parse(R"({"a":1,"b":["x","x"]})"), s), "");
  EXPECT_NE(validate(s, json::parse(R"({"a":1,"b":["y"]})"), s), "");
  EXPECT_NE(validate(s, json::parse(R"({"a":1,"c":0})"), s), "");
  EXPECT_NE(validate(s, json::parse(R"({"a":1.5})"), s), "");
  const json p = json::parse(R"({"type":"string","pattern":"^a\\d$"})");
  EXPECT_EQ(validate(p, "a1", p), "");
  EXPECT_NE(validate(p, "a12", p), "");
}

const char* const kSchemas[] = {
    // nested objects, required/optional, bounded strings, integer bounds
    R"({"type":"object","properties":{
        "name":{"type":"string","minLength":1,"maxLength":12},
        "age":{"type":"integer","minimum":0,"maximum":150},
        "address":{"type":"object","properties":{
            "city":{"type":"string","maxLength":10},"zip":{"type":"string","minLength":5,"maxLength":5}},
          "required":["city"]}},
      "required":["name","age"],"additionalProperties":false})",
    // arrays with bounds, enums
    R"({"type":"object","properties":{
        "tags":{"type":"array","items":{"enum":["red","green","blue"]},"minItems":1,"maxItems":4},
        "scores":{"type":"array","items":{"type":"number","minimum":-1,"maximum":1},"maxItems":3}},
      "required":["tags","scores"]})",
    // numbers, booleans, null, anyOf
    R"({"type":"object","properties":{
        "x":{"type":"number"},"ok":{"type":"boolean"},"none":{"type":"null"},
        "id":{"anyOf":[{"type":"integer","exclusiveMinimum":0},{"type":"string","maxLength":6}]}},
      "required":["x","ok","none","id"]})",
    // $ref to $defs, arrays of objects
    R"({"$defs":{"item":{"type":"object","properties":{
          "sku":{"type":"string","minLength":2,"maxLength":8},"qty":{"type":"integer","minimum":1,"maximum":99}},
        "required":["sku","qty"],"additionalProperties":false}},
      "type":"object","properties":{"items":{"type":"array","items":{"$ref":"#/$defs/item"},"maxItems":3},
        "status":{"const":"open"}},"required":["items","status"]})",
    // a top-level array of enums and bounded strings
    R"({"type":"array","items":{"anyOf":[{"enum":[1,2,3]},{"type":"string","maxLength":4}]},"minItems":2,"maxItems":5})",
    // patterns (checked by std::regex, an independent ECMAScript engine)
    R"({"type":"object","properties":{"code":{"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"},
        "note":{"type":"string","pattern":"^(ok|[a-z ]{1,10}[.!])$"}},"required":["code","note"]})",
    // all optional
    R"({"type":"object","properties":{"a":{"type":"boolean"},"b":{"type":"integer","maximum":-5}}})",
};

TEST(GrammarVocab, SmolLM2RandomLogitsAlwaysValid) {
  static const tokenizer::Tokenizer* tok = load(test::smollm2_path());
  ASSERT_NE(tok, nullptr);
  const TokenTrie trie = trie_of(*tok);
  const int32_t n_vocab = tok->n_tokens();
  ASSERT_FALSE(trie.stop_tokens().empty());
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  int n_runs = 0;
  for (const char* text : kSchemas) {
    const json schema = json::parse(text);
    auto g = compile_json_schema(schema);
    ASSERT_TRUE(g.ok()) << g.error();
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      std::mt19937_64 rng(seed);
      std::normal_distribution<float> normal(0.0f, 3.0f);
      GrammarConstraint c(*g, trie);
      Sampler sampler(greedy, n_vocab);
      std::vector<float> logits(static_cast<size_t>(n_vocab));
      std::vector<int32_t> out;
      bool stopped = false;
      for (int step = 0; step < 200 && !stopped; ++step) {
        for (float& l : logits) l = normal(rng);
        // Stop tokens get a strong pull so the output ends once it can; any step they are
        // not allowed exercises the masked path.
        for (int32_t id : trie.stop_tokens()) logits[id] = 6.0f;
        if (seed == 1 && step % 8 == 0) {  // the cached mask walk agrees with allows()
          std::vector<uint64_t> bits;
          c.compute_mask(bits);
          for (int32_t id = 0; id < n_vocab; ++id) {
            ASSERT_EQ(c.allows(id), static_cast<bool>((bits[id >> 6] >> (id & 63)) & 1u))
                << "token " << id << " at step " << step;
          }
        }
        const int32_t t = sampler.sample(logits.data(), out, &c);
        ASSERT_NE(t, Sampler::kNoConstrainedToken) << "no token allowed at step " << step;
        ASSERT_TRUE(c.accept(t)) << "the sampler returned a token the grammar rejects";
        if (trie.is_stop(t))
          stopped = true;
        else
          out.push_back(t);
      }
      const std::string text_out = tok->decode(out);
      ASSERT_TRUE(stopped) << "no end within 200 tokens: " << text_out;
      json v;
      ASSERT_NO_THROW(v = json::parse(text_out)) << text_out;
      EXPECT_EQ(validate(schema, v, schema), "") << text_out;
      ++n_runs;
    }
  }
  EXPECT_EQ(n_runs, 28);
}

// Mask cost on Qwen2.5 (151,936 tokens): run with --gtest_also_run_disabled_tests.
TEST(GrammarVocab, DISABLED_QwenMaskCost) {
  const std::string path = test::models_dir() + "/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";
  static const tokenizer::Tokenizer* tok = load(path);
  ASSERT_NE(tok, nullptr);
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const TokenTrie trie = trie_of(*tok);
  const double build_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  const json schema = json::parse(kSchemas[0]);
  auto g = compile_json_schema(schema);
  ASSERT_TRUE(g.ok());
  const std::string doc =
      R"({"name": "Ada Lovelace", "age": 36, "address": {"city": "London", "zip": "W1A1A"}})";
  tokenizer::EncodeOptions plain;
  plain.add_special = false;
  const auto ids = tok->encode(doc, plain);
  GrammarConstraint c(*g, trie);
  std::vector<uint64_t> bits;
  double cold_ms = 0, cold_max = 0, warm_ms = 0, warm_max = 0, lazy_us = 0;
  const auto ms_since = [](Clock::time_point a) {
    return std::chrono::duration<double, std::milli>(Clock::now() - a).count();
  };
  for (int32_t id : ids) {
    GrammarConstraint cold(c);  // a copy starts with empty caches
    auto a = Clock::now();
    cold.compute_mask(bits);
    double ms = ms_since(a);
    cold_ms += ms;
    cold_max = std::max(cold_max, ms);
    a = Clock::now();
    c.compute_mask(bits);  // caches kept from earlier steps, as in a request
    ms = ms_since(a);
    warm_ms += ms;
    warm_max = std::max(warm_max, ms);
    a = Clock::now();
    ASSERT_TRUE(c.allows(id));
    lazy_us += ms_since(a) * 1000.0;
    ASSERT_TRUE(c.accept(id));
  }
  const double n = static_cast<double>(ids.size());
  std::printf(
      "Qwen2.5 vocab %d tokens, trie %u nodes built in %.1f ms; %zu steps: full mask cold "
      "%.2f ms/step (max %.2f), with the request's caches %.2f ms/step (max %.2f); lazy "
      "check of the sampled token %.2f us/step\n",
      trie.n_vocab(), trie.n_nodes(), build_ms, ids.size(), cold_ms / n, cold_max, warm_ms / n,
      warm_max, lazy_us / n);
}

}  // namespace
}  // namespace bie::grammar
