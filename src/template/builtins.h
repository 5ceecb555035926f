// Builtins: jinja2's filters and tests, Python's str/dict methods, and the globals chat
// templates call (range, namespace, dict, raise_exception, strftime_now). Free functions over
// Values; errors are thrown as RenderError through Interpreter::fail.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "template/interpreter.h"
#include "template/value.h"

namespace bie::jinja {

[[nodiscard]] Value apply_filter(Interpreter& in, const std::string& name, const Value& input,
                                 CallArgs& args);
[[nodiscard]] bool apply_test(Interpreter& in, const std::string& name, const Value& v,
                              CallArgs& args);
// Whether `obj.name` is a method (str.strip, dict.items, ...) rather than a key.
[[nodiscard]] bool has_method(const Value& obj, const std::string& name);
[[nodiscard]] Value call_method(Interpreter& in, const Value& obj, const std::string& name,
                                CallArgs& args);
void add_globals(Scope& s);
// The names apply_filter / apply_test know; jinja2 rejects any other when it compiles.
[[nodiscard]] bool is_known_filter(std::string_view name);
[[nodiscard]] bool is_known_test(std::string_view name);

}  // namespace bie::jinja
