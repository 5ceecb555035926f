#include "template/parser.h"

#include <initializer_list>
#include <string_view>

namespace bie::jinja {

namespace {

constexpr int kMaxNesting = 200;  // expressions and blocks; deeper is an error, not a crash

struct ParseError {
  SourcePos pos;
  std::string message;
};

class Parser {
 public:
  explicit Parser(std::vector<Token> t) : toks_(std::move(t)) {}

  Body parse_template() {
    Body b = parse_body({});
    if (cur().kind != TokenKind::kEof) fail("unexpected tag");
    return b;
  }

 private:
  // ---- token helpers ----
  const Token& cur() const { return toks_[i_]; }
  const Token& peek(size_t n = 1) const { return toks_[std::min(i_ + n, toks_.size() - 1)]; }
  void next() {
    if (i_ + 1 < toks_.size()) ++i_;
  }
  [[noreturn]] void fail(const std::string& msg) const { throw ParseError{cur().pos, msg}; }
  bool is_op(std::string_view op) const { return cur().kind == TokenKind::kOp && cur().text == op; }
  bool is_name(std::string_view n) const {
    return cur().kind == TokenKind::kName && cur().text == n;
  }
  bool accept_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool accept_name(std::string_view n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  void expect_op(std::string_view op) {
    if (!accept_op(op)) fail("expected '" + std::string(op) + "', got " + describe_tok());
  }
  std::string expect_identifier() {
    if (cur().kind != TokenKind::kName) fail("expected a name, got " + describe_tok());
    std::string n = cur().text;
    next();
    return n;
  }
  void expect_block_end() {
    if (cur().kind != TokenKind::kBlockEnd) fail("expected end of tag '%}', got " + describe_tok());
    next();
  }
  std::string describe_tok() const {
    switch (cur().kind) {
      case TokenKind::kEof:
        return "end of template";
      case TokenKind::kBlockEnd:
        return "'%}'";
      case TokenKind::kVarEnd:
        return "'}}'";
      case TokenKind::kString:
        return "a string";
      case TokenKind::kInt:
      case TokenKind::kFloat:
        return "a number";
      case TokenKind::kText:
        return "text";
      default:
        return "'" + cur().text + "'";
    }
  }

  struct Depth {
    explicit Depth(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxNesting) p_.fail("template nested too deeply");
    }
    ~Depth() { --p_.depth_; }
    Parser& p_;
  };

  ExprPtr node(Expr::Kind k, SourcePos pos) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->pos = pos;
    return e;
  }

  // ---- statements ----

  // Parses until a block tag whose name is in `ends` (left unconsumed, positioned on its name).
  Body parse_body(std::initializer_list<std::string_view> ends) {
    Depth d(*this);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.kind == TokenKind::kEof) {
        if (ends.size() > 0) {
          fail("unexpected end of template, expected '{% " + std::string(*ends.begin()) + " %}'");
        }
        return body;
      }
      if (t.kind == TokenKind::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->pos = t.pos;
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.kind == TokenKind::kVarBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->pos = t.pos;
        next();
        s->expr = parse_tuple(true);
        if (cur().kind != TokenKind::kVarEnd)
          fail("expected end of print '}}', got " + describe_tok());
        next();
        body.push_back(std::move(s));
      } else if (t.kind == TokenKind::kBlockBegin) {
        next();
        if (cur().kind != TokenKind::kName) fail("expected a statement name");
        for (std::string_view e : ends) {
          if (cur().text == e) return body;
        }
        StmtPtr s = parse_statement();
        if (s) body.push_back(std::move(s));
      } else {
        fail("unexpected " + describe_tok());
      }
    }
  }

  StmtPtr parse_statement() {
    const Token& t = cur();
    const std::string kw = t.text;
    const SourcePos pos = t.pos;
    auto s = std::make_unique<Stmt>();
    s->pos = pos;
    next();
    if (kw == "if") {
      s->kind = Stmt::Kind::kIf;
      parse_if_rest(*s);
      return s;
    }
    if (kw == "for") {
      s->kind = Stmt::Kind::kFor;
      parse_targets(*s, false);
      if (!accept_name("in")) fail("expected 'in' in for loop, got " + describe_tok());
      s->expr = parse_tuple(false);
      if (accept_name("if")) s->cond = parse_expression(true);
      if (accept_name("recursive")) s->recursive = true;
      expect_block_end();
      ++loop_depth_;
      s->body = parse_body({"endfor", "else"});
      --loop_depth_;
      if (accept_name("else")) {
        expect_block_end();
        s->else_body = parse_body({"endfor"});
      }
      next();  // endfor
      expect_block_end();
      return s;
    }
    if (kw == "set") {
      parse_targets(*s, true);
      if (accept_op("=")) {
        s->kind = Stmt::Kind::kSet;
        s->expr = parse_tuple(true);
        expect_block_end();
        return s;
      }
      if (s->targets.size() != 1 || !s->attr.empty()) fail("a block set takes one plain name");
      s->kind = Stmt::Kind::kSetBlock;
      if (is_op("|")) s->expr = parse_filter_chain(nullptr);
      expect_block_end();
      s->body = parse_body({"endset"});
      next();
      expect_block_end();
      return s;
    }
    if (kw == "macro") {
      s->kind = Stmt::Kind::kMacro;
      s->name = expect_identifier();
      parse_params(*s);
      expect_block_end();
      const int outer_loops = loop_depth_;
      loop_depth_ = 0;  // a loop around a macro's definition does not enclose its body
      s->body = parse_body({"endmacro"});
      loop_depth_ = outer_loops;
      next();
      if (cur().kind == TokenKind::kName) next();  // {% endmacro name %}
      expect_block_end();
      return s;
    }
    if (kw == "call") {
      s->kind = Stmt::Kind::kCallBlock;
      if (is_op("(")) parse_params(*s);
      s->expr = parse_expression(true);
      if (s->expr->kind != Expr::Kind::kCall) fail("expected a call after 'call'");
      expect_block_end();
      s->body = parse_body({"endcall"});
      next();
      expect_block_end();
      return s;
    }
    if (kw == "filter") {
      s->kind = Stmt::Kind::kFilterBlock;
      s->expr = parse_filter_chain(nullptr);
      expect_block_end();
      s->body = parse_body({"endfilter"});
      next();
      expect_block_end();
      return s;
    }
    if (kw == "break" || kw == "continue") {
      if (loop_depth_ == 0) fail("'" + kw + "' outside a for loop");
      s->kind = kw == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      expect_block_end();
      return s;
    }
    if (kw == "generation") {
      // transformers' AssistantTracker tag: marks assistant text; renders its body unchanged.
      expect_block_end();
      Body b = parse_body({"endgeneration"});
      next();
      expect_block_end();
      s->kind = Stmt::Kind::kIf;
      s->expr = node(Expr::Kind::kLiteral, pos);
      s->expr->value = Value(true);
      s->body = std::move(b);
      return s;
    }
    i_ -= 1;
    fail("unknown or unsupported statement '" + kw + "'");
  }

  void parse_if_rest(Stmt& s) {
    s.expr = parse_tuple(false);
    expect_block_end();
    s.body = parse_body({"elif", "else", "endif"});
    if (is_name("elif")) {
      auto e = std::make_unique<Stmt>();
      e->kind = Stmt::Kind::kIf;
      e->pos = cur().pos;
      next();
      parse_if_rest(*e);
      s.else_body.push_back(std::move(e));
      return;  // the nested if consumed endif
    }
    if (accept_name("else")) {
      expect_block_end();
      s.else_body = parse_body({"endif"});
    }
    next();  // endif
    expect_block_end();
  }

  // for-loop / set targets: `a`, `a, b`, `(a, b)`, and for set also `ns.attr`.
  void parse_targets(Stmt& s, bool allow_attr) {
    const bool paren = accept_op("(");
    s.targets.push_back(expect_identifier());
    if (allow_attr && !paren && accept_op(".")) {
      s.attr = expect_identifier();
      return;
    }
    while (accept_op(",")) {
      if (cur().kind != TokenKind::kName) break;
      s.targets.push_back(expect_identifier());
    }
    if (paren) expect_op(")");
  }

  void parse_params(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s.params.empty()) expect_op(",");
      if (is_op(")")) break;
      std::string n = expect_identifier();
      ExprPtr def;
      if (accept_op("=")) def = parse_expression(true);
      s.params.emplace_back(std::move(n), std::move(def));
    }
    next();
  }

  // ---- expressions ----

  // An expression, or a tuple `a, b` (as a list) where the grammar allows one.
  ExprPtr parse_tuple(bool with_condexpr) {
    const SourcePos pos = cur().pos;
    ExprPtr first = parse_expression(with_condexpr);
    if (!is_op(",")) return first;
    auto t = node(Expr::Kind::kList, pos);
    t->name = "tuple";
    t->children.push_back(std::move(first));
    while (accept_op(",")) {
      if (cur().kind == TokenKind::kVarEnd || cur().kind == TokenKind::kBlockEnd || is_op(")")) {
        break;
      }
      t->children.push_back(parse_expression(with_condexpr));
    }
    return t;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    Depth d(*this);
    if (!with_condexpr) return parse_or();
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const SourcePos pos = cur().pos;
      next();
      auto c = node(Expr::Kind::kCond, pos);
      c->children.push_back(parse_or());
      c->children.push_back(std::move(e));
      if (accept_name("else")) {
        c->children.push_back(parse_expression(true));
      } else {
        c->children.push_back(nullptr);
      }
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(std::string op, ExprPtr l, ExprPtr r, SourcePos pos) {
    auto b = node(Expr::Kind::kBinary, pos);
    b->name = std::move(op);
    b->children.push_back(std::move(l));
    b->children.push_back(std::move(r));
    return b;
  }

  ExprPtr parse_or() {
    ExprPtr l = parse_and();
    while (is_name("or")) {
      const SourcePos pos = cur().pos;
      next();
      l = binary("or", std::move(l), parse_and(), pos);
    }
    return l;
  }

  ExprPtr parse_and() {
    ExprPtr l = parse_not();
    while (is_name("and")) {
      const SourcePos pos = cur().pos;
      next();
      l = binary("and", std::move(l), parse_not(), pos);
    }
    return l;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      Depth d(*this);
      auto u = node(Expr::Kind::kUnary, cur().pos);
      next();
      u->name = "not";
      u->children.push_back(parse_not());
      return u;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const SourcePos pos = cur().pos;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().kind == TokenKind::kOp &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().kind == TokenKind::kName && peek().text == "in") {
        op = "notin";
        next();
        next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(Expr::Kind::kCompare, pos);
        cmp->children.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->children.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr parse_math1() {
    ExprPtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = cur().text;
      const SourcePos pos = cur().pos;
      next();
      l = binary(op, std::move(l), parse_concat(), pos);
    }
    return l;
  }

  ExprPtr parse_concat() {
    ExprPtr l = parse_math2();
    while (is_op("~")) {
      const SourcePos pos = cur().pos;
      next();
      l = binary("~", std::move(l), parse_math2(), pos);
    }
    return l;
  }

  ExprPtr parse_math2() {
    ExprPtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = cur().text;
      const SourcePos pos = cur().pos;
      next();
      l = binary(op, std::move(l), parse_pow(), pos);
    }
    return l;
  }

  ExprPtr parse_pow() {
    ExprPtr l = parse_unary(true);
    while (is_op("**")) {
      const SourcePos pos = cur().pos;
      next();
      l = binary("**", std::move(l), parse_unary(true), pos);
    }
    return l;
  }

  ExprPtr parse_unary(bool with_filter) {
    Depth d(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = node(Expr::Kind::kUnary, cur().pos);
      e->name = cur().text;
      next();
      e->children.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    const SourcePos pos = t.pos;
    if (t.kind == TokenKind::kName) {
      auto e = node(Expr::Kind::kLiteral, pos);
      if (t.text == "true" || t.text == "True") {
        e->value = Value(true);
      } else if (t.text == "false" || t.text == "False") {
        e->value = Value(false);
      } else if (t.text == "none" || t.text == "None") {
        e->value = Value::none();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = t.text;
      }
      next();
      return e;
    }
    if (t.kind == TokenKind::kString) {
      std::string s;
      while (cur().kind == TokenKind::kString) {  // adjacent literals concatenate
        s += cur().text;
        next();
      }
      auto e = node(Expr::Kind::kLiteral, pos);
      e->value = Value(std::move(s));
      return e;
    }
    if (t.kind == TokenKind::kInt || t.kind == TokenKind::kFloat) {
      auto e = node(Expr::Kind::kLiteral, pos);
      e->value = t.kind == TokenKind::kInt ? Value(t.int_value) : Value(t.float_value);
      next();
      return e;
    }
    if (accept_op("(")) {
      if (accept_op(")")) {  // ()
        auto empty = node(Expr::Kind::kList, pos);
        empty->name = "tuple";
        return empty;
      }
      ExprPtr first = parse_expression(true);
      if (accept_op(")")) return first;
      auto tup = node(Expr::Kind::kList, pos);
      tup->name = "tuple";
      tup->children.push_back(std::move(first));
      while (accept_op(",")) {
        if (is_op(")")) break;
        tup->children.push_back(parse_expression(true));
      }
      expect_op(")");
      return tup;
    }
    if (accept_op("[")) {
      auto l = node(Expr::Kind::kList, pos);
      while (!is_op("]")) {
        if (!l->children.empty()) expect_op(",");
        if (is_op("]")) break;
        l->children.push_back(parse_expression(true));
      }
      next();
      return l;
    }
    if (accept_op("{")) {
      auto d = node(Expr::Kind::kDict, pos);
      while (!is_op("}")) {
        if (!d->children.empty()) expect_op(",");
        if (is_op("}")) break;
        d->children.push_back(parse_expression(true));
        expect_op(":");
        d->children.push_back(parse_expression(true));
      }
      next();
      return d;
    }
    fail("unexpected " + describe_tok());
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      const SourcePos pos = cur().pos;
      if (accept_op(".")) {
        if (cur().kind == TokenKind::kInt) {
          auto g = node(Expr::Kind::kGetItem, pos);
          g->children.push_back(std::move(e));
          auto idx = node(Expr::Kind::kLiteral, cur().pos);
          idx->value = Value(cur().int_value);
          g->children.push_back(std::move(idx));
          next();
          e = std::move(g);
        } else {
          auto g = node(Expr::Kind::kGetAttr, pos);
          g->name = expect_identifier();
          g->children.push_back(std::move(e));
          e = std::move(g);
        }
      } else if (accept_op("[")) {
        e = parse_subscript(std::move(e), pos);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target, SourcePos pos) {
    Depth d(*this);
    ExprPtr parts[3];
    int colons = 0;
    if (!is_op(":")) parts[0] = parse_expression(true);
    if (is_op(",")) fail("tuple subscripts are not supported");
    while (colons < 2 && accept_op(":")) {
      ++colons;
      if (!is_op(":") && !is_op("]")) parts[colons] = parse_expression(true);
    }
    expect_op("]");
    if (colons == 0) {
      auto g = node(Expr::Kind::kGetItem, pos);
      g->children.push_back(std::move(target));
      g->children.push_back(std::move(parts[0]));
      return g;
    }
    auto s = node(Expr::Kind::kSlice, pos);
    s->children.push_back(std::move(target));
    for (auto& p : parts) s->children.push_back(std::move(p));
    return s;
  }

  void parse_call_args(Expr& call) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
      if (cur().kind == TokenKind::kName && peek().kind == TokenKind::kOp && peek().text == "=") {
        std::string k = cur().text;
        next();
        next();
        call.kwargs.emplace_back(std::move(k), parse_expression(true));
      } else {
        if (!call.kwargs.empty()) fail("positional argument after keyword argument");
        call.children.push_back(parse_expression(true));
      }
    }
    next();
  }

  ExprPtr parse_call(ExprPtr fn) {
    Depth d(*this);
    auto c = node(Expr::Kind::kCall, fn->pos);  // errors point at what is called
    c->children.push_back(std::move(fn));
    parse_call_args(*c);
    return c;
  }

  // `| name(args) | name ...` applied to `input` (null: a filter block's body).
  ExprPtr parse_filter_chain(ExprPtr input) {
    bool first = true;
    while (is_op("|") || (first && input == nullptr)) {
      if (is_op("|")) next();
      first = false;
      const SourcePos pos = cur().pos;
      std::string name = expect_identifier();
      while (accept_op(".")) name += "." + expect_identifier();
      auto f = node(Expr::Kind::kFilter, pos);
      f->name = std::move(name);
      f->children.push_back(std::move(input));
      if (is_op("(")) parse_call_args(*f);
      input = std::move(f);
    }
    return input;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        e = parse_filter_chain(std::move(e));
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_test(ExprPtr e) {
    Depth d(*this);
    auto t = node(Expr::Kind::kTest, cur().pos);
    next();  // is
    if (accept_name("not")) t->negated = true;
    t->name = expect_identifier();
    while (accept_op(".")) t->name += "." + expect_identifier();
    t->children.push_back(std::move(e));
    const Token& c = cur();
    if (is_op("(")) {
      parse_call_args(*t);
    } else if ((c.kind == TokenKind::kName || c.kind == TokenKind::kString ||
                c.kind == TokenKind::kInt || c.kind == TokenKind::kFloat || is_op("[") ||
                is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail("you cannot chain multiple tests with 'is'");
      t->children.push_back(parse_postfix(parse_primary()));
    }
    return t;
  }

  std::vector<Token> toks_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;  // for loops enclosing the statement being parsed
};

}  // namespace

Result<Body> parse(std::vector<Token> tokens) {
  Parser p(std::move(tokens));
  try {
    return p.parse_template();
  } catch (const ParseError& e) {
    return Error{describe(e.pos) + ": " + e.message};
  }
}

}  // namespace bie::jinja
