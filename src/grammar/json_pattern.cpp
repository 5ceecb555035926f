#include "bie/grammar/json_pattern.h"

#include <fmt/format.h>

#include <cctype>
#include <optional>

namespace bie::grammar {
namespace {

void add(ByteSet& s, unsigned b) {
  s[b >> 6] |= uint64_t{1} << (b & 63);
}
bool has(const ByteSet& s, unsigned b) {
  return (s[b >> 6] >> (b & 63)) & 1u;
}
void add_range(ByteSet& s, unsigned lo, unsigned hi) {
  for (unsigned b = lo; b <= hi; ++b) add(s, b);
}
// Complement within ASCII.
ByteSet ascii_complement(const ByteSet& s) {
  ByteSet out{};
  for (unsigned b = 0; b < 0x80; ++b) {
    if (!has(s, b)) add(out, b);
  }
  return out;
}

}  // namespace

PatternCompiler::PatternCompiler(Grammar& grammar, Grammar::Sym multibyte)
    : g_(grammar), multibyte_(multibyte) {}

bool PatternCompiler::fail(std::string message) {
  if (error_.empty()) error_ = std::move(message);
  return false;
}

Result<Grammar::Seq> PatternCompiler::compile(std::string_view pattern) {
  p_ = pattern;
  pos_ = 0;
  const bool anchored_start = !at_end() && peek() == '^';
  if (anchored_start) ++pos_;
  const auto body = alternation(0);
  if (!body) return Error{error_};
  if (!at_end()) return Error{fmt::format("unbalanced ')' at offset {}", pos_)};
  if (top_level_alternation_ && (anchored_start || anchored_end_)) {
    // ECMA binds anchors per branch ("^a|b$" is "(^a)|(b$)"); ask for the unambiguous form.
    return Error{"anchors around a top-level '|' are ambiguous; write ^(a|b)$"};
  }
  CharClass any;
  add_range(any.ascii, 0, 0x7F);
  any.non_ascii = true;
  const auto any_char = encode(any);
  Grammar::Seq out;
  if (!anchored_start) out = g_.repeat({*any_char}, 0, -1);
  out.push_back(Grammar::ref(*body));
  if (!anchored_end_) {
    const Grammar::Seq tail = g_.repeat({*any_char}, 0, -1);
    out.insert(out.end(), tail.begin(), tail.end());
  }
  return out;
}

std::optional<uint32_t> PatternCompiler::alternation(int depth) {
  std::vector<Grammar::Seq> alts;
  bool any_nullable = false;
  while (true) {
    bool nullable = false;
    auto seq = sequence(depth, nullable);
    if (!seq) return std::nullopt;
    any_nullable = any_nullable || nullable;
    alts.push_back(std::move(*seq));
    if (at_end() || peek() != '|') break;
    if (depth == 0) top_level_alternation_ = true;
    ++pos_;
  }
  const uint32_t r = g_.add_rule(alts);
  if (any_nullable) nullable_rules_.insert(r);
  return r;
}

std::optional<Grammar::Seq> PatternCompiler::sequence(int depth, bool& nullable) {
  Grammar::Seq seq;
  nullable = true;
  while (!at_end() && peek() != '|' && peek() != ')') {
    if (peek() == '$') {
      if (depth != 0 || pos_ + 1 != p_.size()) {
        fail("'$' is supported only at the end of the pattern");
        return std::nullopt;
      }
      ++pos_;
      anchored_end_ = true;
      break;
    }
    const auto a = atom(depth);
    if (!a) return std::nullopt;
    int64_t min = 1, max = 1;
    if (!quantifier(min, max)) return std::nullopt;
    const bool atom_nullable = a->is_rule && nullable_rules_.contains(a->id);
    if (atom_nullable && (max < 0 || max > 1)) {
      // (a*)* and the like: the matcher would have to expand empty repetitions without end.
      fail(
          "repeating a group that can match the empty string (like (a*)*) is not supported; "
          "repeat its non-empty form, e.g. (a+)*");
      return std::nullopt;
    }
    nullable = nullable && (min == 0 || atom_nullable);
    const Grammar::Seq rep = g_.repeat({*a}, min, max);
    seq.insert(seq.end(), rep.begin(), rep.end());
    if (g_.n_elems() > Grammar::kMaxElems) {
      fail("the pattern expands to too large a grammar");
      return std::nullopt;
    }
  }
  return seq;
}

bool PatternCompiler::quantifier(int64_t& min, int64_t& max) {
  if (at_end()) return true;
  const char c = peek();
  if (c == '*' || c == '+' || c == '?') {
    min = c == '+' ? 1 : 0;
    max = c == '?' ? 1 : -1;
    ++pos_;
  } else if (c == '{') {
    const auto number = [&](int64_t& v) {
      if (at_end() || !std::isdigit(static_cast<unsigned char>(peek()))) return false;
      v = 0;
      while (!at_end() && std::isdigit(static_cast<unsigned char>(peek()))) {
        v = std::min<int64_t>(v * 10 + (peek() - '0'), kMaxCount + 1);
        ++pos_;
      }
      return true;
    };
    ++pos_;
    if (!number(min)) return fail("'{' must start a quantifier {n}, {n,} or {n,m}");
    max = min;
    if (!at_end() && peek() == ',') {
      ++pos_;
      if (!number(max)) max = -1;
    }
    if (at_end() || peek() != '}') return fail("unterminated quantifier '{'");
    ++pos_;
    if (min > kMaxCount || max > kMaxCount) {
      return fail(fmt::format("quantifier bounds above {} are not supported", kMaxCount));
    }
    if (max >= 0 && min > max) return fail("quantifier {n,m} with n > m");
  } else {
    return true;
  }
  if (!at_end() && peek() == '?') ++pos_;  // lazy: the same language
  if (!at_end() && (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{')) {
    return fail("a quantifier cannot follow a quantifier");
  }
  return true;
}

std::optional<Grammar::Sym> PatternCompiler::atom(int depth) {
  const char c = peek();
  const auto ch = static_cast<unsigned char>(c);
  if (c == '(') {
    ++pos_;
    if (p_.substr(pos_, 2) == "?:") {
      pos_ += 2;
    } else if (!at_end() && peek() == '?') {
      fail("lookaround and named groups '(?' are not supported");
      return std::nullopt;
    }
    if (depth + 1 > kMaxGroupDepth) {
      fail(fmt::format("groups nest deeper than {}", kMaxGroupDepth));
      return std::nullopt;
    }
    const auto r = alternation(depth + 1);
    if (!r) return std::nullopt;
    if (at_end() || peek() != ')') {
      fail("unbalanced '('");
      return std::nullopt;
    }
    ++pos_;
    return Grammar::ref(*r);
  }
  if (c == '*' || c == '+' || c == '?' || c == '{') {
    fail(fmt::format("nothing to repeat before '{}'", c));
    return std::nullopt;
  }
  if (c == '^') {
    fail("'^' is supported only at the start of the pattern");
    return std::nullopt;
  }
  std::optional<CharClass> cls;
  if (c == '[') {
    ++pos_;
    cls = bracket();
  } else if (c == '\\') {
    ++pos_;
    cls = escape();
  } else if (c == '.') {
    ++pos_;
    cls = CharClass{};
    add_range(cls->ascii, 0, 0x7F);
    cls->ascii[0] &= ~((uint64_t{1} << '\n') | (uint64_t{1} << '\r'));
    cls->non_ascii = true;
  } else if (ch >= 0x80) {
    // A non-ASCII literal: its UTF-8 bytes as they are.
    size_t n = 1;
    while (pos_ + n < p_.size() && (static_cast<unsigned char>(p_[pos_ + n]) & 0xC0) == 0x80) ++n;
    const Grammar::Seq bytes = g_.literal(p_.substr(pos_, n));
    pos_ += n;
    return Grammar::ref(g_.add_rule({bytes}));
  } else {
    ++pos_;
    cls = CharClass{};
    add(cls->ascii, ch);
  }
  if (!cls) return std::nullopt;
  return encode(*cls);
}

std::optional<PatternCompiler::CharClass> PatternCompiler::escape() {
  if (at_end()) {
    fail("the pattern ends with '\\'");
    return std::nullopt;
  }
  const char e = p_[pos_++];
  CharClass c;
  switch (e) {
    case 'd':
    case 'D':
      add_range(c.ascii, '0', '9');
      break;
    case 'w':
    case 'W':
      add_range(c.ascii, 'a', 'z');
      add_range(c.ascii, 'A', 'Z');
      add_range(c.ascii, '0', '9');
      add(c.ascii, '_');
      break;
    case 's':
    case 'S':
      for (unsigned b : {' ', '\t', '\n', '\r', '\f', '\v'}) add(c.ascii, b);
      break;
    case 'n':
      add(c.ascii, '\n');
      return c;
    case 't':
      add(c.ascii, '\t');
      return c;
    case 'r':
      add(c.ascii, '\r');
      return c;
    case 'f':
      add(c.ascii, '\f');
      return c;
    case 'v':
      add(c.ascii, '\v');
      return c;
    default:
      if (std::isalnum(static_cast<unsigned char>(e)) || static_cast<unsigned char>(e) >= 0x80) {
        fail(fmt::format("regex escape '\\{}' is not supported", e));
        return std::nullopt;
      }
      add(c.ascii, static_cast<unsigned char>(e));  // escaped punctuation: itself
      return c;
  }
  if (std::isupper(static_cast<unsigned char>(e))) {
    c.ascii = ascii_complement(c.ascii);
    c.non_ascii = true;
  }
  return c;
}

std::optional<PatternCompiler::CharClass> PatternCompiler::bracket() {
  CharClass c;
  const bool negate = !at_end() && peek() == '^';
  if (negate) ++pos_;
  bool first = true;
  while (true) {
    if (at_end()) {
      fail("unterminated '['");
      return std::nullopt;
    }
    if (peek() == ']' && !first) {
      ++pos_;
      break;
    }
    first = false;
    const auto ch = static_cast<unsigned char>(peek());
    if (ch >= 0x80) {
      fail("non-ASCII characters inside [...] are not supported");
      return std::nullopt;
    }
    if (ch == '\\') {
      ++pos_;
      const auto e = escape();
      if (!e) return std::nullopt;
      for (unsigned b = 0; b < 0x80; ++b) {
        if (has(e->ascii, b)) add(c.ascii, b);
      }
      c.non_ascii = c.non_ascii || e->non_ascii;
      continue;
    }
    ++pos_;
    unsigned hi = ch;
    if (pos_ + 1 < p_.size() && peek() == '-' && p_[pos_ + 1] != ']') {
      const auto end = static_cast<unsigned char>(p_[pos_ + 1]);
      if (end == '\\' || end >= 0x80 || end < ch) {
        fail("a range in [...] must run between two plain ASCII characters, low to high");
        return std::nullopt;
      }
      hi = end;
      pos_ += 2;
    }
    add_range(c.ascii, ch, hi);
  }
  if (negate) {
    c.ascii = ascii_complement(c.ascii);
    c.non_ascii = !c.non_ascii;
  }
  return c;
}

// The ways a decoded character class is written inside a JSON string: printable ASCII as
// itself, '"' and '\\' and control characters as escapes, the rest as UTF-8.
std::optional<Grammar::Sym> PatternCompiler::encode(const CharClass& c) {
  std::vector<Grammar::Seq> alts;
  ByteSet raw{};
  bool any_raw = false;
  for (unsigned b = 0x20; b < 0x80; ++b) {
    if (has(c.ascii, b) && b != '"' && b != '\\') {
      add(raw, b);
      any_raw = true;
    }
  }
  if (any_raw) alts.push_back({g_.byte_set(raw)});
  if (has(c.ascii, '"')) alts.push_back(g_.literal("\\\""));
  if (has(c.ascii, '\\')) alts.push_back(g_.literal("\\\\"));
  for (unsigned b = 0; b < 0x20; ++b) {
    if (!has(c.ascii, b)) continue;
    const char* named = b == '\n'   ? "\\n"
                        : b == '\t' ? "\\t"
                        : b == '\r' ? "\\r"
                        : b == '\b' ? "\\b"
                        : b == '\f' ? "\\f"
                                    : nullptr;
    alts.push_back(g_.literal(named ? std::string(named) : fmt::format("\\u{:04x}", b)));
  }
  if (c.non_ascii) alts.push_back({multibyte_});
  if (alts.empty()) {
    fail("a character class in the pattern matches nothing");
    return std::nullopt;
  }
  if (alts.size() == 1 && alts[0].size() == 1) return alts[0][0];
  return Grammar::ref(g_.add_rule(alts));
}

}  // namespace bie::grammar
