// Value: the data a Jinja template computes with, modelled on the Python objects jinja2 sees when
// transformers renders a chat template (None, bool, int, float, str, list, dict, callables and
// jinja2's Undefined). Lists and dicts are shared and immutable once built, as in the
// ImmutableSandboxedEnvironment; only namespace() objects change (`{% set ns.x = ... %}`).
// Not thread-safe: one render owns its values.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace bie::jinja {

class Value;
class Interpreter;

// Positional and keyword arguments of one call.
struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
};

// A dict with insertion order (Python dicts keep it, and tojson/items() must follow it).
struct Object {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;  // namespace(): the one mutable kind
  [[nodiscard]] const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
};

using Array = std::vector<Value>;
using Function = std::function<Value(Interpreter&, CallArgs&)>;

struct Callable {
  std::string name;
  Function fn;
};

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kArray,
    kObject,
    kCallable
  };

  Value() = default;  // undefined
  static Value none() { return Value(Kind::kNone); }
  // `why` is the error using it raises, e.g. "'x' is undefined".
  static Value undefined(std::string why = {}) {
    Value v;
    v.str_ = std::move(why);
    return v;
  }
  Value(bool b) : kind_(Kind::kBool), i_(b ? 1 : 0) {}                // NOLINT
  Value(int64_t i) : kind_(Kind::kInt), i_(i) {}                      // NOLINT
  Value(int i) : kind_(Kind::kInt), i_(i) {}                          // NOLINT
  Value(double f) : kind_(Kind::kFloat), f_(f) {}                     // NOLINT
  Value(std::string s) : kind_(Kind::kString), str_(std::move(s)) {}  // NOLINT
  Value(const char* s) : kind_(Kind::kString), str_(s) {}             // NOLINT
  Value(Array a)                                                      // NOLINT
      : kind_(Kind::kArray), arr_(std::make_shared<Array>(std::move(a))) {}
  Value(std::shared_ptr<Object> o) : kind_(Kind::kObject), obj_(std::move(o)) {}     // NOLINT
  Value(std::shared_ptr<Callable> c) : kind_(Kind::kCallable), fn_(std::move(c)) {}  // NOLINT

  // A Python tuple: a list that prints as (a, b) (items(), dictsort, varargs, `(1, 2)`).
  static Value tuple(Array a) {
    Value v(std::move(a));
    v.tuple_ = true;
    return v;
  }
  static Value from_json(const nlohmann::ordered_json& j);
  static Value from_json(const nlohmann::json& j);

  [[nodiscard]] Kind kind() const { return kind_; }
  [[nodiscard]] bool is_undefined() const { return kind_ == Kind::kUndefined; }
  [[nodiscard]] bool is_none() const { return kind_ == Kind::kNone; }
  [[nodiscard]] bool is_bool() const { return kind_ == Kind::kBool; }
  [[nodiscard]] bool is_int() const { return kind_ == Kind::kInt; }
  [[nodiscard]] bool is_float() const { return kind_ == Kind::kFloat; }
  // Python's numbers.Number includes bool; jinja2's `number` test does too.
  [[nodiscard]] bool is_number() const {
    return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool;
  }
  [[nodiscard]] bool is_string() const { return kind_ == Kind::kString; }
  [[nodiscard]] bool is_array() const { return kind_ == Kind::kArray; }
  [[nodiscard]] bool is_tuple() const { return kind_ == Kind::kArray && tuple_; }
  [[nodiscard]] bool is_object() const { return kind_ == Kind::kObject; }
  [[nodiscard]] bool is_callable() const { return kind_ == Kind::kCallable; }

  // note: call only on the matching kind
  [[nodiscard]] bool as_bool() const { return i_ != 0; }
  [[nodiscard]] int64_t as_int() const { return i_; }  // also bool
  [[nodiscard]] double as_double() const { return kind_ == Kind::kFloat ? f_ : double(i_); }
  [[nodiscard]] const std::string& as_string() const { return str_; }
  [[nodiscard]] const Array& as_array() const { return *arr_; }
  [[nodiscard]] const Object& as_object() const { return *obj_; }
  [[nodiscard]] Object& as_object_mut() const { return *obj_; }
  [[nodiscard]] const std::shared_ptr<Object>& object_ptr() const { return obj_; }
  [[nodiscard]] const Callable& as_callable() const { return *fn_; }
  [[nodiscard]] const std::string& undefined_reason() const { return str_; }
  // The shared list/dict/callable behind this value (null for the other kinds): Python's id().
  [[nodiscard]] const void* identity() const {
    return arr_   ? static_cast<const void*>(arr_.get())
           : obj_ ? static_cast<const void*>(obj_.get())
                  : static_cast<const void*>(fn_.get());
  }

  // Python's bool(x).
  [[nodiscard]] bool truthy() const;
  // Python's str(x): what `{{ x }}` prints (undefined prints "").
  [[nodiscard]] std::string str() const;
  // Python's repr(x), used inside str() of lists and dicts.
  [[nodiscard]] std::string repr() const;
  // Python's == (1 == 1.0 == True; lists and dicts compare by element).
  [[nodiscard]] bool equals(const Value& o) const;
  [[nodiscard]] const char* type_name() const;  // Python's type name, for messages

 private:
  explicit Value(Kind k) : kind_(k) {}
  Kind kind_ = Kind::kUndefined;
  bool tuple_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string str_;
  std::shared_ptr<Array> arr_;
  std::shared_ptr<Object> obj_;
  std::shared_ptr<Callable> fn_;
};

// Python's repr(float), e.g. 1.0, 0.1, 1e-05, 1e+20, inf, nan.
[[nodiscard]] std::string python_float_repr(double d);
// Python's repr(str): single quotes unless the text has ' and no ".
[[nodiscard]] std::string python_str_repr(std::string_view s);

}  // namespace bie::jinja
