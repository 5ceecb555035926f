// Tokenizers of the real model files: metadata, known tokenizations, round trips and streaming.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "bie/gguf/gguf_file.h"
#include "bie/tokenizer/stream_decoder.h"
#include "bie/tokenizer/tokenizer.h"
#include "support/paths.h"
#include "tokenizer/unicode.h"

namespace bie::tokenizer {
namespace {

using Ids = std::vector<TokenId>;

// Loads once per process; nullptr when the model has not been fetched (the tests' REQUIRE_MODEL
// fails then) or after a failure to open or read it (reported here).
const Tokenizer* load(const std::string& path) {
  if (!std::filesystem::exists(path)) return nullptr;
  auto f = gguf::GgufFile::open(path);
  if (!f.ok()) {
    ADD_FAILURE() << path << ": " << f.error();
    return nullptr;
  }
  auto t = Tokenizer::from_gguf(**f);
  if (!t.ok()) {
    ADD_FAILURE() << t.error();
    return nullptr;
  }
  return new Tokenizer(std::move(t.value()));  // lives for the whole test run
}

const Tokenizer* smollm2() {
  static const Tokenizer* t = load(test::smollm2_path());
  return t;
}
const Tokenizer* gemma3() {
  static const Tokenizer* t = load(test::gemma3_path());
  return t;
}

// Fails (or, with BIE_ALLOW_MISSING_MODELS=1, skips) when the model is missing; fails when it
// exists but did not load.
#define REQUIRE_MODEL(t, name)                                                                     \
  do {                                                                                             \
    BIE_REQUIRE_FILE(std::string(name) == "SmolLM2" ? test::smollm2_path() : test::gemma3_path()); \
    ASSERT_NE((t), nullptr) << name << " exists but its tokenizer did not load";                   \
  } while (0)

std::vector<std::string> round_trip_texts() {
  std::vector<std::string> texts = {
      "Hello, world!",
      "  leading and trailing spaces  ",
      "tabs\tand\nnew\r\nlines\n\n\n",
      "Numbers: 3.14159, 1,000,000 and 2024-06-01.",
      "Caf\xc3\xa9 d\xc3\xa9j\xc3\xa0 vu, na\xc3\xafve fa\xc3\xa7"
      "ade",
      "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe6\x96\x87\xe7\xab\xa0\xe3\x80\x82",
      "\xf0\x9f\xa4\x97 \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7 "
      "emoji \xf0\x9f\x9a\x80!",
      "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 \xd0\xbc\xd0\xb8\xd1\x80",  // Привет мир
      "\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7",                                   // مرحبا
      "def f(x):\n    return x ** 2  # comment\n",
      "<|im_start|>user\nnot parsed as special<|im_end|>",
      "I'm, you're, they've, she'll, he'd, it's, O'Neil's",
      "",
  };
  const std::string shakespeare =
      test::read_file(test::source_dir() + "/../shared/data/tinyshakespeare.txt");
  if (!shakespeare.empty()) texts.push_back(shakespeare.substr(0, 20000));
  return texts;
}

TEST(TokenizerSmolLM2, Metadata) {
  const Tokenizer* t = smollm2();
  REQUIRE_MODEL(t, "SmolLM2");
  const Vocab& v = t->vocab();
  EXPECT_EQ(v.kind(), VocabKind::kBpe);
  EXPECT_EQ(v.data().pre_name, "smollm");
  EXPECT_EQ(v.pre(), PreType::kStarcoder);
  EXPECT_EQ(v.n_tokens(), 49152);
  EXPECT_EQ(v.data().merges.size(), 48900u);
  EXPECT_EQ(t->bos(), 1);
  EXPECT_EQ(t->eos(), 2);
  EXPECT_EQ(v.ids().unk, 0);
  EXPECT_EQ(t->nl(), 198);
  EXPECT_FALSE(v.data().add_bos);  // the file says false: no BOS even with add_special
  EXPECT_FALSE(v.data().clean_spaces);
  // llama.cpp takes the first end-of-turn text in its token_to_id iteration order.
  EXPECT_EQ(v.ids().eot, 0);               // <|endoftext|>, not <|im_end|>
  EXPECT_EQ(v.eog_ids(), (Ids{0, 2, 4}));  // + <reponame>, detected as FIM "repo"
  EXPECT_EQ(v.ids().fim_rep, 4);
  EXPECT_EQ(v.special_tokens().size(), 17u);
}

TEST(TokenizerSmolLM2, KnownTokenizations) {
  const Tokenizer* t = smollm2();
  REQUIRE_MODEL(t, "SmolLM2");
  EXPECT_EQ(t->encode("Hello, we can use"), (Ids{19556, 28, 392, 416, 722}));
  EXPECT_EQ(t->encode("The capital of France is"), (Ids{504, 3575, 282, 4649, 314}));
  EXPECT_EQ(t->encode("Hello world! 123"), (Ids{19556, 905, 17, 216, 33, 34, 35}));
  EXPECT_EQ(t->encode("Caf\xc3\xa9 d\xc3\xa9j\xc3\xa0 vu."),
            (Ids{51, 1939, 2756, 32564, 90, 16739, 386, 101, 30}));
  EXPECT_EQ(t->encode("  multiple   spaces"), (Ids{216, 2701, 256, 5600}));
  EXPECT_EQ(t->encode("\n"), (Ids{198}));
}

TEST(TokenizerSmolLM2, ChatMarkersWithAndWithoutSpecialParsing) {
  const Tokenizer* t = smollm2();
  REQUIRE_MODEL(t, "SmolLM2");
  EncodeOptions parse;
  parse.parse_special = true;
  const std::string text = "<|im_start|>user\nHi<|im_end|>\n";
  const Ids with = t->encode(text, parse);
  EXPECT_EQ(with, (Ids{1, 4093, 198, 26843, 2, 198}));
  const Ids without = t->encode(text);
  EXPECT_EQ(std::count(without.begin(), without.end(), 1), 0);
  EXPECT_GT(without.size(), with.size());
  EXPECT_EQ(t->decode(without), text);
  EXPECT_EQ(t->decode(with), "user\nHi\n");
  DecodeOptions render;
  render.render_special = true;
  EXPECT_EQ(t->decode(with, render), text);
}

TEST(TokenizerSmolLM2, RoundTrip) {
  const Tokenizer* t = smollm2();
  REQUIRE_MODEL(t, "SmolLM2");
  for (const std::string& text : round_trip_texts()) {
    EXPECT_EQ(t->decode(t->encode(text)), text) << text.substr(0, 80);
  }
}

TEST(TokenizerSmolLM2, LongWordsMergeTheSameWithAndWithoutCache) {
  const Tokenizer* t = smollm2();
  REQUIRE_MODEL(t, "SmolLM2");
  std::string word;
  for (int i = 0; i < 300; ++i) word += "abra";  // longer than the cached-word limit
  const Ids long_ids = t->encode(word);
  EXPECT_EQ(t->decode(long_ids), word);
  EXPECT_LE(long_ids.size(), word.size() / 2);
  EXPECT_EQ(t->encode(word), long_ids);
}

// Feeds ids one by one: every chunk is valid UTF-8, nothing is lost, and characters split
// across tokens are held back rather than emitted broken.
void check_stream(const Tokenizer& t, const std::string& text, const EncodeOptions& opts) {
  const Ids ids = t.encode(text, opts);
  StreamDecoder s(t);
  std::string out;
  bool held_back = false;
  for (TokenId id : ids) {
    const std::string chunk = s.push(id);
    EXPECT_EQ(unicode::valid_prefix_len(chunk), chunk.size());
    held_back |= s.pending_bytes() > 0;
    out += chunk;
  }
  out += s.flush();
  EXPECT_EQ(out, t.decode(ids));
  EXPECT_TRUE(held_back) << "no token split a character; the test proves nothing";
}

TEST(TokenizerSmolLM2, StreamingEmojiAndCjk) {
  const Tokenizer* t = smollm2();
  REQUIRE_MODEL(t, "SmolLM2");
  const std::string text =
      "\xf0\x9f\xa6\x9c\xf0\x9f\xa7\xac \xe9\xbe\x98\xe9\xbd\x89\xe7\x88\xa9 "
      "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7";
  check_stream(*t, text, {});
}

// SmolLM2's vocabulary under other pre-tokenizers. Expected ids are llama.cpp's (llama-cpp-python
// 0.3.36) for the SmolLM2 file with only tokenizer.ggml.pre rewritten.
Tokenizer smollm2_with_pre(const Tokenizer& base, std::string_view pre) {
  VocabData d = base.vocab().data();
  d.pre_name = std::string(pre);
  d.pre = pre_type_from_name(pre).value();
  d.ignore_merges = pre == "llama-bpe";
  d.ids.eot = kNoToken;  // let detection run again, as at load
  auto v = Vocab::from_data(std::move(d));
  EXPECT_TRUE(v.ok());
  auto t = Tokenizer::from_vocab(std::move(v.value()));
  EXPECT_TRUE(t.ok());
  return std::move(t.value());
}

TEST(TokenizerSmolLM2, OtherPreTokenizersMatchLlamaCpp) {
  const Tokenizer* base = smollm2();
  REQUIRE_MODEL(base, "SmolLM2");
  const std::string newlines = "line1\nline2\r\nline3\n\nline5";
  const std::string code =
      "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n";
  const std::string contractions = "it's don't they're we've I'm you'll he'd";
  const std::string numbers = "-2.5e-10 +6.022e23";
  EncodeOptions plain;
  plain.add_special = false;

  for (std::string_view pre : {"qwen2", "llama-bpe"}) {
    const Tokenizer t = smollm2_with_pre(*base, pre);
    EXPECT_EQ(t.encode(newlines, plain),
              (Ids{1311, 33, 198, 1311, 34, 2738, 1311, 35, 1116, 1311, 37}))
        << pre;
    EXPECT_EQ(t.encode(code, plain),
              (Ids{1604, 3987, 24,  94,   727,  198, 333, 585,  304,  2067, 216, 34,
                   42,   198,  415, 1003, 304,  198, 333, 1003, 3987, 24,   94,  731,
                   216,  33,   25,  1232, 3987, 24,  94,  731,  216,  34,   25,  198}))
        << pre;
    EXPECT_EQ(t.encode(numbers, plain),
              (Ids{29, 34, 30, 37, 85, 29, 33, 32, 1232, 38, 30, 32, 34, 34, 85, 34, 35}))
        << pre;
  }
  const Tokenizer def = smollm2_with_pre(*base, "default");
  EXPECT_EQ(def.encode(newlines, plain),
            (Ids{1311, 33, 198, 1311, 34, 201, 198, 1311, 35, 198, 198, 1311, 37}));
  EXPECT_EQ(def.encode(code, plain),
            (Ids{1604, 3987, 24,   94,  727,  472,  585, 304, 216, 44, 216, 34, 42,
                 448,  1003, 304,  472, 1003, 3987, 24,  94,  216, 29, 216, 33, 25,
                 216,  27,   3987, 24,  94,   216,  29,  216, 34,  25, 198}));
  EXPECT_EQ(def.encode(contractions, plain),
            (Ids{269, 23,  99, 1326, 23,  100, 502, 23,  257, 392, 23,
                 307, 339, 23, 93,   346, 23,  764, 384, 23,  84}));
  EXPECT_EQ(def.encode(numbers, plain),
            (Ids{29, 34, 30, 37, 85, 29, 33, 32, 216, 27, 38, 30, 32, 34, 34, 85, 34, 35}));
}

TEST(TokenizerGemma3, Metadata) {
  const Tokenizer* t = gemma3();
  REQUIRE_MODEL(t, "Gemma 3");
  const Vocab& v = t->vocab();
  EXPECT_EQ(v.kind(), VocabKind::kSpm);
  EXPECT_EQ(v.n_tokens(), 262144);
  EXPECT_EQ(t->bos(), 2);
  EXPECT_EQ(t->eos(), 1);
  EXPECT_EQ(t->nl(), 248);  // <0x0A>, not the user-defined "\n" (107)
  EXPECT_TRUE(v.data().add_bos);
  EXPECT_FALSE(v.data().add_eos);
  EXPECT_FALSE(v.data().add_space_prefix);
  EXPECT_EQ(v.ids().eot, 106);  // <end_of_turn>
  // "</s>" (user-defined in the file) is an end-of-generation text for llama.cpp, which makes
  // it control: no longer carved out of plain text, and rendered empty.
  EXPECT_EQ(v.eog_ids(), (Ids{1, 106, 212}));
  EXPECT_EQ(v.attr(212), kAttrUserDefined | kAttrControl);
  EXPECT_EQ(t->token_to_piece(212), "");
  EXPECT_EQ(v.attr(6) & kAttrUnused, kAttrUnused);  // <unused0>
}

TEST(TokenizerGemma3, KnownTokenizations) {
  const Tokenizer* t = gemma3();
  REQUIRE_MODEL(t, "Gemma 3");
  EXPECT_EQ(t->encode("Hello, world!"), (Ids{2, 9259, 236764, 1902, 236888}));
  EncodeOptions parse;
  parse.parse_special = true;
  EXPECT_EQ(t->encode("<start_of_turn>user\nHi<end_of_turn>\n", parse),
            (Ids{2, 105, 2364, 107, 10979, 106, 107}));
  // "\n" (107) and runs of spaces/newlines are user-defined: carved out before SPM even
  // without special parsing.
  EXPECT_EQ(t->encode("line\n\n\nthree"), (Ids{2, 1257, 109, 19891}));
}

TEST(TokenizerGemma3, RoundTrip) {
  const Tokenizer* t = gemma3();
  REQUIRE_MODEL(t, "Gemma 3");
  DecodeOptions rm;
  rm.remove_special = true;
  for (const std::string& text : round_trip_texts()) {
    EXPECT_EQ(t->decode(t->encode(text), rm), text) << text.substr(0, 80);
  }
}

TEST(TokenizerGemma3, StreamingByteFallback) {
  const Tokenizer* t = gemma3();
  REQUIRE_MODEL(t, "Gemma 3");
  // Rare symbols fall back to <0xXX> byte tokens, one byte per token.
  const std::string text = "\xf0\x9f\xa9\xbb\xf0\x9f\xab\x9f \xf0\x90\x8c\xb0\xf0\x90\x8c\xb1";
  const Ids ids = t->encode(text);
  bool has_byte = false;
  for (TokenId id : ids) has_byte |= t->vocab().type(id) == TokenType::kByte;
  EXPECT_TRUE(has_byte);
  check_stream(*t, text, {});
}

}  // namespace
}  // namespace bie::tokenizer
