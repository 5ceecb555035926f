// Python's text formats that templates reach: json.dumps (what transformers' tojson filter
// calls) and printf-style `%` formatting (`'%s' % x`, jinja2's format filter). Free functions;
// errors are thrown as RenderError through Interpreter::fail.
#pragma once

#include <optional>
#include <string>

#include "template/value.h"

namespace bie::jinja {

struct JsonStyle {
  std::optional<std::string> indent;    // the unit per level; none: everything on one line
  std::optional<std::string> item_sep;  // none: Python's default for the indent
  std::optional<std::string> key_sep;   // none: ": "
  bool sort_keys = false;
  bool ensure_ascii = false;  // transformers passes False: non-ASCII text stays as it is
};

// json.dumps(v, ...) byte for byte, floats as Python's repr; undefined values, callables and
// namespaces are errors (not JSON serializable).
[[nodiscard]] std::string python_json_dumps(const Value& v, const JsonStyle& style);

// Python's `fmt % args`: args a tuple (positional values), a dict (%(name)s) or one value.
[[nodiscard]] std::string python_percent_format(const std::string& fmt, const Value& args);

}  // namespace bie::jinja
