#include "template/interpreter.h"

#include <cmath>
#include <limits>

#include "template/builtins.h"
#include "template/py_format.h"
#include "template/utf8.h"

namespace bie::jinja {

const Value* Scope::find(const std::string& name) const {
  for (const Scope* s = this; s != nullptr; s = s->parent.get()) {
    for (const auto& [k, v] : s->vars) {
      if (k == name) return &v;
    }
  }
  return nullptr;
}

void Scope::set(const std::string& name, Value v) {
  for (auto& [k, old] : vars) {
    if (k == name) {
      old = std::move(v);
      return;
    }
  }
  vars.emplace_back(name, std::move(v));
}

void undefined_error(const Value& u) {
  Interpreter::fail(u.undefined_reason().empty() ? "undefined value" : u.undefined_reason());
}

Array iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return {};  // jinja2's Undefined iterates as empty
    case Value::Kind::kArray:
      return v.as_array();
    case Value::Kind::kObject: {
      if (v.as_object().is_namespace) Interpreter::fail("'Namespace' object is not iterable");
      Array keys;
      for (const auto& [k, _] : v.as_object().items) keys.emplace_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      Array chars;
      for (std::string_view c : utf8_chars(v.as_string())) chars.emplace_back(std::string(c));
      return chars;
    }
    default:
      Interpreter::fail(std::string("'") + v.type_name() + "' object is not iterable");
  }
}

namespace {

[[noreturn]] void type_error(const std::string& op, const Value& a, const Value& b) {
  Interpreter::fail("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" +
                    b.type_name() + "'");
}

// Python's int and float arithmetic (bool counts as int).
Value arith(const std::string& op, const Value& a, const Value& b) {
  const bool ints = !a.is_float() && !b.is_float();
  if (op == "/") {
    if (b.as_double() == 0) Interpreter::fail("division by zero");
    return Value(a.as_double() / b.as_double());
  }
  if (ints) {
    const int64_t x = a.as_int();
    const int64_t y = b.as_int();
    int64_t r = 0;
    bool overflow = false;
    if (op == "+" || op == "-" || op == "*") {
      overflow = op == "+"   ? __builtin_add_overflow(x, y, &r)
                 : op == "-" ? __builtin_sub_overflow(x, y, &r)
                             : __builtin_mul_overflow(x, y, &r);
      if (overflow) Interpreter::fail("integer overflow");
      return Value(r);
    }
    if (op == "//" || op == "%") {
      if (y == 0) Interpreter::fail("integer division or modulo by zero");
      if (x == std::numeric_limits<int64_t>::min() && y == -1)
        Interpreter::fail("integer overflow");
      int64_t q = x / y;
      int64_t m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {  // Python floors toward -infinity
        --q;
        m += y;
      }
      return Value(op == "//" ? q : m);
    }
    if (op == "**") {
      if (y < 0) return Value(std::pow(double(x), double(y)));
      int64_t acc = 1;
      for (int64_t i = 0; i < y; ++i) {
        if (__builtin_mul_overflow(acc, x, &acc)) Interpreter::fail("integer overflow");
        if (acc == 0 || acc == 1) break;
      }
      return Value(acc);
    }
  }
  const double x = a.as_double();
  const double y = b.as_double();
  if (op == "+") return Value(x + y);
  if (op == "-") return Value(x - y);
  if (op == "*") return Value(x * y);
  if (op == "//" || op == "%") {
    if (y == 0) Interpreter::fail("float division by zero");
    double m = std::fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    if (op == "%") return Value(m);
    return Value(std::floor(x / y));
  }
  if (op == "**") return Value(std::pow(x, y));
  Interpreter::fail("unknown operator " + op);
}

// Python's Sequence * int.
Value repeat(const Value& seq, int64_t n, const Interpreter& in) {
  if (n <= 0) return seq.is_string() ? Value(std::string()) : Value(Array{});
  if (seq.is_string()) {
    in.check_size(seq.as_string().size() * static_cast<size_t>(n));
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.as_string();
    return Value(std::move(out));
  }
  in.check_size(seq.as_array().size() * static_cast<size_t>(n) * sizeof(Value));
  Array out;
  for (int64_t i = 0; i < n; ++i) {
    out.insert(out.end(), seq.as_array().begin(), seq.as_array().end());
  }
  return Value(std::move(out));
}

bool is_intlike(const Value& v) {
  return v.is_int() || v.is_bool();
}

}  // namespace

Value binary_op(const std::string& op, const Value& a, const Value& b, const Interpreter& in) {
  if (op == "~") {
    std::string s = a.str();
    const std::string t = b.str();
    in.check_size(s.size() + t.size());
    return Value(s + t);
  }
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  if (a.is_number() && b.is_number()) return arith(op, a, b);
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      in.check_size(a.as_string().size() + b.as_string().size());
      return Value(a.as_string() + b.as_string());
    }
    if (a.is_array() && b.is_array() && a.is_tuple() == b.is_tuple()) {
      Array out = a.as_array();
      out.insert(out.end(), b.as_array().begin(), b.as_array().end());
      return a.is_tuple() ? Value::tuple(std::move(out)) : Value(std::move(out));
    }
  }
  if (op == "*") {
    if ((a.is_string() || a.is_array()) && is_intlike(b)) return repeat(a, b.as_int(), in);
    if ((b.is_string() || b.is_array()) && is_intlike(a)) return repeat(b, a.as_int(), in);
  }
  if (op == "%" && a.is_string()) {
    std::string out = python_percent_format(a.as_string(), b);
    in.check_size(out.size());
    return Value(std::move(out));
  }
  type_error(op, a, b);
}

namespace {

// Python's <, for numbers, strings (UTF-8 byte order is code point order) and lists.
int order(const Value& a, const Value& b, const std::string& op) {
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float())
      return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int();
    const double x = a.as_double();
    const double y = b.as_double();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_array() && b.is_array()) {
    const Array& x = a.as_array();
    const Array& y = b.as_array();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!x[i].equals(y[i])) return order(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  Interpreter::fail("'" + op + "' not supported between instances of '" + a.type_name() +
                    "' and '" + b.type_name() + "'");
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kString:
      if (!item.is_string()) {
        Interpreter::fail(std::string("'in <string>' requires string as left operand, not ") +
                          item.type_name());
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kArray:
      for (const Value& v : container.as_array()) {
        if (v.equals(item)) return true;
      }
      return false;
    case Value::Kind::kObject:
      return item.is_string() && container.as_object().find(item.as_string()) != nullptr;
    case Value::Kind::kUndefined:
      return false;  // iterates as empty
    default:
      Interpreter::fail(std::string("argument of type '") + container.type_name() +
                        "' is not iterable");
  }
}

}  // namespace

bool compare_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return a.equals(b);
  if (op == "!=") return !a.equals(b);
  if (op == "in") return contains(b, a);
  if (op == "notin") return !contains(b, a);
  const int c = order(a, b, op);
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;  // ">="
}

void Interpreter::check_size(size_t n) const {
  if (n > limits_.max_output_bytes) {
    fail("a string grew past the template limit of " + std::to_string(limits_.max_output_bytes) +
         " bytes");
  }
}

void Interpreter::step() {
  if (++steps_ > limits_.max_steps) {
    fail("the template ran more than " + std::to_string(limits_.max_steps) +
         " steps (an endless or huge loop?)");
  }
}

void Interpreter::append(std::string& out, std::string_view s) const {
  check_size(out.size() + s.size());
  out += s;
}

void Interpreter::render(const Body& body, const std::shared_ptr<Scope>& scope, std::string& out) {
  exec_body(body, scope, out);
}

Interpreter::Flow Interpreter::exec_body(const Body& body, const std::shared_ptr<Scope>& scope,
                                         std::string& out) {
  for (const StmtPtr& s : body) {
    const Flow f = exec(*s, scope, out);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s, const std::shared_ptr<Scope>& scope,
                                    std::string& out) {
  step();
  try {
    switch (s.kind) {
      case Stmt::Kind::kText:
        append(out, s.text);
        return Flow::kNormal;
      case Stmt::Kind::kOutput:
        append(out, eval(*s.expr, scope).str());
        return Flow::kNormal;
      case Stmt::Kind::kIf:
        return exec_body(eval(*s.expr, scope).truthy() ? s.body : s.else_body, scope, out);
      case Stmt::Kind::kFor:
        exec_for(s, scope, out);
        return Flow::kNormal;
      case Stmt::Kind::kSet:
      case Stmt::Kind::kSetBlock:
        exec_set(s, scope, out);
        return Flow::kNormal;
      case Stmt::Kind::kMacro:
        scope->set(s.name, make_macro(s, scope));
        return Flow::kNormal;
      case Stmt::Kind::kCallBlock: {
        // The body becomes `caller`, a macro defined here; then the call runs with it.
        const Expr& call = *s.expr;
        Value fn = eval(*call.children[0], scope);
        CallArgs args;
        eval_args(call, 1, scope, args);
        args.kwargs.emplace_back("caller", make_macro(s, scope));
        append(out, this->call(fn, args).str());
        return Flow::kNormal;
      }
      case Stmt::Kind::kFilterBlock: {
        std::string body;
        exec_body(s.body, std::make_shared<Scope>(Scope{scope, {}}), body);
        // The chain's innermost input is the body: bind it to a name the chain cannot see.
        auto inner = std::make_shared<Scope>(Scope{scope, {}});
        inner->set("\x01body", Value(std::move(body)));
        append(out, eval(*s.expr, inner).str());
        return Flow::kNormal;
      }
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
    }
  } catch (RenderError& e) {
    if (e.pos.line == 0) e.pos = s.pos;
    throw;
  }
  return Flow::kNormal;
}

void Interpreter::exec_set(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string& out) {
  Value v;
  if (s.kind == Stmt::Kind::kSetBlock) {
    std::string body;
    exec_body(s.body, std::make_shared<Scope>(Scope{scope, {}}), body);
    v = Value(std::move(body));
    if (s.expr) {
      auto inner = std::make_shared<Scope>(Scope{scope, {}});
      inner->set("\x01body", std::move(v));
      v = eval(*s.expr, inner);
    }
  } else {
    v = eval(*s.expr, scope);
  }
  if (!s.attr.empty()) {
    const Value* ns = scope->find(s.targets[0]);
    if (ns == nullptr || !ns->is_object() || !ns->as_object().is_namespace) {
      fail("cannot assign attribute on non-namespace object '" + s.targets[0] + "'");
    }
    ns->as_object_mut().set(s.attr, std::move(v));
    return;
  }
  if (s.targets.size() == 1) {
    scope->set(s.targets[0], std::move(v));
    return;
  }
  const Array items = iterate(v);
  if (items.size() != s.targets.size()) {
    fail("cannot unpack " + std::to_string(items.size()) + " values into " +
         std::to_string(s.targets.size()) + " names");
  }
  for (size_t i = 0; i < items.size(); ++i) scope->set(s.targets[i], items[i]);
}

void Interpreter::exec_for(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string& out) {
  const Value seq = eval(*s.expr, scope);
  if (seq.is_none()) fail("'NoneType' object is not iterable");
  Array all = iterate(seq);
  const auto bind = [&](Scope& into, const Value& item) {
    if (s.targets.size() == 1) {
      into.set(s.targets[0], item);
      return;
    }
    const Array parts = iterate(item);
    if (parts.size() != s.targets.size()) {
      fail("cannot unpack " + std::to_string(parts.size()) + " values into " +
           std::to_string(s.targets.size()) + " loop variables");
    }
    for (size_t i = 0; i < parts.size(); ++i) into.set(s.targets[i], parts[i]);
  };
  if (s.cond) {  // `for x in xs if cond`: filtered before the loop counts
    Array kept;
    for (const Value& item : all) {
      step();
      auto probe = std::make_shared<Scope>(Scope{scope, {}});
      bind(*probe, item);
      if (eval(*s.cond, probe).truthy()) kept.push_back(item);
    }
    all = std::move(kept);
  }
  if (all.empty()) {
    exec_body(s.else_body, scope, out);
    return;
  }
  const auto n = static_cast<int64_t>(all.size());
  auto cycle_index = std::make_shared<int64_t>(0);
  auto cycle = std::make_shared<Callable>();
  cycle->name = "cycle";
  cycle->fn = [cycle_index](Interpreter&, CallArgs& a) -> Value {
    if (a.args.empty()) fail("no items for cycling given");
    return a.args[static_cast<size_t>(*cycle_index % static_cast<int64_t>(a.args.size()))];
  };
  for (int64_t i = 0; i < n; ++i) {
    step();
    *cycle_index = i;
    auto iter = std::make_shared<Scope>(Scope{scope, {}});
    bind(*iter, all[static_cast<size_t>(i)]);
    auto loop = std::make_shared<Object>();
    loop->items = {
        {"index", Value(i + 1)},
        {"index0", Value(i)},
        {"revindex", Value(n - i)},
        {"revindex0", Value(n - i - 1)},
        {"first", Value(i == 0)},
        {"last", Value(i == n - 1)},
        {"length", Value(n)},
        {"depth", Value(1)},
        {"depth0", Value(0)},
        {"previtem",
         i > 0 ? all[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item")},
        {"nextitem",
         i + 1 < n ? all[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item")},
        {"cycle", Value(cycle)},
    };
    iter->set("loop", Value(std::move(loop)));
    if (exec_body(s.body, iter, out) == Flow::kBreak) break;
  }
}

Value Interpreter::make_macro(const Stmt& s, const std::shared_ptr<Scope>& scope) {
  auto c = std::make_shared<Callable>();
  c->name = s.kind == Stmt::Kind::kMacro ? s.name : "caller";
  const Stmt* def = &s;
  std::weak_ptr<Scope> weak = scope;  // a macro stored in its own scope must not keep it alive
  c->fn = [def, weak](Interpreter& in, CallArgs& a) -> Value {
    std::shared_ptr<Scope> closure = weak.lock();
    if (!closure) fail("macro '" + def->name + "' called after its scope ended");
    if (++in.call_depth_ > in.limits_.max_call_depth) {
      fail("maximum macro call depth (" + std::to_string(in.limits_.max_call_depth) + ") exceeded");
    }
    auto local = std::make_shared<Scope>(Scope{closure, {}});
    std::vector<bool> used(a.kwargs.size(), false);
    for (size_t i = 0; i < def->params.size(); ++i) {
      const auto& [pname, pdefault] = def->params[i];
      Value v = Value::undefined("'" + pname + "' is undefined");
      bool given = false;
      if (i < a.args.size()) {
        v = a.args[i];
        given = true;
      }
      for (size_t k = 0; k < a.kwargs.size() && !given; ++k) {
        if (a.kwargs[k].first == pname) {
          v = a.kwargs[k].second;
          used[k] = true;
          given = true;
        }
      }
      if (!given && pdefault) v = in.eval(*pdefault, local);
      local->set(pname, std::move(v));
    }
    Array varargs;
    for (size_t i = def->params.size(); i < a.args.size(); ++i) varargs.push_back(a.args[i]);
    local->set("varargs", Value::tuple(std::move(varargs)));
    auto kwargs = std::make_shared<Object>();
    for (size_t k = 0; k < a.kwargs.size(); ++k) {
      if (used[k]) continue;
      if (a.kwargs[k].first == "caller") {
        local->set("caller", a.kwargs[k].second);
      } else {
        kwargs->set(a.kwargs[k].first, a.kwargs[k].second);
      }
    }
    local->set("kwargs", Value(std::move(kwargs)));
    std::string out;
    in.exec_body(def->body, local, out);
    --in.call_depth_;
    return Value(std::move(out));
  };
  return Value(std::move(c));
}

Value Interpreter::call(const Value& fn, CallArgs& args) {
  step();
  if (fn.is_undefined()) undefined_error(fn);
  if (!fn.is_callable()) fail(std::string("'") + fn.type_name() + "' object is not callable");
  return fn.as_callable().fn(*this, args);
}

Value Interpreter::getattr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) undefined_error(obj);
  if (has_method(obj, name)) {
    auto c = std::make_shared<Callable>();
    c->name = name;
    c->fn = [obj, name](Interpreter& in, CallArgs& a) { return call_method(in, obj, name, a); };
    return Value(std::move(c));
  }
  if (obj.is_object()) {
    if (const Value* v = obj.as_object().find(name)) return *v;
    return Value::undefined("'" + std::string(obj.as_object().is_namespace ? "Namespace" : "dict") +
                            " object' has no attribute '" + name + "'");
  }
  return Value::undefined("'" + std::string(obj.type_name()) + " object' has no attribute '" +
                          name + "'");
}

Value Interpreter::getitem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.is_object() && key.is_string()) {
    if (const Value* v = obj.as_object().find(key.as_string())) return *v;
    return getattr(obj, key.as_string());
  }
  if ((obj.is_array() || obj.is_string()) && is_intlike(key)) {
    int64_t i = key.as_int();
    if (obj.is_array()) {
      const auto n = static_cast<int64_t>(obj.as_array().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n)
        return Value::undefined(obj.type_name() + std::string(" index out of range"));
      return obj.as_array()[static_cast<size_t>(i)];
    }
    const std::vector<std::string_view> chars = utf8_chars(obj.as_string());
    const auto n = static_cast<int64_t>(chars.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined("string index out of range");
    return Value(std::string(chars[static_cast<size_t>(i)]));
  }
  if (key.is_string()) return getattr(obj, key.as_string());
  return Value::undefined(std::string("'") + obj.type_name() + " object' has no item " +
                          key.repr());
}

namespace {

// Python's slice.indices() followed by the selection.
template <class T>
std::vector<T> slice_of(const std::vector<T>& xs, const Value& start, const Value& stop,
                        const Value& step) {
  const auto n = static_cast<int64_t>(xs.size());
  const auto opt = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!is_intlike(v)) {
      Interpreter::fail(std::string("slice ") + what + " must be an integer or none");
    }
    return v.as_int();
  };
  const int64_t st = opt(step, "step").value_or(1);
  if (st == 0) Interpreter::fail("slice step cannot be zero");
  const auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t i = *v;
    if (i < 0) {
      i += n;
      if (i < 0) i = st < 0 ? -1 : 0;
    } else if (i >= n) {
      i = st < 0 ? n - 1 : n;
    }
    return i;
  };
  const int64_t b = clamp(opt(start, "start"), st < 0 ? n - 1 : 0);
  const int64_t e = clamp(opt(stop, "stop"), st < 0 ? -1 : n);
  std::vector<T> out;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) out.push_back(xs[static_cast<size_t>(i)]);
  return out;
}

}  // namespace

Value Interpreter::eval(const Expr& e, const std::shared_ptr<Scope>& scope) {
  try {
    return eval_inner(e, scope);
  } catch (RenderError& err) {
    if (err.pos.line == 0) err.pos = e.pos;
    throw;
  }
}

void Interpreter::eval_args(const Expr& e, size_t first, const std::shared_ptr<Scope>& scope,
                            CallArgs& out) {
  for (size_t i = first; i < e.children.size(); ++i)
    out.args.push_back(eval(*e.children[i], scope));
  for (const auto& [k, v] : e.kwargs) out.kwargs.emplace_back(k, eval(*v, scope));
}

Value Interpreter::eval_call(const Expr& e, const std::shared_ptr<Scope>& scope) {
  const Expr& target = *e.children[0];
  CallArgs args;
  if (target.kind == Expr::Kind::kGetAttr) {  // obj.method(...) without a bound callable
    const Value obj = eval(*target.children[0], scope);
    if (obj.is_undefined()) undefined_error(obj);
    if (has_method(obj, target.name)) {
      eval_args(e, 1, scope, args);
      step();
      return call_method(*this, obj, target.name, args);
    }
    const Value fn = getattr(obj, target.name);
    eval_args(e, 1, scope, args);
    return call(fn, args);
  }
  const Value fn = eval(target, scope);
  eval_args(e, 1, scope, args);
  return call(fn, args);
}

Value Interpreter::eval_binary(const Expr& e, const std::shared_ptr<Scope>& scope) {
  const Value a = eval(*e.children[0], scope);
  if (e.name == "and") return a.truthy() ? eval(*e.children[1], scope) : a;
  if (e.name == "or") return a.truthy() ? a : eval(*e.children[1], scope);
  const Value b = eval(*e.children[1], scope);
  return binary_op(e.name, a, b, *this);
}

bool Interpreter::eval_compare(const Expr& e, const std::shared_ptr<Scope>& scope) {
  Value left = eval(*e.children[0], scope);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.children[i + 1], scope);
    if (!compare_op(e.ops[i], left, right)) return false;
    left = std::move(right);
  }
  return true;
}

Value Interpreter::eval_inner(const Expr& e, const std::shared_ptr<Scope>& scope) {
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.value;
    case Expr::Kind::kName: {
      if (const Value* v = scope->find(e.name)) return *v;
      return Value::undefined("'" + e.name + "' is undefined");
    }
    case Expr::Kind::kList: {
      Array a;
      a.reserve(e.children.size());
      for (const ExprPtr& c : e.children) a.push_back(eval(*c, scope));
      return e.name == "tuple" ? Value::tuple(std::move(a)) : Value(std::move(a));
    }
    case Expr::Kind::kDict: {
      auto o = std::make_shared<Object>();
      for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
        const Value k = eval(*e.children[i], scope);
        if (!k.is_string()) fail("dict keys must be strings here");
        o->set(k.as_string(), eval(*e.children[i + 1], scope));
      }
      return Value(std::move(o));
    }
    case Expr::Kind::kGetAttr:
      return getattr(eval(*e.children[0], scope), e.name);
    case Expr::Kind::kGetItem: {
      const Value obj = eval(*e.children[0], scope);
      return getitem(obj, eval(*e.children[1], scope));
    }
    case Expr::Kind::kSlice: {
      const Value obj = eval(*e.children[0], scope);
      const auto part = [&](size_t i) {
        return e.children[i] ? eval(*e.children[i], scope) : Value::none();
      };
      const Value a = part(1);
      const Value b = part(2);
      const Value c = part(3);
      if (obj.is_undefined()) undefined_error(obj);
      if (obj.is_array()) return Value(slice_of(obj.as_array(), a, b, c));
      if (obj.is_string()) {
        std::string out;
        for (std::string_view ch : slice_of(utf8_chars(obj.as_string()), a, b, c)) out += ch;
        return Value(std::move(out));
      }
      return Value::undefined(std::string("'") + obj.type_name() + "' object is not subscriptable");
    }
    case Expr::Kind::kCall:
      return eval_call(e, scope);
    case Expr::Kind::kFilter: {
      Value input;
      if (e.children[0]) {
        input = eval(*e.children[0], scope);
      } else if (const Value* body = scope->find("\x01body")) {
        input = *body;
      }
      CallArgs args;
      eval_args(e, 1, scope, args);
      step();
      return apply_filter(*this, e.name, input, args);
    }
    case Expr::Kind::kTest: {
      const Value v = eval(*e.children[0], scope);
      CallArgs args;
      eval_args(e, 1, scope, args);
      const bool r = apply_test(*this, e.name, v, args);
      return Value(e.negated ? !r : r);
    }
    case Expr::Kind::kUnary: {
      const Value v = eval(*e.children[0], scope);
      if (e.name == "not") return Value(!v.truthy());
      if (v.is_undefined()) undefined_error(v);
      if (!v.is_number()) {
        fail("bad operand type for unary " + e.name + ": '" + v.type_name() + "'");
      }
      if (e.name == "+") return v.is_bool() ? Value(v.as_int()) : v;
      if (v.is_float()) return Value(-v.as_double());
      if (v.as_int() == std::numeric_limits<int64_t>::min()) fail("integer overflow");
      return Value(-v.as_int());
    }
    case Expr::Kind::kBinary:
      return eval_binary(e, scope);
    case Expr::Kind::kCompare:
      return Value(eval_compare(e, scope));
    case Expr::Kind::kCond:
      if (eval(*e.children[0], scope).truthy()) return eval(*e.children[1], scope);
      if (e.children[2]) return eval(*e.children[2], scope);
      return Value::undefined("the inline if expression had no else branch");
  }
  return Value();
}

}  // namespace bie::jinja
