// Lexer: template source -> tokens, with jinja2's whitespace rules applied to the text between
// tags (`-` strips, `+` keeps, trim_blocks eats the newline after a block or comment tag,
// lstrip_blocks eats the indentation before one). Comments are dropped here. Stateless.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "bie/common/result.h"

namespace bie::jinja {

struct SourcePos {
  int32_t line = 1;
  int32_t col = 1;
};

enum class TokenKind : uint8_t {
  kText,        // literal template data, already whitespace-processed
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,        // identifiers and keywords
  kString,      // string literal, escapes resolved
  kInt,
  kFloat,
  kOp,  // operators and punctuation: + - * / // % ** ~ == != < <= > >= = ( ) [ ] { } , . : |
  kEof,
};

struct Token {
  TokenKind kind = TokenKind::kEof;
  std::string text;  // data, name, string value or operator
  int64_t int_value = 0;
  double float_value = 0;
  SourcePos pos;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// Errors carry "line L, column C: ...".
[[nodiscard]] Result<std::vector<Token>> lex(std::string_view source, const LexOptions& opts);

// "line L, column C" for messages.
[[nodiscard]] std::string describe(SourcePos pos);

}  // namespace bie::jinja
