#include "template/py_format.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <string_view>
#include <vector>

#include "template/interpreter.h"
#include "template/utf8.h"

namespace bie::jinja {

namespace {

using Kind = Value::Kind;

[[noreturn]] void fail(const std::string& msg) {
  Interpreter::fail(msg);
}

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (std::string_view ch : utf8_chars(s)) {
    const auto c = static_cast<unsigned char>(ch[0]);
    if (ch.size() == 1) {
      switch (c) {
        case '"':
          out += "\\\"";
          continue;
        case '\\':
          out += "\\\\";
          continue;
        case '\n':
          out += "\\n";
          continue;
        case '\r':
          out += "\\r";
          continue;
        case '\t':
          out += "\\t";
          continue;
        case '\b':
          out += "\\b";
          continue;
        case '\f':
          out += "\\f";
          continue;
        default:
          break;
      }
      if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
        char b[8];
        std::snprintf(b, sizeof b, "\\u%04x", c);
        out += b;
      } else {
        out += ch;
      }
      continue;
    }
    if (!ensure_ascii) {
      out += ch;
      continue;
    }
    // Decode and write \uXXXX (a surrogate pair above the BMP), lowercase as Python does.
    uint32_t cp = 0;
    if (ch.size() == 2) cp = c & 0x1F;
    if (ch.size() == 3) cp = c & 0x0F;
    if (ch.size() == 4) cp = c & 0x07;
    for (size_t k = 1; k < ch.size(); ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(ch[k]) & 0x3F);
    char b[16];
    if (cp >= 0x10000) {
      cp -= 0x10000;
      std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
    } else {
      std::snprintf(b, sizeof b, "\\u%04x", cp);
    }
    out += b;
  }
  out += '"';
}

struct Seps {
  std::string item;
  std::string key;
};

void json_value(std::string& out, const Value& v, const JsonStyle& st, const Seps& seps,
                int level) {
  if (level > 500) fail("tojson: value nested too deeply");
  const auto newline = [&](int lvl) {
    out += '\n';
    for (int i = 0; i < lvl; ++i) out += *st.indent;
  };
  switch (v.kind()) {
    case Kind::kNone:
      out += "null";
      return;
    case Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Kind::kInt:
      out += std::to_string(v.as_int());
      return;
    case Kind::kFloat: {
      const double d = v.as_double();
      if (std::isnan(d)) {
        out += "NaN";
      } else if (std::isinf(d)) {
        out += d < 0 ? "-Infinity" : "Infinity";
      } else {
        out += python_float_repr(d);
      }
      return;
    }
    case Kind::kString:
      json_string(out, v.as_string(), st.ensure_ascii);
      return;
    case Kind::kArray: {
      const Array& a = v.as_array();
      if (a.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < a.size(); ++i) {
        if (i > 0) out += seps.item;
        if (st.indent) newline(level + 1);
        json_value(out, a[i], st, seps, level + 1);
      }
      if (st.indent) newline(level);
      out += ']';
      return;
    }
    case Kind::kObject: {
      if (v.as_object().is_namespace) fail("Object of type Namespace is not JSON serializable");
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.as_object().items) items.push_back(&kv);
      if (items.empty()) {
        out += "{}";
        return;
      }
      if (st.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += seps.item;
        if (st.indent) newline(level + 1);
        json_string(out, items[i]->first, st.ensure_ascii);
        out += seps.key;
        json_value(out, items[i]->second, st, seps, level + 1);
      }
      if (st.indent) newline(level);
      out += '}';
      return;
    }
    case Kind::kUndefined:
      fail("Object of type Undefined is not JSON serializable");
    case Kind::kCallable:
      fail("Object of type function is not JSON serializable");
  }
}

}  // namespace

std::string python_json_dumps(const Value& v, const JsonStyle& style) {
  // Python's defaults: ", " between items on one line, "," when indenting; ": " after keys.
  const Seps seps{style.item_sep.value_or(style.indent ? "," : ", "), style.key_sep.value_or(": ")};
  std::string out;
  json_value(out, v, style, seps, 0);
  return out;
}

std::string python_percent_format(const std::string& fmt, const Value& args) {
  // Python's printf-style formatting: a tuple gives the positional values, a dict the named
  // ones (%(name)s), anything else is the single value.
  const bool named = args.is_object() && !args.as_object().is_namespace;
  Array positional;
  if (args.is_tuple()) {
    positional = args.as_array();
  } else if (!named) {
    positional.push_back(args);
  }
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) fail("incomplete format");
    Value v;
    bool have_value = false;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string::npos) fail("incomplete format key");
      if (!named) fail("format requires a mapping");
      const Value* found = args.as_object().find(fmt.substr(i + 1, close - i - 1));
      if (found == nullptr) fail("format key '" + fmt.substr(i + 1, close - i - 1) + "' missing");
      v = *found;
      have_value = true;
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::string_view("-+ 0#").find(fmt[i]) != std::string_view::npos) {
      flags += fmt[i++];
    }
    size_t width = 0;
    while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) {
      width = std::min<size_t>(width * 10 + static_cast<size_t>(fmt[i++] - '0'), 4096);
    }
    std::optional<size_t> precision;
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      size_t p = 0;
      while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) {
        p = std::min<size_t>(p * 10 + static_cast<size_t>(fmt[i++] - '0'), 400);
      }
      precision = p;
    }
    if (i >= fmt.size()) fail("incomplete format");
    const char conv = fmt[i];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (!have_value) {
      if (next >= positional.size()) fail("not enough arguments for format string");
      v = positional[next++];
    }
    if (conv == 's' || conv == 'r' || conv == 'a') {
      // Width and precision count characters, as Python's do.
      std::vector<std::string_view> chars = utf8_chars(conv == 's' ? v.str() : v.repr());
      const std::string text = conv == 's' ? v.str() : v.repr();
      size_t n = chars.size();
      size_t bytes = text.size();
      if (precision && n > *precision) {
        n = *precision;
        bytes = n == 0 ? 0
                       : static_cast<size_t>(chars[n - 1].data() - chars[0].data()) +
                             chars[n - 1].size();
      }
      const std::string body = text.substr(0, bytes);
      const std::string pad(width > n ? width - n : 0, ' ');
      out += flags.find('-') != std::string::npos ? body + pad : pad + body;
      continue;
    }
    std::string spec = "%" + flags;
    if (width > 0) spec += std::to_string(width);
    if (precision) spec += "." + std::to_string(*precision);
    char buf[4600];
    if (!v.is_number()) {
      fail(std::string("%") + conv + " format: a real number is required, not " + v.type_name());
    }
    switch (conv) {
      case 'd':
      case 'i':
      case 'u': {
        const auto n = v.is_float() ? static_cast<long long>(v.as_double()) : v.as_int();
        std::snprintf(buf, sizeof buf, (spec + "lld").c_str(), static_cast<long long>(n));
        break;
      }
      case 'x':
      case 'X':
      case 'o': {
        if (v.is_float()) fail(std::string("%") + conv + " format: an integer is required");
        const long long n = v.as_int();
        const auto mag =
            n < 0 ? 0ULL - static_cast<unsigned long long>(n) : static_cast<unsigned long long>(n);
        const std::string alt = flags.find('#') == std::string::npos ? ""
                                : conv == 'o'                        ? "0o"
                                : conv == 'x'                        ? "0x"
                                                                     : "0X";
        std::snprintf(buf, sizeof buf, conv == 'o' ? "%llo" : conv == 'x' ? "%llx" : "%llX", mag);
        std::string sign = n < 0                                  ? "-"
                           : flags.find('+') != std::string::npos ? "+"
                           : flags.find(' ') != std::string::npos ? " "
                                                                  : "";
        std::string digits = buf;
        if (precision && digits.size() < *precision) {
          digits.insert(0, *precision - digits.size(), '0');
        }
        const size_t len = sign.size() + alt.size() + digits.size();
        if (width > len && flags.find('-') != std::string::npos) {
          out += sign + alt + digits + std::string(width - len, ' ');
        } else if (width > len && flags.find('0') != std::string::npos) {
          out += sign + alt + std::string(width - len, '0') + digits;
        } else {
          out += std::string(width > len ? width - len : 0, ' ') + sign + alt + digits;
        }
        continue;
      }
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G':
        std::snprintf(buf, sizeof buf, (spec + conv).c_str(), v.as_double());
        break;
      case 'c': {
        if (!v.is_int()) fail("%c requires an int");
        std::string ch;
        const auto cp = static_cast<uint32_t>(v.as_int());
        if (cp < 0x80) {
          ch = std::string(1, static_cast<char>(cp));
        } else {
          fail("%c of a non-ASCII code point is not supported");
        }
        out += ch;
        continue;
      }
      default:
        fail(std::string("unsupported format character '") + conv + "'");
    }
    out += buf;
  }
  if (!named && next < positional.size()) {
    fail("not all arguments converted during string formatting");
  }
  return out;
}

}  // namespace bie::jinja
