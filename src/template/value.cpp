#include "template/value.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace bie::jinja {

const Value* Object::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Object::set(const std::string& key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

namespace {

template <class J>
Value from_json_impl(const J& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      return Value(static_cast<int64_t>(j.template get<uint64_t>()));
    case nlohmann::json::value_t::number_float:
      return Value(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      Array a;
      a.reserve(j.size());
      for (const auto& e : j) a.push_back(from_json_impl(e));
      return Value(std::move(a));
    }
    case nlohmann::json::value_t::object: {
      auto o = std::make_shared<Object>();
      for (auto it = j.begin(); it != j.end(); ++it) {
        o->items.emplace_back(it.key(), from_json_impl(it.value()));
      }
      return Value(std::move(o));
    }
    default:
      return Value::none();
  }
}

}  // namespace

Value Value::from_json(const nlohmann::ordered_json& j) {
  return from_json_impl(j);
}
Value Value::from_json(const nlohmann::json& j) {
  return from_json_impl(j);
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0;
    case Kind::kString:
      return !str_.empty();
    case Kind::kArray:
      return !arr_->empty();
    case Kind::kObject:
      return !obj_->items.empty();
    case Kind::kCallable:
      return true;
  }
  return false;
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  // Shortest round-trip digits, then Python's layout: positional for 1e-5 < |d| < 1e16.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t epos = sci.find('e');
  const int exp = std::atoi(sci.c_str() + epos + 1);
  std::string digits;
  for (size_t i = 0; i < epos; ++i) {
    if (sci[i] != '.') digits += sci[i];
  }
  if (exp < -4 || exp >= 16) {
    std::string out = sign + digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + e;
  }
  if (exp >= 0) {
    const size_t int_digits = static_cast<size_t>(exp) + 1;
    if (digits.size() <= int_digits) {
      return sign + digits + std::string(int_digits - digits.size(), '0') + ".0";
    }
    return sign + digits.substr(0, int_digits) + "." + digits.substr(int_digits);
  }
  return sign + "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
}

std::string python_str_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<unsigned char>(q)) {
      out += '\\';
      out += q;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);  // non-ASCII letters print as themselves in Python 3
    }
  }
  out += q;
  return out;
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::kString:
      return python_str_repr(str_);
    case Kind::kUndefined:
      return "Undefined";
    default:
      return str();
  }
}

std::string Value::str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return i_ != 0 ? "True" : "False";
    case Kind::kInt:
      return std::to_string(i_);
    case Kind::kFloat:
      return python_float_repr(f_);
    case Kind::kString:
      return str_;
    case Kind::kArray: {
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < arr_->size(); ++i) {
        if (i > 0) out += ", ";
        out += (*arr_)[i].repr();
      }
      if (tuple_ && arr_->size() == 1) out += ",";
      return out + (tuple_ ? ")" : "]");
    }
    case Kind::kObject: {
      if (obj_->is_namespace) return "<Namespace>";
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : obj_->items) {
        if (!first) out += ", ";
        first = false;
        out += python_str_repr(k) + ": " + v.repr();
      }
      return out + "}";
    }
    case Kind::kCallable:
      return "<function " + fn_->name + ">";
  }
  return "";
}

bool Value::equals(const Value& o) const {
  if (is_number() && o.is_number()) {
    if (kind_ == Kind::kFloat || o.kind_ == Kind::kFloat) return as_double() == o.as_double();
    return i_ == o.i_;
  }
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return str_ == o.str_;
    case Kind::kArray: {
      if (tuple_ != o.tuple_ || arr_->size() != o.arr_->size()) return false;
      for (size_t i = 0; i < arr_->size(); ++i) {
        if (!(*arr_)[i].equals((*o.arr_)[i])) return false;
      }
      return true;
    }
    case Kind::kObject: {
      if (obj_ == o.obj_) return true;
      if (obj_->is_namespace || o.obj_->is_namespace) return false;
      if (obj_->items.size() != o.obj_->items.size()) return false;
      for (const auto& [k, v] : obj_->items) {
        const Value* w = o.obj_->find(k);
        if (w == nullptr || !v.equals(*w)) return false;
      }
      return true;
    }
    case Kind::kCallable:
      return fn_ == o.fn_;
    default:
      return false;
  }
}

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kArray:
      return tuple_ ? "tuple" : "list";
    case Kind::kObject:
      return obj_->is_namespace ? "Namespace" : "dict";
    case Kind::kCallable:
      return "function";
  }
  return "?";
}

}  // namespace bie::jinja
