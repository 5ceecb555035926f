// PatternCompiler: a JSON Schema `pattern` (a small subset of ECMA-262 regular expressions) as
// grammar symbols for the body of a JSON string, i.e. the characters as they are written in the
// JSON text, so a '"' in the pattern is generated as \" and a newline as \n. Supported:
// literals, '.', classes [a-z0-9_] and [^...] (ASCII members), \d \w \s \D \W \S, escaped
// punctuation, groups (...) and (?:...), '|', quantifiers * + ? {n} {n,} {n,m} (m <= 1000; lazy
// forms read as greedy: same language), '^' first and '$' last (unanchored ends match any
// characters, as JSON Schema's search semantics). Anything else is an error naming it.
// Builds into a caller's Grammar; not thread-safe (as the Grammar it builds).
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "bie/common/result.h"
#include "bie/grammar/grammar.h"

namespace bie::grammar {

class PatternCompiler {
 public:
  static constexpr int64_t kMaxCount = 1000;  // largest {n,m} bound
  static constexpr int kMaxGroupDepth = 32;

  // `multibyte`: a rule matching one non-ASCII character as UTF-8.
  PatternCompiler(Grammar& grammar, Grammar::Sym multibyte);

  // The string body for `pattern`, or an error naming the construct it does not support.
  [[nodiscard]] Result<Grammar::Seq> compile(std::string_view pattern);

 private:
  struct CharClass {
    ByteSet ascii{};         // decoded ASCII characters 0x00-0x7F
    bool non_ascii = false;  // every character >= U+0080
  };

  bool fail(std::string message);
  [[nodiscard]] bool at_end() const { return pos_ >= p_.size(); }
  [[nodiscard]] char peek() const { return p_[pos_]; }
  std::optional<uint32_t> alternation(int depth);
  // `nullable`: whether the sequence can match the empty string.
  std::optional<Grammar::Seq> sequence(int depth, bool& nullable);
  std::optional<Grammar::Sym> atom(int depth);
  bool quantifier(int64_t& min, int64_t& max);
  std::optional<CharClass> bracket();
  // The escape after a '\\' (pos_ is past the backslash) as a class; the same inside [...].
  std::optional<CharClass> escape();
  std::optional<Grammar::Sym> encode(const CharClass& c);

  Grammar& g_;
  Grammar::Sym multibyte_;
  std::string_view p_;
  size_t pos_ = 0;
  std::set<uint32_t> nullable_rules_;  // groups that can match the empty string
  bool top_level_alternation_ = false;
  bool anchored_end_ = false;
  std::string error_;
};

}  // namespace bie::grammar
