#include "template/builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string_view>

#include "template/py_format.h"
#include "template/utf8.h"

namespace bie::jinja {

namespace {

using Kind = Value::Kind;

[[noreturn]] void fail(const std::string& msg) {
  Interpreter::fail(msg);
}

// A parameter that can only be passed by keyword (map's attribute=, default=).
constexpr size_t kKeywordOnly = static_cast<size_t>(-1);

// Positional-or-keyword argument lookup with Python's rules (position `i` or `name=`).
class Params {
 public:
  Params(CallArgs& a, std::string fn) : a_(a), fn_(std::move(fn)) {}
  [[nodiscard]] const Value* find(size_t i, std::string_view name) const {
    if (i < a_.args.size()) return &a_.args[i];
    for (const auto& [k, v] : a_.kwargs) {
      if (k == name) return &v;
    }
    return nullptr;
  }
  [[nodiscard]] Value get(size_t i, std::string_view name, Value dflt) const {
    const Value* v = find(i, name);
    return v != nullptr ? *v : std::move(dflt);
  }
  [[nodiscard]] const Value& need(size_t i, std::string_view name) const {
    const Value* v = find(i, name);
    if (v == nullptr) fail(fn_ + "() missing required argument '" + std::string(name) + "'");
    return *v;
  }
  [[nodiscard]] std::string str(size_t i, std::string_view name, std::string dflt) const {
    const Value* v = find(i, name);
    if (v == nullptr || v->is_none()) return dflt;
    if (!v->is_string()) fail(fn_ + "(): '" + std::string(name) + "' must be a string");
    return v->as_string();
  }
  [[nodiscard]] int64_t integer(size_t i, std::string_view name, int64_t dflt) const {
    const Value* v = find(i, name);
    if (v == nullptr || v->is_none()) return dflt;
    if (!v->is_int() && !v->is_bool()) {
      fail(fn_ + "(): '" + std::string(name) + "' must be an integer");
    }
    return v->as_int();
  }
  [[nodiscard]] bool flag(size_t i, std::string_view name, bool dflt) const {
    const Value* v = find(i, name);
    return v == nullptr ? dflt : v->truthy();
  }
  [[nodiscard]] size_t positional() const { return a_.args.size(); }
  [[nodiscard]] const Value& at(size_t i) const { return a_.args[i]; }

 private:
  CallArgs& a_;
  std::string fn_;
};

// ---- strings ----

bool ascii_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
std::string lower(const std::string& s) {
  return utf8_lower(s);
}
std::string upper(const std::string& s) {
  return utf8_upper(s);
}
std::string title(const std::string& s) {
  return utf8_title(s);
}
std::string capitalize(const std::string& s) {
  return utf8_capitalize(s);
}

// Python's str.strip/lstrip/rstrip; `chars` null: Unicode whitespace.
std::string strip(const std::string& s, const std::string* chars, bool left, bool right) {
  const std::vector<std::string_view> cs = utf8_chars(s);
  std::vector<std::string_view> set;
  if (chars != nullptr) set = utf8_chars(*chars);
  const auto drop = [&](std::string_view c) {
    if (chars == nullptr) return is_python_space(c);
    return std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t b = 0;
  size_t e = cs.size();
  if (left) {
    while (b < e && drop(cs[b])) ++b;
  }
  if (right) {
    while (e > b && drop(cs[e - 1])) --e;
  }
  if (b == e) return {};
  const size_t from = static_cast<size_t>(cs[b].data() - s.data());
  const size_t to = static_cast<size_t>(cs[e - 1].data() - s.data()) + cs[e - 1].size();
  return s.substr(from, to - from);
}

Array split(const std::string& s, const Value& sep_v, int64_t maxsplit) {
  Array out;
  if (sep_v.is_none() || sep_v.is_undefined()) {  // runs of whitespace; no empty parts
    const std::vector<std::string_view> cs = utf8_chars(s);
    size_t i = 0;
    while (i < cs.size()) {
      while (i < cs.size() && is_python_space(cs[i])) ++i;
      if (i == cs.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        const size_t from = static_cast<size_t>(cs[i].data() - s.data());
        std::string rest = s.substr(from);
        out.emplace_back(strip(rest, nullptr, false, true));
        return out;
      }
      std::string word;
      while (i < cs.size() && !is_python_space(cs[i])) word += cs[i++];
      out.emplace_back(std::move(word));
    }
    return out;
  }
  if (!sep_v.is_string()) fail("split(): the separator must be a string or none");
  const std::string& sep = sep_v.as_string();
  if (sep.empty()) fail("split(): empty separator");
  size_t from = 0;
  while (true) {
    const size_t at = s.find(sep, from);
    if (at == std::string::npos ||
        (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit)) {
      out.emplace_back(s.substr(from));
      return out;
    }
    out.emplace_back(s.substr(from, at - from));
    from = at + sep.size();
  }
}

std::string replace(const std::string& s, const std::string& old, const std::string& with,
                    int64_t count, const Interpreter& in) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {  // Python inserts `with` around every character
    for (std::string_view c : utf8_chars(s)) {
      if (count < 0 || done < count) {
        out += with;
        ++done;
      }
      out += c;
      in.check_size(out.size());
    }
    if (count < 0 || done < count) out += with;
    return out;
  }
  size_t from = 0;
  while (true) {
    const size_t at = s.find(old, from);
    if (at == std::string::npos || (count >= 0 && done >= count)) break;
    out.append(s, from, at - from);
    out += with;
    in.check_size(out.size());
    from = at + old.size();
    ++done;
  }
  out.append(s, from, std::string::npos);
  return out;
}

bool starts_or_ends(const std::string& s, const Value& what, bool starts) {
  const auto one = [&](const Value& p) {
    if (!p.is_string()) fail("startswith/endswith take a string or a tuple of strings");
    const std::string& x = p.as_string();
    if (x.size() > s.size()) return false;
    return starts ? s.compare(0, x.size(), x) == 0
                  : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (what.is_array()) {
    for (const Value& p : what.as_array()) {
      if (one(p)) return true;
    }
    return false;
  }
  return one(what);
}

// str.format with automatic ({}), numbered ({0}) and named ({name}) fields, no format specs.
std::string format(const std::string& f, Params& p, CallArgs& a) {
  std::string out;
  size_t next_auto = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    const char c = f[i];
    if (c == '{' && i + 1 < f.size() && f[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '}' && i + 1 < f.size() && f[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{') {
      const size_t close = f.find('}', i);
      if (close == std::string::npos) fail("format(): single '{' in format string");
      const std::string field = f.substr(i + 1, close - i - 1);
      if (field.find_first_of(":!") != std::string::npos) {
        fail("format(): format specs and conversions are not supported");
      }
      Value v;
      if (field.empty()) {
        if (next_auto >= p.positional()) fail("format(): not enough arguments");
        v = p.at(next_auto++);
      } else if (std::all_of(field.begin(), field.end(),
                             [](char d) { return d >= '0' && d <= '9'; })) {
        const auto n = static_cast<size_t>(std::stoul(field));
        if (n >= p.positional()) fail("format(): argument index out of range");
        v = p.at(n);
      } else {
        const Value* named = nullptr;
        for (const auto& [k, val] : a.kwargs) {
          if (k == field) named = &val;
        }
        if (named == nullptr) fail("format(): no argument named '" + field + "'");
        v = *named;
      }
      out += v.str();
      i = close;
    } else if (c == '}') {
      fail("format(): single '}' in format string");
    } else {
      out += c;
    }
  }
  return out;
}

// ---- sequences ----

// jinja2's attribute path for filters: "a.b.0" looks up a, then b, then item 0.
Value attribute_path(Interpreter& in, const Value& v, const std::string& path) {
  Value cur = v;
  size_t from = 0;
  while (true) {
    const size_t dot = path.find('.', from);
    const std::string part = path.substr(from, dot == std::string::npos ? dot : dot - from);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                                     [](char c) { return c >= '0' && c <= '9'; });
    cur = in.getitem(cur, digits ? Value(static_cast<int64_t>(std::stoll(part))) : Value(part));
    if (dot == std::string::npos) return cur;
    from = dot + 1;
  }
}

// Sorting key for sort/dictsort/unique/min/max: strings lower-cased unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(lower(v.as_string()));
  return v;
}

bool less(const Value& a, const Value& b) {
  return compare_op("<", a, b);
}

size_t length(const Value& v) {
  switch (v.kind()) {
    case Kind::kString:
      return utf8_length(v.as_string());
    case Kind::kArray:
      return v.as_array().size();
    case Kind::kObject:
      return v.as_object().items.size();
    case Kind::kUndefined:
      return 0;
    default:
      fail(std::string("object of type '") + v.type_name() + "' has no len()");
  }
}

// The filter/test arguments after the name in select/map: e.g. select("equalto", 3).
CallArgs rest_args(const CallArgs& a, size_t from) {
  CallArgs r;
  for (size_t i = from; i < a.args.size(); ++i) r.args.push_back(a.args[i]);
  r.kwargs = a.kwargs;
  return r;
}

Value select_like(Interpreter& in, const Value& input, CallArgs& a, bool by_attr, bool keep) {
  const Array items = iterate(input);
  std::string attr;
  size_t next = 0;
  if (by_attr) {
    if (a.args.empty() || !a.args[0].is_string())
      fail("selectattr/rejectattr need an attribute name");
    attr = a.args[0].as_string();
    next = 1;
  }
  std::string test;
  if (a.args.size() > next) {
    if (!a.args[next].is_string()) fail("select/reject: the test name must be a string");
    test = a.args[next].as_string();
  }
  Array out;
  for (const Value& item : items) {
    const Value probe = by_attr ? attribute_path(in, item, attr) : item;
    bool r = false;
    if (test.empty()) {
      r = probe.truthy();
    } else {
      CallArgs ta = rest_args(a, next + 1);
      r = apply_test(in, test, probe, ta);
    }
    if (r == keep) out.push_back(item);
  }
  return Value(std::move(out));
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Python's round(x, n): correctly rounded, ties to even on the exact binary value.
double python_round(double x, int64_t n) {
  if (n > 300 || n < -300 || !std::isfinite(x)) return x;
  if (n >= 0) {
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(n), x);
    return std::strtod(buf, nullptr);
  }
  const double p = std::pow(10.0, static_cast<double>(-n));
  return std::nearbyint(x / p) * p;
}

// Python's int(str): optional sign, digits with underscores, surrounding whitespace.
std::optional<int64_t> parse_int(const std::string& s, int64_t base) {
  const std::string t = strip(s, nullptr, true, true);
  std::string digits;
  for (char c : t) {
    if (c != '_') digits += c;
  }
  if (digits.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(digits.c_str(), &end, static_cast<int>(base));
  if (*end != '\0' || errno == ERANGE) return std::nullopt;
  return static_cast<int64_t>(v);
}

std::optional<double> parse_float(const std::string& s) {
  const std::string t = strip(s, nullptr, true, true);
  if (t.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (*end != '\0') return std::nullopt;
  return v;
}

// Python's str.splitlines() for the line breaks text is made of.
std::vector<std::string> splitlines(const std::string& s) {
  std::vector<std::string> out;
  std::string line;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || c == '\x1c' || c == '\x1d' ||
        c == '\x1e') {
      if (c == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      out.push_back(std::move(line));
      line.clear();
    } else {
      line += c;
    }
  }
  if (!line.empty()) out.push_back(std::move(line));
  return out;
}

std::string indent(std::string s, const Value& width, bool first, bool blank) {
  const std::string ind =
      width.is_string()
          ? width.as_string()
          : std::string(static_cast<size_t>(std::max<int64_t>(0, width.as_int())), ' ');
  s += "\n";  // jinja2 appends one so that splitlines keeps a trailing empty line
  const std::vector<std::string> lines = splitlines(s);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) rv += "\n" + ind;
      rv += lines[i];
    }
  } else if (!lines.empty()) {
    rv = lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += ind;
      rv += lines[i];
    }
  }
  if (first) rv = ind + rv;
  return rv;
}

Value dumps_filter(const Value& v, Params& p) {
  JsonStyle st;
  st.ensure_ascii = p.flag(0, "ensure_ascii", false);
  const Value ind = p.get(1, "indent", Value::none());
  if (ind.is_int() || ind.is_bool()) {
    st.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, ind.as_int())), ' ');
  } else if (ind.is_string()) {
    st.indent = ind.as_string();
  } else if (!ind.is_none()) {
    fail("tojson(): indent must be an integer, a string or none");
  }
  const Value seps = p.get(2, "separators", Value::none());
  if (seps.is_array()) {
    if (seps.as_array().size() != 2 || !seps.as_array()[0].is_string() ||
        !seps.as_array()[1].is_string()) {
      fail("tojson(): separators must be a pair of strings");
    }
    st.item_sep = seps.as_array()[0].as_string();
    st.key_sep = seps.as_array()[1].as_string();
  }
  st.sort_keys = p.flag(3, "sort_keys", false);
  return Value(python_json_dumps(v, st));
}

}  // namespace

Value apply_filter(Interpreter& in, const std::string& name, const Value& v, CallArgs& a) {
  Params p(a, name);
  const auto text = [&]() { return v.str(); };
  if (name == "trim") {
    const Value chars = p.get(0, "chars", Value::none());
    const std::string s = text();
    return Value(chars.is_string() ? strip(s, &chars.as_string(), true, true)
                                   : strip(s, nullptr, true, true));
  }
  if (name == "lower") return Value(lower(text()));
  if (name == "upper") return Value(upper(text()));
  if (name == "capitalize") return Value(capitalize(text()));
  if (name == "title") {
    // jinja2's title: chunks split at runs of whitespace, '-', '(', '{', '[' or '<'; each
    // chunk's first character upper-cased and the rest lower-cased.
    const std::string s = text();
    std::string out;
    std::string chunk;
    const auto flush = [&] {
      if (chunk.empty()) return;
      const std::string_view first = utf8_chars(chunk)[0];
      out += upper(std::string(first)) + lower(chunk.substr(first.size()));
      chunk.clear();
    };
    for (std::string_view ch : utf8_chars(s)) {
      const bool sep =
          is_python_space(ch) || ch == "-" || ch == "(" || ch == "{" || ch == "[" || ch == "<";
      if (sep) {
        flush();
        out += ch;
      } else {
        chunk += ch;
      }
    }
    flush();
    return Value(std::move(out));
  }
  if (name == "length" || name == "count") return Value(static_cast<int64_t>(length(v)));
  if (name == "string") return Value(text());
  if (name == "safe") return Value(text());
  if (name == "escape" || name == "e" || name == "forceescape") return Value(html_escape(text()));
  if (name == "default" || name == "d") {
    const bool boolean = p.flag(1, "boolean", false);
    if (v.is_undefined() || (boolean && !v.truthy())) return p.get(0, "default_value", Value(""));
    return v;
  }
  if (name == "first" || name == "last") {
    if (v.is_undefined()) return Value::undefined("no " + name + " item, the value is undefined");
    const Array items = iterate(v);
    if (items.empty()) return Value::undefined("no " + name + " item, sequence was empty");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value(iterate(v));
  if (name == "items") {
    if (v.is_undefined()) return Value(Array{});
    if (!v.is_object() || v.as_object().is_namespace)
      fail("Can only get item pairs from a mapping.");
    Array out;
    for (const auto& [k, val] : v.as_object().items)
      out.push_back(Value::tuple(Array{Value(k), val}));
    return Value(std::move(out));
  }
  if (name == "join") {
    const std::string sep = p.str(0, "d", "");
    const Value attr = p.get(1, "attribute", Value::none());
    std::string out;
    bool firstp = true;
    for (const Value& item : iterate(v)) {
      if (!firstp) out += sep;
      firstp = false;
      out += (attr.is_none() ? item : attribute_path(in, item, attr.str())).str();
      in.check_size(out.size());
    }
    return Value(std::move(out));
  }
  if (name == "tojson") return dumps_filter(v, p);
  if (name == "replace") {
    const Value& old = p.need(0, "old");
    const Value& with = p.need(1, "new");
    return Value(replace(text(), old.str(), with.str(), p.integer(2, "count", -1), in));
  }
  if (name == "int") {
    const int64_t dflt = p.integer(0, "default", 0);
    const int64_t base = p.integer(1, "base", 10);
    if (v.is_int() || v.is_bool()) return Value(v.as_int());
    if (v.is_float())
      return std::isfinite(v.as_double()) ? Value(static_cast<int64_t>(v.as_double()))
                                          : Value(dflt);
    if (v.is_string()) {
      if (auto i = parse_int(v.as_string(), base)) return Value(*i);
      if (auto f = parse_float(v.as_string()); f && std::isfinite(*f)) {
        return Value(static_cast<int64_t>(*f));
      }
    }
    return Value(dflt);
  }
  if (name == "float") {
    const Value dflt = p.get(0, "default", Value(0.0));
    if (v.is_number()) return Value(v.as_double());
    if (v.is_string()) {
      if (auto f = parse_float(v.as_string())) return Value(*f);
    }
    return dflt;
  }
  if (name == "abs") {
    if (v.is_float()) return Value(std::fabs(v.as_double()));
    if (v.is_int() || v.is_bool()) return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
    fail(std::string("bad operand type for abs(): '") + v.type_name() + "'");
  }
  if (name == "round") {
    const int64_t prec = p.integer(0, "precision", 0);
    const std::string method = p.str(1, "method", "common");
    if (!v.is_number()) fail("round(): the value must be a number");
    if (method == "common") {
      if (!v.is_float()) return Value(v.as_int());  // round(int, n) stays an int
      return Value(python_round(v.as_double(), prec));
    }
    const double f = std::pow(10.0, static_cast<double>(prec));
    if (method == "floor") return Value(std::floor(v.as_double() * f) / f);
    if (method == "ceil") return Value(std::ceil(v.as_double() * f) / f);
    fail("round(): method must be 'common', 'ceil' or 'floor'");
  }
  if (name == "attr") {
    // jinja2's attr filter is Python's getattr only: a dict's keys are not attributes.
    const std::string attr = p.need(0, "name").str();
    if (v.is_object() && !v.as_object().is_namespace && !has_method(v, attr)) {
      return Value::undefined("'dict object' has no attribute '" + attr + "'");
    }
    return in.getattr(v, attr);
  }
  if (name == "map") {
    Array out;
    const Value* attr = p.find(kKeywordOnly, "attribute");
    for (const Value& item : iterate(v)) {
      if (attr != nullptr) {
        Value r = attribute_path(in, item, attr->str());
        if (r.is_undefined()) r = p.get(kKeywordOnly, "default", r);
        out.push_back(std::move(r));
      } else {
        if (a.args.empty() || !a.args[0].is_string())
          fail("map(): expected a filter name or attribute=");
        CallArgs fa = rest_args(a, 1);
        out.push_back(apply_filter(in, a.args[0].as_string(), item, fa));
      }
    }
    return Value(std::move(out));
  }
  if (name == "select") return select_like(in, v, a, false, true);
  if (name == "reject") return select_like(in, v, a, false, false);
  if (name == "selectattr") return select_like(in, v, a, true, true);
  if (name == "rejectattr") return select_like(in, v, a, true, false);
  if (name == "unique") {
    const bool cs = p.flag(0, "case_sensitive", false);
    const Value attr = p.get(1, "attribute", Value::none());
    Array out;
    Array seen;
    for (const Value& item : iterate(v)) {
      const Value key = sort_key(attr.is_none() ? item : attribute_path(in, item, attr.str()), cs);
      bool dup = false;
      for (const Value& s : seen) dup = dup || s.equals(key);
      if (!dup) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    return Value(std::move(out));
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::vector<std::string_view> cs = utf8_chars(v.as_string());
      std::string out;
      for (auto it = cs.rbegin(); it != cs.rend(); ++it) out += *it;
      return Value(std::move(out));
    }
    Array items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "sort") {
    const bool rev = p.flag(0, "reverse", false);
    const bool cs = p.flag(1, "case_sensitive", false);
    const Value attr = p.get(2, "attribute", Value::none());
    Array items = iterate(v);
    std::vector<std::pair<Value, size_t>> keyed;
    for (size_t i = 0; i < items.size(); ++i) {
      keyed.emplace_back(
          sort_key(attr.is_none() ? items[i] : attribute_path(in, items[i], attr.str()), cs), i);
    }
    std::stable_sort(keyed.begin(), keyed.end(), [rev](const auto& x, const auto& y) {
      return rev ? less(y.first, x.first) : less(x.first, y.first);
    });
    Array out;
    for (const auto& [_, i] : keyed) out.push_back(items[i]);
    return Value(std::move(out));
  }
  if (name == "dictsort") {
    if (!v.is_object()) fail("dictsort(): the value must be a mapping");
    const bool cs = p.flag(0, "case_sensitive", false);
    const std::string by = p.str(1, "by", "key");
    const bool rev = p.flag(2, "reverse", false);
    if (by != "key" && by != "value") fail("dictsort(): 'by' must be 'key' or 'value'");
    Array pairs;
    for (const auto& [k, val] : v.as_object().items)
      pairs.push_back(Value::tuple(Array{Value(k), val}));
    const size_t idx = by == "key" ? 0 : 1;
    std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
      const Value kx = sort_key(x.as_array()[idx], cs);
      const Value ky = sort_key(y.as_array()[idx], cs);
      return rev ? less(ky, kx) : less(kx, ky);
    });
    return Value(std::move(pairs));
  }
  if (name == "sum") {
    const Value attr = p.get(0, "attribute", Value::none());
    Value acc = p.get(1, "start", Value(0));
    for (const Value& item : iterate(v)) {
      acc = binary_op("+", acc, attr.is_none() ? item : attribute_path(in, item, attr.str()), in);
    }
    return acc;
  }
  if (name == "min" || name == "max") {
    const bool cs = p.flag(0, "case_sensitive", false);
    const Value attr = p.get(1, "attribute", Value::none());
    const Array items = iterate(v);
    if (items.empty()) return Value::undefined("no " + name + " item, sequence was empty");
    size_t best = 0;
    for (size_t i = 1; i < items.size(); ++i) {
      const Value a1 =
          sort_key(attr.is_none() ? items[i] : attribute_path(in, items[i], attr.str()), cs);
      const Value b1 =
          sort_key(attr.is_none() ? items[best] : attribute_path(in, items[best], attr.str()), cs);
      if (name == "min" ? less(a1, b1) : less(b1, a1)) best = i;
    }
    return items[best];
  }
  if (name == "indent") {
    return Value(indent(text(), p.get(0, "width", Value(4)), p.flag(1, "first", false),
                        p.flag(2, "blank", false)));
  }
  if (name == "format") {
    // jinja2's format filter: printf-style with the filter's arguments (or keyword arguments).
    if (!a.kwargs.empty()) {
      if (!a.args.empty()) fail("format(): positional and keyword arguments cannot be mixed");
      auto o = std::make_shared<Object>();
      for (const auto& [k, val] : a.kwargs) o->set(k, val);
      return Value(python_percent_format(text(), Value(std::move(o))));
    }
    return Value(python_percent_format(text(), Value::tuple(a.args)));
  }
  if (name == "wordcount")
    return Value(static_cast<int64_t>(split(text(), Value::none(), -1).size()));
  fail("no filter named '" + name + "'");
}

bool apply_test(Interpreter& in, const std::string& name, const Value& v, CallArgs& a) {
  Params p(a, name);
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "mapping") return v.is_object() && !v.as_object().is_namespace;
  if (name == "callable") return v.is_callable();
  // Python: str, list, dict (and jinja2's Undefined) are iterable and sequences.
  if (name == "iterable") {
    return v.is_string() || v.is_array() || (v.is_object() && !v.as_object().is_namespace) ||
           v.is_undefined();
  }
  if (name == "sequence") {
    return v.is_string() || v.is_array() || (v.is_object() && !v.as_object().is_namespace) ||
           v.is_undefined();
  }
  if (name == "lower") return v.is_string() && lower(v.as_string()) == v.as_string();
  if (name == "upper") return v.is_string() && upper(v.as_string()) == v.as_string();
  if (name == "escaped") return false;
  if (name == "odd" || name == "even") {
    if (!v.is_int() && !v.is_bool()) fail("the odd/even tests need an integer");
    const bool odd = (v.as_int() % 2) != 0;
    return name == "odd" ? odd : !odd;
  }
  if (name == "divisibleby") {
    const Value& n = p.need(0, "num");
    const Value r = binary_op("%", v, n, in);
    return r.is_float() ? r.as_double() == 0 : r.as_int() == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==")
    return compare_op("==", v, p.need(0, "other"));
  if (name == "ne" || name == "!=") return compare_op("!=", v, p.need(0, "other"));
  if (name == "lt" || name == "<" || name == "lessthan")
    return compare_op("<", v, p.need(0, "other"));
  if (name == "le" || name == "<=") return compare_op("<=", v, p.need(0, "other"));
  if (name == "gt" || name == ">" || name == "greaterthan")
    return compare_op(">", v, p.need(0, "other"));
  if (name == "ge" || name == ">=") return compare_op(">=", v, p.need(0, "other"));
  if (name == "in") return compare_op("in", v, p.need(0, "seq"));
  if (name == "sameas") {
    // Python's `is`: the same object for lists, dicts and callables; None, booleans and
    // equal small values of one kind count as the same.
    const Value& o = p.need(0, "other");
    if (v.kind() != o.kind()) return false;
    if (v.is_array() || v.is_object() || v.is_callable()) return v.identity() == o.identity();
    return v.equals(o);
  }
  fail("no test named '" + name + "'");
}

bool is_known_filter(std::string_view name) {
  static constexpr std::string_view kFilters[] = {
      "trim",   "lower",      "upper",      "capitalize", "title",       "length",  "count",
      "string", "safe",       "escape",     "e",          "forceescape", "default", "d",
      "first",  "last",       "list",       "items",      "join",        "tojson",  "replace",
      "int",    "float",      "abs",        "round",      "attr",        "map",     "select",
      "reject", "selectattr", "rejectattr", "unique",     "reverse",     "sort",    "dictsort",
      "sum",    "min",        "max",        "indent",     "wordcount",   "format"};
  return std::find(std::begin(kFilters), std::end(kFilters), name) != std::end(kFilters);
}

bool is_known_test(std::string_view name) {
  static constexpr std::string_view kTests[] = {
      "defined", "undefined", "none",    "boolean", "true",        "false",       "string",
      "number",  "integer",   "float",   "mapping", "callable",    "iterable",    "sequence",
      "lower",   "upper",     "escaped", "odd",     "even",        "divisibleby", "eq",
      "equalto", "==",        "ne",      "!=",      "lt",          "<",           "lessthan",
      "le",      "<=",        "gt",      ">",       "greaterthan", "ge",          ">=",
      "in",      "sameas"};
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}

bool has_method(const Value& obj, const std::string& name) {
  static constexpr std::string_view kStr[] = {
      "strip", "lstrip", "rstrip",  "split",      "rsplit",  "splitlines", "startswith", "endswith",
      "upper", "lower",  "title",   "capitalize", "replace", "find",       "rfind",      "count",
      "join",  "format", "isdigit", "isalpha",    "isalnum", "isspace",    "isupper",    "islower"};
  static constexpr std::string_view kDict[] = {"items", "keys",    "values", "get",        "copy",
                                               "pop",   "popitem", "update", "setdefault", "clear"};
  static constexpr std::string_view kList[] = {"index", "count",   "copy",   "append",
                                               "pop",   "extend",  "insert", "remove",
                                               "clear", "reverse", "sort"};
  const auto in = [&](const auto& table) {
    return std::find(std::begin(table), std::end(table), name) != std::end(table);
  };
  if (obj.is_string()) return in(kStr);
  if (obj.is_object()) return !obj.as_object().is_namespace && in(kDict);
  if (obj.is_array()) return in(kList);
  return false;
}

Value call_method(Interpreter& in, const Value& obj, const std::string& name, CallArgs& a) {
  Params p(a, name);
  if (obj.is_object()) {
    const Object& o = obj.as_object();
    if (name == "items") {
      Array out;
      for (const auto& [k, v] : o.items) out.push_back(Value::tuple(Array{Value(k), v}));
      return Value(std::move(out));
    }
    if (name == "keys" || name == "values") {
      Array out;
      for (const auto& [k, v] : o.items) out.push_back(name == "keys" ? Value(k) : v);
      return Value(std::move(out));
    }
    if (name == "get") {
      const Value& key = p.need(0, "key");
      if (key.is_string()) {
        if (const Value* v = o.find(key.as_string())) return *v;
      }
      return p.get(1, "default", Value::none());
    }
    if (name == "copy") return Value(std::make_shared<Object>(o));
    fail("access to attribute '" + name +
         "' of 'dict' object is unsafe (the template sandbox "
         "is immutable)");
  }
  if (obj.is_array()) {
    const Array& arr = obj.as_array();
    if (name == "count") {
      const Value& x = p.need(0, "value");
      return Value(static_cast<int64_t>(
          std::count_if(arr.begin(), arr.end(), [&](const Value& e) { return e.equals(x); })));
    }
    if (name == "index") {
      const Value& x = p.need(0, "value");
      for (size_t i = 0; i < arr.size(); ++i) {
        if (arr[i].equals(x)) return Value(static_cast<int64_t>(i));
      }
      fail(x.repr() + " is not in list");
    }
    if (name == "copy") return obj;
    fail("access to attribute '" + name +
         "' of 'list' object is unsafe (the template sandbox "
         "is immutable)");
  }
  const std::string& s = obj.as_string();
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Value chars = p.get(0, "chars", Value::none());
    const std::string* cs = chars.is_string() ? &chars.as_string() : nullptr;
    return Value(strip(s, cs, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    const Value sep = p.get(0, "sep", Value::none());
    const int64_t maxsplit = p.integer(1, "maxsplit", -1);
    if (name == "rsplit" && maxsplit >= 0) fail("rsplit() with maxsplit is not supported");
    return Value(split(s, sep, maxsplit));
  }
  if (name == "splitlines") {
    Array out;
    for (std::string& l : splitlines(s)) out.emplace_back(std::move(l));
    return Value(std::move(out));
  }
  if (name == "startswith" || name == "endswith") {
    return Value(starts_or_ends(s, p.need(0, "prefix"), name == "startswith"));
  }
  if (name == "upper") return Value(upper(s));
  if (name == "lower") return Value(lower(s));
  if (name == "title") return Value(title(s));
  if (name == "capitalize") return Value(capitalize(s));
  if (name == "replace") {
    return Value(
        replace(s, p.need(0, "old").str(), p.need(1, "new").str(), p.integer(2, "count", -1), in));
  }
  if (name == "find" || name == "rfind" || name == "count") {
    const Value& sub = p.need(0, "sub");
    if (!sub.is_string()) fail(name + "() takes a string");
    const std::string& t = sub.as_string();
    if (name == "count") {
      if (t.empty()) return Value(static_cast<int64_t>(utf8_length(s) + 1));
      int64_t n = 0;
      for (size_t at = s.find(t); at != std::string::npos; at = s.find(t, at + t.size())) ++n;
      return Value(n);
    }
    const size_t at = name == "find" ? s.find(t) : s.rfind(t);
    if (at == std::string::npos) return Value(-1);
    return Value(static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, at))));
  }
  if (name == "join") {
    std::string out;
    bool firstp = true;
    for (const Value& item : iterate(p.need(0, "iterable"))) {
      if (!item.is_string()) fail(std::string("join(): expected str, found ") + item.type_name());
      if (!firstp) out += s;
      firstp = false;
      out += item.as_string();
      in.check_size(out.size());
    }
    return Value(std::move(out));
  }
  if (name == "format") return Value(format(s, p, a));
  const auto all = [&](auto pred) {
    if (s.empty()) return false;
    return std::all_of(s.begin(), s.end(), pred);
  };
  if (name == "isdigit") return Value(all([](char c) { return c >= '0' && c <= '9'; }));
  if (name == "isalpha") return Value(all([](char c) { return ascii_alpha(c); }));
  if (name == "isalnum") {
    return Value(all([](char c) { return ascii_alpha(c) || (c >= '0' && c <= '9'); }));
  }
  if (name == "isspace") {
    const auto cs = utf8_chars(s);
    return Value(!cs.empty() && std::all_of(cs.begin(), cs.end(), is_python_space));
  }
  if (name == "isupper" || name == "islower") {
    const bool any_alpha = std::any_of(s.begin(), s.end(), ascii_alpha);
    return Value(any_alpha && (name == "isupper" ? upper(s) == s : lower(s) == s));
  }
  fail("'str' object has no attribute '" + name + "'");
}

void add_globals(Scope& s) {
  const auto def = [&](const std::string& name, Function fn) {
    auto c = std::make_shared<Callable>();
    c->name = name;
    c->fn = std::move(fn);
    s.set(name, Value(std::move(c)));
  };
  def("range", [](Interpreter&, CallArgs& a) -> Value {
    if (!a.kwargs.empty() || a.args.empty() || a.args.size() > 3) {
      fail("range() takes 1 to 3 integer arguments");
    }
    for (const Value& v : a.args) {
      if (!v.is_int() && !v.is_bool()) fail("range() arguments must be integers");
    }
    int64_t start = 0;
    int64_t stop = 0;
    int64_t step = 1;
    if (a.args.size() == 1) {
      stop = a.args[0].as_int();
    } else {
      start = a.args[0].as_int();
      stop = a.args[1].as_int();
      if (a.args.size() == 3) step = a.args[2].as_int();
    }
    if (step == 0) fail("range() arg 3 must not be zero");
    // jinja2's sandbox refuses ranges longer than MAX_RANGE (100000).
    const double n = std::max(0.0, std::ceil((double(stop) - double(start)) / double(step)));
    if (n > 100000) fail("range too big (the sandbox allows at most 100000 items)");
    Array out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.emplace_back(i);
    return Value(std::move(out));
  });
  def("namespace", [](Interpreter& in, CallArgs& a) -> Value {
    auto o = std::make_shared<Object>();
    o->is_namespace = true;
    in.track_namespace(o);
    for (const Value& v : a.args) {
      if (!v.is_object()) fail("namespace() takes a mapping or keyword arguments");
      for (const auto& [k, val] : v.as_object().items) o->set(k, val);
    }
    for (const auto& [k, v] : a.kwargs) o->set(k, v);
    return Value(std::move(o));
  });
  def("dict", [](Interpreter&, CallArgs& a) -> Value {
    auto o = std::make_shared<Object>();
    for (const Value& v : a.args) {
      if (!v.is_object()) fail("dict() takes a mapping or keyword arguments");
      for (const auto& [k, val] : v.as_object().items) o->set(k, val);
    }
    for (const auto& [k, v] : a.kwargs) o->set(k, v);
    return Value(std::move(o));
  });
  // jinja2's default globals a template may test with `is defined`.
  def("joiner", [](Interpreter&, CallArgs& a) -> Value {
    const std::string sep = a.args.empty() ? std::string(", ") : a.args[0].str();
    auto used = std::make_shared<bool>(false);
    auto c = std::make_shared<Callable>();
    c->name = "joiner";
    c->fn = [sep, used](Interpreter&, CallArgs&) -> Value {
      if (!*used) {
        *used = true;
        return Value(std::string());
      }
      return Value(sep);
    };
    return Value(std::move(c));
  });
  for (const char* unsupported : {"lipsum", "cycler"}) {
    def(unsupported, [unsupported](Interpreter&, CallArgs&) -> Value {
      fail(std::string(unsupported) + "() is not supported by BIE's template engine");
    });
  }
  def("raise_exception", [](Interpreter&, CallArgs& a) -> Value {
    fail(a.args.empty() ? std::string("raise_exception() called") : a.args[0].str());
  });
  def("strftime_now", [](Interpreter& in, CallArgs& a) -> Value {
    if (a.args.empty() || !a.args[0].is_string()) fail("strftime_now() takes a format string");
    const std::tm tm = in.now();
    char buf[512];
    const size_t n = std::strftime(buf, sizeof buf, a.args[0].as_string().c_str(), &tm);
    return Value(std::string(buf, n));
  });
}

}  // namespace bie::jinja
