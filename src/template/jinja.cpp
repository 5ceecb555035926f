#include "bie/template/jinja.h"

#include "template/ast.h"
#include "template/builtins.h"
#include "template/interpreter.h"
#include "template/lexer.h"
#include "template/parser.h"

namespace bie::jinja {

namespace {

// jinja2 resolves filter and test names when it compiles, so an unknown one is a syntax
// error before anything renders; so is it here.
std::optional<Error> check_names(const Expr& e) {
  if (e.kind == Expr::Kind::kFilter && !is_known_filter(e.name)) {
    return Error{describe(e.pos) + ": no filter named '" + e.name + "'"};
  }
  if (e.kind == Expr::Kind::kTest && !is_known_test(e.name)) {
    return Error{describe(e.pos) + ": no test named '" + e.name + "'"};
  }
  for (const ExprPtr& c : e.children) {
    if (c) {
      if (auto err = check_names(*c)) return err;
    }
  }
  for (const auto& [_, c] : e.kwargs) {
    if (auto err = check_names(*c)) return err;
  }
  return std::nullopt;
}

std::optional<Error> check_names(const Body& body) {
  for (const StmtPtr& s : body) {
    for (const Expr* e : {s->expr.get(), s->cond.get()}) {
      if (e != nullptr) {
        if (auto err = check_names(*e)) return err;
      }
    }
    for (const auto& [_, d] : s->params) {
      if (d) {
        if (auto err = check_names(*d)) return err;
      }
    }
    if (auto err = check_names(s->body)) return err;
    if (auto err = check_names(s->else_body)) return err;
  }
  return std::nullopt;
}

}  // namespace

Result<Template> Template::parse(std::string_view source, const TemplateOptions& opts) {
  LexOptions lo;
  lo.trim_blocks = opts.trim_blocks;
  lo.lstrip_blocks = opts.lstrip_blocks;
  lo.keep_trailing_newline = opts.keep_trailing_newline;
  auto toks = lex(source, lo);
  if (!toks.ok()) return Error{toks.error()};
  auto body = jinja::parse(std::move(toks.value()));
  if (!body.ok()) return Error{body.error()};
  if (auto err = check_names(*body)) return *err;
  Template t;
  t.body_ = std::make_shared<const Body>(std::move(body.value()));
  return t;
}

Result<std::string> Template::render(const nlohmann::ordered_json& context,
                                     const RenderOptions& opts) const {
  if (!body_) return Error{"the template was not parsed (use Template::parse)"};
  if (!context.is_object()) return Error{"the template context must be a JSON object"};
  std::tm now{};
  if (opts.now) {
    now = *opts.now;
  } else {
    const std::time_t t = std::time(nullptr);
    localtime_r(&t, &now);
  }
  auto globals = std::make_shared<Scope>();
  add_globals(*globals);
  auto top = std::make_shared<Scope>(Scope{globals, {}});
  for (auto it = context.begin(); it != context.end(); ++it) {
    top->set(it.key(), Value::from_json(it.value()));
  }
  Interpreter in(opts.limits, now);
  std::string out;
  try {
    in.render(*body_, top, out);
  } catch (const RenderError& e) {
    return Error{(e.pos.line > 0 ? describe(e.pos) + ": " : std::string()) + e.message};
  }
  return out;
}

}  // namespace bie::jinja
