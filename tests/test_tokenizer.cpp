#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "bie/gguf/gguf_file.h"
#include "bie/tokenizer/stream_decoder.h"
#include "bie/tokenizer/tokenizer.h"
#include "support/gguf_builder.h"
#include "support/paths.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"

namespace bie::tokenizer {
namespace {

using Ids = std::vector<TokenId>;

// ---- tiny byte-level BPE vocabulary --------------------------------------------------------

enum BpeId : TokenId {
  kEot = 0,
  kImStart,
  kToolUd,
  kA,
  kB,
  kC,
  kSpace,
  kAb,
  kAbc,
  kSpA,
  kSpAb,
  kAa,
  kLt,
  kGt,
  kX,
  kXy,
  kYzw,
  kCtlC,
  kCtlCUdB,
  kCount
};

VocabData tiny_bpe_data() {
  VocabData d;
  d.kind = VocabKind::kBpe;
  d.pre_name = "gpt-2";
  d.pre = PreType::kGpt2;
  d.tokens = {"<|endoftext|>",
              "<|im_start|>",
              "<b>",
              "a",
              "b",
              "c",
              "\xc4\xa0" /* Ġ */,
              "ab",
              "abc",
              "\xc4\xa0"
              "a",
              "\xc4\xa0"
              "ab",
              "aa",
              "<",
              ">",
              "x",
              "xy",
              "yzw",
              "<c>",
              "<c><b>"};
  d.types.assign(d.tokens.size(), TokenType::kNormal);
  for (TokenId id : {kEot, kImStart, kXy, kYzw, kCtlC, kCtlCUdB}) d.types[id] = TokenType::kControl;
  d.types[kToolUd] = TokenType::kUserDefined;
  d.merges = {"a b", "ab c", "\xc4\xa0 a", "\xc4\xa0 ab", "a a"};
  d.ids.bos = kImStart;
  d.ids.eos = kEot;
  return d;
}

Tokenizer make(VocabData d) {
  auto v = Vocab::from_data(std::move(d));
  EXPECT_TRUE(v.ok()) << v.error();
  auto t = Tokenizer::from_vocab(std::move(v.value()));
  EXPECT_TRUE(t.ok()) << t.error();
  return std::move(t.value());
}

EncodeOptions special(bool parse) {
  EncodeOptions o;
  o.parse_special = parse;
  return o;
}

TEST(TokenizerBpe, MergesByRankThenLeftmost) {
  const Tokenizer t = make(tiny_bpe_data());
  ASSERT_EQ(kCount, t.n_tokens());
  EXPECT_EQ(t.encode("abc ab"), (Ids{kAbc, kSpAb}));
  EXPECT_EQ(t.encode(" a"), (Ids{kSpA}));
  EXPECT_EQ(t.encode("aaa"), (Ids{kAa, kA}));  // equal ranks: the leftmost pair merges first
  EXPECT_EQ(t.encode("aab"), (Ids{kA, kAb}));  // "a b" (rank 0) beats the earlier "a a" (rank 4)
  EXPECT_EQ(t.encode(""), Ids{});
}

TEST(TokenizerBpe, BytesWithoutTokensAreDropped) {
  // llama.cpp looks each byte of an unknown symbol up on its own and skips misses.
  const Tokenizer t = make(tiny_bpe_data());
  EXPECT_EQ(t.encode("a#b"), (Ids{kA, kB}));
}

TEST(TokenizerBpe, SpecialTokensOnlyWithParseSpecial) {
  const Tokenizer t = make(tiny_bpe_data());
  EXPECT_EQ(t.encode("a<c>b", special(true)), (Ids{kA, kCtlC, kB}));
  EXPECT_EQ(t.encode("a<c>b", special(false)), (Ids{kA, kLt, kC, kGt, kB}));
}

TEST(TokenizerBpe, UserDefinedTokensMatchEvenWithoutParseSpecial) {
  const Tokenizer t = make(tiny_bpe_data());
  EXPECT_EQ(t.encode("a<b>c", special(false)), (Ids{kA, kToolUd, kC}));
  EXPECT_EQ(t.encode("<c><b>", special(true)), (Ids{kCtlCUdB}));
  EXPECT_EQ(t.encode("<c><b>", special(false)), (Ids{kLt, kC, kGt, kToolUd}));
}

TEST(TokenizerBpe, LongerSpecialTokensAreCarvedFirst) {
  // "yzw" is longer than "xy", so it is taken first and the overlapping "xy" never matches;
  // a leftmost scan would have produced "xy" + "zw" instead.
  const Tokenizer t = make(tiny_bpe_data());
  EXPECT_EQ(t.encode("xyzw", special(true)), (Ids{kX, kYzw}));
  const auto frags = t.partition("xyzwxy", true);
  ASSERT_EQ(frags.size(), 3u);
  EXPECT_EQ(frags[0].token, kNoToken);
  EXPECT_EQ(frags[1].token, kYzw);
  EXPECT_EQ(frags[2].token, kXy);
  EXPECT_EQ(frags[2].begin, 4u);
}

TEST(TokenizerBpe, BosEosFollowMetadataAndOverrides) {
  VocabData d = tiny_bpe_data();
  d.add_bos = true;
  d.add_eos = true;
  const Tokenizer t = make(d);
  EXPECT_EQ(t.encode("ab"), (Ids{kImStart, kAb, kEot}));
  EncodeOptions o;
  o.add_special = false;
  EXPECT_EQ(t.encode("ab", o), (Ids{kAb}));
  o.add_special = true;
  o.add_eos = false;
  EXPECT_EQ(t.encode("ab", o), (Ids{kImStart, kAb}));
  o.add_bos = false;
  EXPECT_EQ(t.encode("", o), Ids{});

  const Tokenizer plain = make(tiny_bpe_data());
  EncodeOptions force;
  force.add_bos = true;
  EXPECT_EQ(plain.encode("ab", force), (Ids{kImStart, kAb}));
}

TEST(TokenizerBpe, PiecesAndDecode) {
  const Tokenizer t = make(tiny_bpe_data());
  EXPECT_EQ(t.token_to_piece(kSpAb), " ab");
  EXPECT_EQ(t.token_to_piece(kEot), "");                     // control renders empty...
  EXPECT_EQ(t.token_to_piece(kEot, true), "<|endoftext|>");  // ...unless asked
  EXPECT_EQ(t.token_to_piece(kToolUd), "<b>");               // user-defined always renders
  EXPECT_EQ(t.token_to_piece(-1), "");
  EXPECT_EQ(t.token_to_piece(kCount), "");
  const Ids ids{kImStart, kAbc, kSpAb, kEot};
  EXPECT_EQ(t.decode(ids), "abc ab");
  DecodeOptions render;
  render.render_special = true;
  EXPECT_EQ(t.decode(ids, render), "<|im_start|>abc ab<|endoftext|>");
}

TEST(TokenizerBpe, CleanSpacesLikeLlamaCpp) {
  VocabData d = tiny_bpe_data();
  d.tokens[kX] =
      "\xc4\xa0"
      "x";  // " x"
  d.clean_spaces = true;
  const Tokenizer t = make(d);
  // The pass only drops spaces before ?!., and in contractions; nothing to change here.
  EXPECT_EQ(t.decode(Ids{kA, kX, kSpAb}), "a x ab");
}

TEST(TokenizerBpe, EndOfTurnTextsAreForcedToControl) {
  VocabData d = tiny_bpe_data();
  d.tokens[kX] = "<|im_end|>";
  const Tokenizer t = make(d);
  EXPECT_EQ(t.vocab().type(kX), TokenType::kNormal);  // as the file says
  EXPECT_EQ(t.vocab().attr(kX), kAttrNormal | kAttrControl);
  EXPECT_EQ(t.vocab().ids().eot, kX);
  EXPECT_TRUE(t.is_eog(kX));
  EXPECT_TRUE(t.is_eog(kEot));  // eos
  EXPECT_FALSE(t.is_eog(kA));
}

TEST(TokenizerBpe, CacheDoesNotChangeResults) {
  const Tokenizer t = make(tiny_bpe_data());
  const std::string text = "abc ab aab aaa abc";
  const Ids first = t.encode(text);
  const Ids second = t.encode(text);
  EXPECT_EQ(first, second);
  // " abc": "a b" (0), then "ab c" (1) beats "Ġ ab" (3), leaving "Ġ" + "abc".
  EXPECT_EQ(first, (Ids{kAbc, kSpAb, kSpA, kAb, kSpA, kAa, kSpace, kAbc}));
}

// ---- GGUF loading and errors ---------------------------------------------------------------

std::vector<uint8_t> tiny_gguf(const std::string& model, const std::string& pre) {
  test::GgufBuilder g;
  g.kv_str("general.architecture", "llama");
  g.kv_str("tokenizer.ggml.model", model);
  g.kv_str("tokenizer.ggml.pre", pre);
  g.kv_str_array("tokenizer.ggml.tokens", {"<s>", "a", "b", "ab"});
  g.kv_i32_array("tokenizer.ggml.token_type", {3, 1, 1, 1});
  g.kv_f32_array("tokenizer.ggml.scores", {0.f, -1.f, -2.f, -0.5f});
  g.kv_str_array("tokenizer.ggml.merges", {"a b"});
  g.kv_u32("tokenizer.ggml.bos_token_id", 0);
  g.kv_u32("tokenizer.ggml.eos_token_id", 0);
  g.kv_bool("tokenizer.ggml.add_bos_token", true);
  return g.build();
}

TEST(TokenizerGguf, LoadsBpeFromGguf) {
  const auto bytes = tiny_gguf("gpt2", "qwen2");
  auto f = gguf::GgufFile::from_memory(bytes.data(), bytes.size());
  ASSERT_TRUE(f.ok()) << f.error();
  auto t = Tokenizer::from_gguf(**f);
  ASSERT_TRUE(t.ok()) << t.error();
  EXPECT_EQ(t->vocab().kind(), VocabKind::kBpe);
  EXPECT_EQ(t->vocab().pre(), PreType::kQwen2);
  EXPECT_TRUE(t->vocab().data().add_bos);
  EXPECT_FALSE(t->vocab().data().clean_spaces);  // qwen2 turns it off
  EXPECT_EQ(t->encode("ab"), (Ids{0, 3}));
}

TEST(TokenizerGguf, UnknownModelOrPreTokenizerIsAClearError) {
  for (const auto& [model, pre, needle] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"bert", "default", "unsupported tokenizer model 'bert'"},
           {"gpt2", "klingon", "unsupported pre-tokenizer 'klingon'"}}) {
    const auto bytes = tiny_gguf(model, pre);
    auto f = gguf::GgufFile::from_memory(bytes.data(), bytes.size());
    ASSERT_TRUE(f.ok()) << f.error();
    auto t = Tokenizer::from_gguf(**f);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.error().find(needle), std::string::npos) << t.error();
  }
}

TEST(TokenizerGguf, SpmIgnoresPreName) {
  const auto bytes = tiny_gguf("llama", "whatever");
  auto f = gguf::GgufFile::from_memory(bytes.data(), bytes.size());
  ASSERT_TRUE(f.ok()) << f.error();
  auto t = Tokenizer::from_gguf(**f);
  ASSERT_TRUE(t.ok()) << t.error();
  EXPECT_EQ(t->vocab().kind(), VocabKind::kSpm);
  EXPECT_TRUE(t->vocab().data().add_space_prefix);  // SPM default when the key is absent
}

// ---- pre-tokenizer regexes -----------------------------------------------------------------

std::vector<std::string> split(PreType type, std::string_view text) {
  auto pt = PreTokenizer::create(type);
  EXPECT_TRUE(pt.ok()) << pt.error();
  std::string norm;
  std::vector<std::pair<size_t, size_t>> ranges;
  pt->split(text, norm, ranges);
  std::vector<std::string> words;
  for (auto [b, e] : ranges) words.push_back(norm.substr(b, e - b));
  return words;
}

using Words = std::vector<std::string>;

TEST(PreTokenizer, Gpt2) {
  EXPECT_EQ(split(PreType::kGpt2, "Hello world's 1234  x\n\n"),
            (Words{"Hello", " world", "'s", " 1234", " ", " x", "\n\n"}));
  EXPECT_EQ(split(PreType::kGpt2, "a\tb"), (Words{"a", "\t", "b"}));  // unmatched gap kept
  EXPECT_EQ(split(PreType::kGpt2, "I'M"), (Words{"I", "'", "M"}));    // contractions: lower only
}

TEST(PreTokenizer, StarcoderSplitsEveryDigit) {
  EXPECT_EQ(split(PreType::kStarcoder, "abc 1234!"), (Words{"abc", " ", "1", "2", "3", "4", "!"}));
}

TEST(PreTokenizer, Llama3GroupsDigitsByThree) {
  EXPECT_EQ(split(PreType::kLlama3, "x 12345 I'M\r\n\n  y"),
            (Words{"x", " ", "123", "45", " I", "'M", "\r\n\n", " ", " y"}));
}

TEST(PreTokenizer, Qwen2SingleDigits) {
  EXPECT_EQ(split(PreType::kQwen2, "a123"), (Words{"a", "1", "2", "3"}));
}

TEST(PreTokenizer, DefaultSplitsPunctuationAndDigitTriples) {
  EXPECT_EQ(split(PreType::kDefault, "a+=b 12345"), (Words{"a", "+=", "b", " ", "123", "45"}));
}

TEST(PreTokenizer, UnicodeClassesAndWhiteSpace) {
  // U+3000 IDEOGRAPHIC SPACE is White_Space; U+180E is not (PCRE2's \s would say it is).
  EXPECT_EQ(split(PreType::kGpt2, "\xe6\x97\xa5\xe6\x9c\xac \xe3\x80\x80x"),
            (Words{"\xe6\x97\xa5\xe6\x9c\xac", " ", "\xe3\x80\x80", "x"}));
  EXPECT_EQ(split(PreType::kGpt2, "a\xe1\xa0\x8e"), (Words{"a", "\xe1\xa0\x8e"}));
}

TEST(PreTokenizer, MalformedUtf8BecomesReplacementCharacter) {
  EXPECT_EQ(split(PreType::kGpt2,
                  "a\xff"
                  "b"),
            (Words{"a", "\xef\xbf\xbd", "b"}));
}

// ---- tiny SentencePiece vocabulary ---------------------------------------------------------

constexpr TokenId kSpmByte0 = 3;  // <0x00> .. <0xFF> are ids 3..258
enum SpmId : TokenId {
  kSpmUnk = 0,
  kSpmBos = 1,
  kSpmEos = 2,
  kSpmSp = 259,
  kSpmA,
  kSpmB,
  kSpmSpA,
  kSpmAb,
  kSpmSpAb,
  kSpmNewlines
};

VocabData tiny_spm_data(bool add_space_prefix) {
  VocabData d;
  d.kind = VocabKind::kSpm;
  d.tokens = {"<unk>", "<s>", "</s>"};
  d.types = {TokenType::kUnknown, TokenType::kControl, TokenType::kControl};
  d.scores = {0, 0, 0};
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    d.tokens.push_back(std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">");
    d.types.push_back(TokenType::kByte);
    d.scores.push_back(0);
  }
  const std::vector<std::pair<std::string, float>> pieces = {{"\xe2\x96\x81", -1.f},
                                                             {"a", -2.f},
                                                             {"b", -3.f},
                                                             {"\xe2\x96\x81"
                                                              "a",
                                                              -4.f},
                                                             {"ab", -0.5f},
                                                             {"\xe2\x96\x81"
                                                              "ab",
                                                              -0.1f}};
  for (const auto& [text, score] : pieces) {
    d.tokens.push_back(text);
    d.types.push_back(TokenType::kNormal);
    d.scores.push_back(score);
  }
  d.tokens.push_back("\n\n");
  d.types.push_back(TokenType::kUserDefined);
  d.scores.push_back(0);
  d.ids = {kSpmBos, kSpmEos, kNoToken, kNoToken, kSpmUnk, kNoToken, kNoToken};
  d.add_bos = true;
  d.add_space_prefix = add_space_prefix;
  return d;
}

TEST(TokenizerSpm, MergesByScoreWithSpaceEscape) {
  const Tokenizer t = make(tiny_spm_data(false));
  EXPECT_EQ(t.encode("ab"), (Ids{kSpmBos, kSpmAb}));
  EXPECT_EQ(t.encode(" ab"), (Ids{kSpmBos, kSpmSpAb}));  // "ab" (-0.5) first, then "▁ab"
  EXPECT_EQ(t.encode("a a"), (Ids{kSpmBos, kSpmA, kSpmSpA}));
}

TEST(TokenizerSpm, ByteFallback) {
  const Tokenizer t = make(tiny_spm_data(false));
  EncodeOptions o;
  o.add_special = false;
  EXPECT_EQ(t.encode("\xc3\xa9", o), (Ids{kSpmByte0 + 0xC3, kSpmByte0 + 0xA9}));  // é
  EXPECT_EQ(t.decode(t.encode("a\xc3\xa9 b", o)), "a\xc3\xa9 b");
}

TEST(TokenizerSpm, SpacePrefixAfterStartAndSpecialTokens) {
  const Tokenizer t = make(tiny_spm_data(true));
  EXPECT_EQ(t.encode("ab"), (Ids{kSpmBos, kSpmSpAb}));
  EXPECT_EQ(t.encode("ab</s>ab", special(true)), (Ids{kSpmBos, kSpmSpAb, kSpmEos, kSpmSpAb}));
  // A user-defined token ("\n\n") is carved out even without parse_special and also counts.
  EXPECT_EQ(t.encode("ab\n\nab"), (Ids{kSpmBos, kSpmSpAb, kSpmNewlines, kSpmSpAb}));
  // decode drops the prefix space again from the first piece.
  EXPECT_EQ(t.decode(Ids{kSpmSpAb, kSpmSpA}), "ab a");
  DecodeOptions rm;
  rm.remove_special = true;
  EXPECT_EQ(t.decode(Ids{kSpmBos, kSpmSpAb}, rm), " ab");  // llama.cpp keeps it after a BOS
}

// ---- streaming decoder ---------------------------------------------------------------------

TEST(StreamDecoder, HoldsBackSplitCharacters) {
  const Tokenizer t = make(tiny_spm_data(false));
  StreamDecoder s(t);
  EXPECT_EQ(s.push(kSpmA), "a");
  EXPECT_EQ(s.push(kSpmByte0 + 0xF0), "");  // 🤗 = F0 9F A4 97
  EXPECT_EQ(s.push(kSpmByte0 + 0x9F), "");
  EXPECT_EQ(s.push(kSpmByte0 + 0xA4), "");
  EXPECT_EQ(s.pending_bytes(), 3u);
  EXPECT_EQ(s.push(kSpmByte0 + 0x97), "\xf0\x9f\xa4\x97");
  EXPECT_EQ(s.push(kSpmSpA), " a");
  EXPECT_EQ(s.flush(), "");
}

TEST(StreamDecoder, ReplacesInvalidBytes) {
  const Tokenizer t = make(tiny_spm_data(false));
  StreamDecoder s(t);
  EXPECT_EQ(s.push(kSpmByte0 + 0xFF), "\xef\xbf\xbd");  // never valid: replaced at once
  EXPECT_EQ(s.push(kSpmByte0 + 0xE2), "");
  EXPECT_EQ(s.push(kSpmByte0 + 0x82), "");
  EXPECT_EQ(s.push(kSpmA),
            "\xef\xbf\xbd"
            "a");  // E2 82 is one ill-formed subpart
  EXPECT_EQ(s.push(kSpmByte0 + 0xE6), "");
  EXPECT_EQ(s.flush(), "\xef\xbf\xbd");  // unfinished tail at the end
  EXPECT_EQ(s.pending_bytes(), 0u);
}

TEST(StreamDecoder, SkipsControlTokensAndPrefixSpace) {
  const Tokenizer t = make(tiny_spm_data(true));
  StreamDecoder s(t);
  EXPECT_EQ(s.push(kSpmSpAb), "ab");
  EXPECT_EQ(s.push(kSpmEos), "");
  EXPECT_EQ(s.push(kSpmSpA), " a");
}

TEST(Unicode, ClassifySequence) {
  using unicode::classify_sequence;
  EXPECT_EQ(classify_sequence("a"), 1);
  EXPECT_EQ(classify_sequence("\xc3\xa9"), 2);
  EXPECT_EQ(classify_sequence("\xc3"), 0);
  EXPECT_EQ(classify_sequence("\xc0\x80"), -1);          // overlong lead
  EXPECT_EQ(classify_sequence("\xed\xa0\x80"), -1);      // surrogate
  EXPECT_EQ(classify_sequence("\xf4\x90\x80\x80"), -1);  // above U+10FFFF
  EXPECT_EQ(classify_sequence("\xe2\x82"
                              "A"),
            -2);
}

TEST(Unicode, ByteLevelMapIsABijection) {
  for (int b = 0; b < 256; ++b) {
    const auto cpts = unicode::decode_lenient(unicode::byte_to_unicode(static_cast<uint8_t>(b)));
    ASSERT_EQ(cpts.size(), 1u);
    EXPECT_EQ(unicode::unicode_to_byte(cpts[0]), b);
  }
  EXPECT_EQ(unicode::byte_to_unicode(' '), "\xc4\xa0");   // Ġ
  EXPECT_EQ(unicode::byte_to_unicode('\n'), "\xc4\x8a");  // Ċ
}

}  // namespace
}  // namespace bie::tokenizer
