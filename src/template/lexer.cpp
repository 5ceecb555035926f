#include "template/lexer.h"

#include <cctype>
#include <cstdlib>

#include "template/utf8.h"

namespace bie::jinja {

std::string describe(SourcePos pos) {
  return "line " + std::to_string(pos.line) + ", column " + std::to_string(pos.col);
}

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// Python's str.rstrip() on ASCII whitespace.
std::string_view rstrip_ws(std::string_view s) {
  size_t n = s.size();
  while (n > 0 && is_space(s[n - 1])) --n;
  return s.substr(0, n);
}

class Lexer {
 public:
  Lexer(std::string src, const LexOptions& o) : src_(std::move(src)), opts_(o) {}

  Result<std::vector<Token>> run() {
    bool line_starting = true;  // jinja2: the previous match ended with a newline
    while (pos_ < src_.size()) {
      const size_t at = next_tag(pos_);
      if (at == std::string::npos) {
        emit_text(src_.substr(pos_), pos_);
        pos_ = src_.size();
        break;
      }
      const char kind = src_[at + 1];  // '{', '%' or '#'
      const char sign = at + 2 < src_.size() ? src_[at + 2] : '\0';
      std::string_view text = std::string_view(src_).substr(pos_, at - pos_);
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+' && opts_.lstrip_blocks && kind != '{') {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
        if (l_pos > 0 || line_starting) {
          const std::string_view tail = text.substr(l_pos);
          bool all_ws = !tail.empty();
          for (char c : tail) all_ws = all_ws && is_space(c);
          if (all_ws) text = text.substr(0, l_pos);
        }
      }
      emit_text(std::string(text), pos_);
      size_t p = at + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        auto r = comment(at, p);
        if (!r.ok()) return Error{r.error()};
        line_starting = *r;
      } else if (kind == '%' && is_raw(p)) {
        auto r = raw(at, p);
        if (!r.ok()) return Error{r.error()};
        line_starting = *r;
      } else {
        toks_.push_back(tok(kind == '{' ? TokenKind::kVarBegin : TokenKind::kBlockBegin, "", at));
        pos_ = p;
        auto r = tag(kind == '{');
        if (!r.ok()) return Error{r.error()};
        line_starting = *r;
      }
    }
    Token eof;
    eof.kind = TokenKind::kEof;
    eof.pos = pos_at(src_.size());
    toks_.push_back(eof);
    return std::move(toks_);
  }

 private:
  size_t next_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  SourcePos pos_at(size_t off) {
    // Positions are asked for in increasing order, so the line count is kept incrementally.
    if (off < line_off_) {
      line_off_ = 0;
      line_ = 1;
      line_start_ = 0;
    }
    for (; line_off_ < off && line_off_ < src_.size(); ++line_off_) {
      if (src_[line_off_] == '\n') {
        ++line_;
        line_start_ = line_off_ + 1;
      }
    }
    return SourcePos{line_, static_cast<int32_t>(off - line_start_ + 1)};
  }

  Token tok(TokenKind k, std::string text, size_t off) {
    Token t;
    t.kind = k;
    t.text = std::move(text);
    t.pos = pos_at(off);
    return t;
  }

  void emit_text(std::string text, size_t off) {
    if (text.empty()) return;
    toks_.push_back(tok(TokenKind::kText, std::move(text), off));
  }

  Error fail(size_t off, const std::string& msg) {
    return Error{describe(pos_at(off)) + ": " + msg};
  }

  // After `%}` or `#}`: trim_blocks eats one newline. After `-%}`: all whitespace.
  // Returns whether the consumed end ended with a newline (jinja2's line_starting).
  bool consume_end(size_t p, size_t delim_len, char sign, bool trims) {
    p += delim_len;
    if (sign == '-') {
      while (p < src_.size() && is_space(src_[p])) ++p;
    } else if (sign != '+' && trims && opts_.trim_blocks && p < src_.size() && src_[p] == '\n') {
      ++p;
    }
    pos_ = p;
    return p > 0 && src_[p - 1] == '\n';
  }

  Result<bool> comment(size_t at, size_t p) {
    const size_t end = src_.find("#}", p);
    if (end == std::string::npos) return fail(at, "missing end of comment tag '#}'");
    char sign = '\0';
    size_t e = end;
    if (end > p && (src_[end - 1] == '-' || src_[end - 1] == '+')) {
      sign = src_[end - 1];
      e = end - 1;
    }
    return consume_end(e, 2 + (sign != '\0' ? 1 : 0), sign, true);
  }

  bool is_raw(size_t p) const {
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (p < src_.size() && src_[p] == '-') ++p;
    return src_.compare(p, 2, "%}") == 0;
  }

  Result<bool> raw(size_t at, size_t p) {
    const size_t close = src_.find("%}", p);
    const bool strip_after = src_[close - 1] == '-';
    size_t body = close + 2;
    if (strip_after) {
      while (body < src_.size() && is_space(src_[body])) ++body;
    }
    // Find `{% endraw %}` with optional signs and spaces.
    for (size_t i = src_.find("{%", body); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t q = i + 2;
      const char sign = q < src_.size() ? src_[q] : '\0';
      if (sign == '-' || sign == '+') ++q;
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && is_space(src_[q])) ++q;
      char esign = '\0';
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) esign = src_[q++];
      if (src_.compare(q, 2, "%}") != 0) continue;
      std::string_view text = std::string_view(src_).substr(body, i - body);
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+' && opts_.lstrip_blocks) {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
        const std::string_view tail = text.substr(l_pos);
        bool all_ws = !tail.empty() && l_pos > 0;
        for (char c : tail) all_ws = all_ws && is_space(c);
        if (all_ws) text = text.substr(0, l_pos);
      }
      emit_text(std::string(text), body);
      return consume_end(q, 2, esign, true);
    }
    return fail(at, "missing end of raw directive '{% endraw %}'");
  }

  // Tokens inside {{ }} or {% %}; returns line_starting after the end delimiter.
  Result<bool> tag(bool is_var) {
    const char* end = is_var ? "}}" : "%}";
    std::vector<char> balance;  // open brackets: an end delimiter inside them is not one
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
      if (pos_ >= src_.size()) {
        return fail(pos_, std::string("unexpected end of template, expected '") + end + "'");
      }
      const size_t p = pos_;
      if (balance.empty()) {
        if (src_.compare(p, 2, end) == 0) {
          toks_.push_back(tok(is_var ? TokenKind::kVarEnd : TokenKind::kBlockEnd, "", p));
          return consume_end(p, 2, '\0', !is_var);
        }
        if ((src_[p] == '-' || (!is_var && src_[p] == '+')) && src_.compare(p + 1, 2, end) == 0) {
          toks_.push_back(tok(is_var ? TokenKind::kVarEnd : TokenKind::kBlockEnd, "", p));
          return consume_end(p, 3, src_[p], !is_var);
        }
      }
      const char c = src_[p];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t q = p;
        while (q < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) {
          ++q;
        }
        toks_.push_back(tok(TokenKind::kName, src_.substr(p, q - p), p));
        pos_ = q;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        if (auto e = number(p); !e.ok()) return Error{e.error()};
      } else if (c == '\'' || c == '"') {
        if (auto e = string_lit(p); !e.ok()) return Error{e.error()};
      } else {
        static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (std::string_view t : kTwo) {
          if (src_.compare(p, 2, t) == 0) op = std::string(t);
        }
        if (op.empty()) {
          if (std::string_view("+-*/%~()[]{}=.:|,<>;").find(c) == std::string_view::npos) {
            return fail(p, std::string("unexpected character '") + c + "'");
          }
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") {
          balance.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
        } else if (op == ")" || op == "]" || op == "}") {
          if (balance.empty() || balance.back() != op[0]) {
            return fail(p, "unexpected '" + op + "'");
          }
          balance.pop_back();
        }
        toks_.push_back(tok(TokenKind::kOp, op, p));
        pos_ = p + op.size();
      }
    }
  }

  Status number(size_t p) {
    size_t q = p;
    auto digits = [&] {
      while (q < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[q])) ||
                                 (src_[q] == '_' && q + 1 < src_.size() &&
                                  std::isdigit(static_cast<unsigned char>(src_[q + 1]))))) {
        ++q;
      }
    };
    digits();
    bool is_float = false;
    if (q + 1 < src_.size() && src_[q] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[q + 1]))) {
      is_float = true;
      ++q;
      digits();
    }
    if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
      size_t r = q + 1;
      if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
      if (r < src_.size() && std::isdigit(static_cast<unsigned char>(src_[r]))) {
        is_float = true;
        q = r;
        digits();
      }
    }
    std::string text;
    for (size_t i = p; i < q; ++i) {
      if (src_[i] != '_') text += src_[i];
    }
    Token t = tok(is_float ? TokenKind::kFloat : TokenKind::kInt, text, p);
    if (is_float) {
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      errno = 0;
      t.int_value = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) return fail(p, "integer literal out of range");
    }
    toks_.push_back(std::move(t));
    pos_ = q;
    return {};
  }

  // Python's unicode-escape decoding, as jinja2 applies to string literals.
  Status string_lit(size_t p) {
    const char quote = src_[p];
    std::string out;
    size_t q = p + 1;
    while (true) {
      if (q >= src_.size()) return fail(p, "unterminated string literal");
      const char c = src_[q];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++q;
        continue;
      }
      if (q + 1 >= src_.size()) return fail(p, "unterminated string literal");
      const char e = src_[q + 1];
      q += 2;
      switch (e) {
        case '\n':
          break;  // line continuation
        case '\\':
        case '\'':
        case '"':
          out += e;
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'v':
          out += '\v';
          break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t i = 0; i < n; ++i) {
            const char h = q + i < src_.size() ? src_[q + i] : '\0';
            if (!std::isxdigit(static_cast<unsigned char>(h))) {
              return fail(q - 2, std::string("truncated \\") + e + " escape in string literal");
            }
            cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h))
                                                     ? h - '0'
                                                     : (std::tolower(h) - 'a' + 10));
          }
          if (cp > 0x10FFFF) return fail(q - 2, "escape outside Unicode in string literal");
          utf8_append(out, cp);
          q += n;
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int i = 0; i < 2 && q < src_.size() && src_[q] >= '0' && src_[q] <= '7'; ++i) {
              cp = cp * 8 + static_cast<uint32_t>(src_[q++] - '0');
            }
            utf8_append(out, cp);
          } else {
            out += '\\';  // Python keeps unknown escapes as written
            out += e;
          }
      }
    }
    toks_.push_back(tok(TokenKind::kString, std::move(out), p));
    pos_ = q + 1;
    return {};
  }

  std::string src_;
  LexOptions opts_;
  size_t pos_ = 0;
  std::vector<Token> toks_;
  size_t line_off_ = 0;
  int32_t line_ = 1;
  size_t line_start_ = 0;
};

// jinja2 reads every newline style as "\n" and drops one trailing newline.
std::string normalize_newlines(std::string_view s, bool keep_trailing) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r') {
      out += '\n';
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      out += s[i];
    }
  }
  if (!keep_trailing && !out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

Result<std::vector<Token>> lex(std::string_view source, const LexOptions& opts) {
  Lexer l(normalize_newlines(source, opts.keep_trailing_newline), opts);
  return l.run();
}

}  // namespace bie::jinja
