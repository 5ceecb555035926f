// Parser: tokens -> syntax tree, following jinja2's grammar and operator precedence
// (condexpr < or < and < not < comparisons < + - < ~ < * / // % < ** < unary < postfix/filters).
// Nesting is bounded so a hostile template cannot exhaust the stack. Stateless.
#pragma once

#include <vector>

#include "bie/common/result.h"
#include "template/ast.h"
#include "template/lexer.h"

namespace bie::jinja {

// Errors carry "line L, column C: ...".
[[nodiscard]] Result<Body> parse(std::vector<Token> tokens);

}  // namespace bie::jinja
