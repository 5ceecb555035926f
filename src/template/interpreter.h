// Interpreter: renders a parsed template against a context, with jinja2's semantics for
// scopes (a for-loop iteration and a macro call are scopes; if is not), Undefined (prints as "",
// fails when used as an object or in arithmetic) and Python's operators. One Interpreter per
// render; it owns the output, the step and depth counters and the error position. Not
// thread-safe.
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bie/template/jinja.h"
#include "template/ast.h"
#include "template/value.h"

namespace bie::jinja {

// Thrown inside a render and caught at its top; `pos.line == 0` means "not placed yet" (the
// innermost expression being evaluated places it).
struct RenderError {
  std::string message;
  SourcePos pos{0, 0};
};

// A variable scope; lookups walk the parents.
struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;
  [[nodiscard]] const Value* find(const std::string& name) const;
  void set(const std::string& name, Value v);
};

class Interpreter {
 public:
  Interpreter(RenderLimits limits, const std::tm& now) : limits_(limits), now_(now) {}
  // Namespaces are the only mutable values, so the only way to build a reference cycle
  // (`{% set ns.me = ns %}`); emptying them when the render ends frees such cycles.
  ~Interpreter() {
    for (const std::shared_ptr<Object>& ns : namespaces_) ns->items.clear();
  }
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // note: throws RenderError; Template::render catches it.
  void render(const Body& body, const std::shared_ptr<Scope>& scope, std::string& out);

  // Called by the builtins.
  [[noreturn]] static void fail(const std::string& msg) { throw RenderError{msg, {0, 0}}; }
  // A string of `n` bytes is about to be built.
  void check_size(size_t n) const;
  Value call(const Value& fn, CallArgs& args);
  // jinja2's environment.getattr / getitem (missing -> Undefined; Undefined input -> error).
  Value getattr(const Value& obj, const std::string& name);
  Value getitem(const Value& obj, const Value& key);
  [[nodiscard]] const std::tm& now() const { return now_; }
  void track_namespace(std::shared_ptr<Object> ns) {
    if (namespaces_.size() >= 1'000'000) fail("more than a million namespace() objects");
    namespaces_.push_back(std::move(ns));
  }

 private:
  enum class Flow : uint8_t { kNormal, kBreak, kContinue };

  Flow exec_body(const Body& body, const std::shared_ptr<Scope>& scope, std::string& out);
  Flow exec(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string& out);
  void exec_for(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string& out);
  void exec_set(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string& out);
  Value make_macro(const Stmt& s, const std::shared_ptr<Scope>& scope);
  Value eval(const Expr& e, const std::shared_ptr<Scope>& scope);
  Value eval_inner(const Expr& e, const std::shared_ptr<Scope>& scope);
  Value eval_call(const Expr& e, const std::shared_ptr<Scope>& scope);
  Value eval_binary(const Expr& e, const std::shared_ptr<Scope>& scope);
  bool eval_compare(const Expr& e, const std::shared_ptr<Scope>& scope);
  void eval_args(const Expr& e, size_t first, const std::shared_ptr<Scope>& scope, CallArgs& out);
  void step();
  void append(std::string& out, std::string_view s) const;

  RenderLimits limits_;
  std::tm now_;
  int64_t steps_ = 0;
  int32_t call_depth_ = 0;
  std::vector<std::shared_ptr<Object>> namespaces_;
};

// Python semantics shared by the interpreter and the builtins.
[[nodiscard]] Value binary_op(const std::string& op, const Value& a, const Value& b,
                              const Interpreter& in);
[[nodiscard]] bool compare_op(const std::string& op, const Value& a, const Value& b);
// Elements a for loop / list() sees: list items, dict keys, string characters.
[[nodiscard]] Array iterate(const Value& v);
// Raises the error an Undefined carries when it is used.
[[noreturn]] void undefined_error(const Value& u);

}  // namespace bie::jinja
