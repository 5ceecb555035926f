// Golden tests: our tokenizer against llama.cpp's, on the corpus in tests/golden/*/tokenizer.json
// (see tests/golden/README.md). Every case must give identical ids with and without special
// parsing and with and without BOS, and identical pieces/detokenized bytes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bie/gguf/gguf_file.h"
#include "bie/tokenizer/tokenizer.h"
#include "support/paths.h"

namespace bie::tokenizer {
namespace {

using Ids = std::vector<TokenId>;
using nlohmann::json;

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

std::string to_hex(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (char c : s) {
    out.push_back(kHex[static_cast<uint8_t>(c) >> 4]);
    out.push_back(kHex[static_cast<uint8_t>(c) & 15]);
  }
  return out;
}

std::string first_difference(const Ids& got, const Ids& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  return "first difference at index " + std::to_string(i) + " (got " +
         (i < got.size() ? std::to_string(got[i]) : "end") + ", want " +
         (i < want.size() ? std::to_string(want[i]) : "end") + "; lengths " +
         std::to_string(got.size()) + " vs " + std::to_string(want.size()) + ")";
}

struct Golden {
  json doc;
  std::unique_ptr<Tokenizer> tok;
};

std::string golden_path(const std::string& dir) {
  return test::source_dir() + "/tests/golden/" + dir + "/tokenizer.json";
}

// The golden file and the model must exist (the tests check with BIE_REQUIRE_FILE first);
// nullptr after a failure to read either.
std::unique_ptr<Golden> load(const std::string& dir, const std::string& model_path) {
  std::ifstream in(golden_path(dir));
  if (!in) {
    ADD_FAILURE() << "cannot read " << golden_path(dir);
    return nullptr;
  }
  auto g = std::make_unique<Golden>();
  g->doc = json::parse(in);
  auto f = gguf::GgufFile::open(model_path);
  if (!f.ok()) {
    ADD_FAILURE() << f.error();
    return nullptr;
  }
  auto t = Tokenizer::from_gguf(**f);
  if (!t.ok()) {
    ADD_FAILURE() << t.error();
    return nullptr;
  }
  g->tok = std::make_unique<Tokenizer>(std::move(t.value()));
  return g;
}

void check_model_header(const Golden& g) {
  const json& m = g.doc.at("model");
  const Tokenizer& t = *g.tok;
  EXPECT_EQ(m.at("n_vocab").get<int>(), t.n_tokens());
  EXPECT_EQ(m.at("bos_id").get<int>(), t.bos());
  EXPECT_EQ(m.at("eos_id").get<int>(), t.eos());
  EXPECT_EQ(m.at("add_bos_token").get<bool>(), t.vocab().data().add_bos);
  EXPECT_EQ(m.at("add_eos_token").get<bool>(), t.vocab().data().add_eos);
  const json& sp = m.at("special_ids");
  const auto id_or_none = [](const json& j) { return j.is_null() ? kNoToken : j.get<TokenId>(); };
  EXPECT_EQ(id_or_none(sp.at("bos")), t.bos());
  EXPECT_EQ(id_or_none(sp.at("eos")), t.eos());
  EXPECT_EQ(id_or_none(sp.at("eot")), t.vocab().ids().eot);
  EXPECT_EQ(id_or_none(sp.at("nl")), t.nl());
  EXPECT_EQ(id_or_none(sp.at("pad")), t.vocab().ids().pad);
  EXPECT_EQ(id_or_none(sp.at("sep")), t.vocab().ids().sep);
  Ids eog = m.at("eog_ids").get<Ids>();
  std::sort(eog.begin(), eog.end());
  EXPECT_EQ(eog, t.vocab().eog_ids());
}

// Compares every field of every case; reports how many cases matched in full.
void check_cases(const Golden& g) {
  const Tokenizer& t = *g.tok;
  const json& cases = g.doc.at("cases");
  ASSERT_GT(cases.size(), 0u);
  size_t n_ok = 0;
  for (const json& c : cases) {
    const std::string name = c.at("name").get<std::string>();
    const std::string text = from_hex(c.at("text_hex").get<std::string>());
    bool ok = true;
    struct Variant {
      const char* field;
      bool add_special, parse_special;
    };
    for (const Variant& v :
         {Variant{"ids_special", false, true}, Variant{"ids_plain", false, false},
          Variant{"ids_bos_special", true, true}, Variant{"ids_bos_plain", true, false}}) {
      EncodeOptions o;
      o.add_special = v.add_special;
      o.parse_special = v.parse_special;
      const Ids got = t.encode(text, o);
      const Ids want = c.at(v.field).get<Ids>();
      if (got != want) {
        ok = false;
        ADD_FAILURE() << name << " " << v.field << ": " << first_difference(got, want);
      }
    }

    const Ids special = c.at("ids_special").get<Ids>();
    const Ids plain = c.at("ids_plain").get<Ids>();
    const auto concat = [&](const Ids& ids, bool render) {
      std::string s;
      for (TokenId id : ids) s += t.token_to_piece(id, render);
      return s;
    };
    const json& pieces = c.at("pieces_special_hex");
    for (size_t i = 0; i < special.size() && i < pieces.size(); ++i) {
      if (to_hex(t.token_to_piece(special[i], true)) != pieces[i].get<std::string>()) {
        ok = false;
        ADD_FAILURE() << name << ": piece of id " << special[i] << " differs";
      }
    }
    const std::pair<std::string, std::string> detok[] = {
        {"detok_hex", concat(special, false)},
        {"detok_special_hex", concat(special, true)},
        {"detok_plain_hex", concat(plain, false)}};
    for (const auto& [field, got] : detok) {
      if (to_hex(got) != c.at(field).get<std::string>()) {
        ok = false;
        ADD_FAILURE() << name << " " << field << " differs";
      }
    }
    // decode() adds nothing to piece concatenation for these vocabularies (no space prefix,
    // no clean-up), so it must give the same bytes.
    if (to_hex(t.decode(special)) != c.at("detok_hex").get<std::string>()) {
      ok = false;
      ADD_FAILURE() << name << ": decode() differs from detok_hex";
    }
    n_ok += ok ? 1 : 0;
  }
  EXPECT_EQ(n_ok, cases.size());
  std::printf("[golden] %zu/%zu cases identical to llama.cpp\n", n_ok, cases.size());
}

TEST(TokenizerGolden, SmolLM2MatchesLlamaCpp) {
  ASSERT_TRUE(std::filesystem::exists(golden_path("smollm2")))
      << golden_path("smollm2") << " missing";
  BIE_REQUIRE_FILE(test::smollm2_path());
  auto g = load("smollm2", test::smollm2_path());
  ASSERT_NE(g, nullptr);
  check_model_header(*g);
  check_cases(*g);
}

TEST(TokenizerGolden, Gemma3MatchesLlamaCpp) {
  ASSERT_TRUE(std::filesystem::exists(golden_path("gemma3")))
      << golden_path("gemma3") << " missing";
  BIE_REQUIRE_FILE(test::gemma3_path());
  auto g = load("gemma3", test::gemma3_path());
  ASSERT_NE(g, nullptr);
  check_model_header(*g);
  check_cases(*g);
}

// Qwen2.5-Coder (BPE `gpt2`, pre `qwen2`, 151,936 ids): the real-size models' tokenizer.
class TokenizerGoldenQwen : public ::testing::TestWithParam<const char*> {};

TEST_P(TokenizerGoldenQwen, MatchesLlamaCpp) {
  const std::string name = GetParam();
  ASSERT_TRUE(std::filesystem::exists(golden_path(name))) << golden_path(name) << " missing";
  BIE_REQUIRE_FILE(test::golden_model_path(name));
  auto g = load(name, test::golden_model_path(name));
  ASSERT_NE(g, nullptr);
  check_model_header(*g);
  check_cases(*g);
}

INSTANTIATE_TEST_SUITE_P(Golden, TokenizerGoldenQwen,
                         ::testing::Values("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           std::string s = i.param;
                           for (char& c : s) {
                             if (c == '.' || c == '-') c = '_';
                           }
                           return s;
                         });

}  // namespace
}  // namespace bie::tokenizer
