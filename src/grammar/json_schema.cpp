#include "bie/grammar/json_schema.h"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "bie/grammar/json_pattern.h"

namespace bie::grammar {
namespace {

// ordered_json: properties are generated in the order the schema declares them.
using json = nlohmann::ordered_json;
using Seq = Grammar::Seq;

// Integers are limited to 18 digits (every one fits in int64; JSON parsers keep them exact).
constexpr int64_t kIntCap = 999'999'999'999'999'999;

// Keywords that carry no constraint; everything else must be understood or it is an error.
const std::set<std::string, std::less<>> kAnnotations = {
    "title",   "description", "$schema",  "$id",       "$comment", "examples",
    "default", "deprecated",  "readOnly", "writeOnly", "$defs",    "definitions"};
const std::set<std::string, std::less<>> kTypeKeywords = {
    "properties", "required",         "additionalProperties",
    "items",      "minItems",         "maxItems",
    "minLength",  "maxLength",        "minimum",
    "maximum",    "exclusiveMinimum", "exclusiveMaximum",
    "pattern"};
const std::set<std::string, std::less<>> kCombinators = {"type",  "enum",  "const", "anyOf",
                                                         "oneOf", "allOf", "$ref"};

// One inclusive digit range per position: a pattern of decimal numbers of fixed length.
using DigitPattern = std::vector<std::pair<char, char>>;

// Decimal patterns covering exactly [lo, hi]; lo and hi have the same number of digits.
void same_length_patterns(DigitPattern prefix, const std::string& lo, const std::string& hi,
                          std::vector<DigitPattern>& out) {
  if (lo.empty()) {
    out.push_back(std::move(prefix));
    return;
  }
  const size_t n = lo.size();
  const std::string rest_lo = lo.substr(1), rest_hi = hi.substr(1);
  if (lo[0] == hi[0]) {
    prefix.push_back({lo[0], lo[0]});
    same_length_patterns(std::move(prefix), rest_lo, rest_hi, out);
    return;
  }
  const bool lo_min = rest_lo == std::string(n - 1, '0');
  const bool hi_max = rest_hi == std::string(n - 1, '9');
  if (lo_min && hi_max) {  // a whole block: [lo0-hi0][0-9]...
    prefix.push_back({lo[0], hi[0]});
    for (size_t i = 1; i < n; ++i) prefix.push_back({'0', '9'});
    out.push_back(std::move(prefix));
    return;
  }
  DigitPattern p = prefix;
  p.push_back({lo[0], lo[0]});
  same_length_patterns(p, rest_lo, std::string(n - 1, '9'), out);
  if (hi[0] - lo[0] >= 2) {
    p = prefix;
    p.push_back({static_cast<char>(lo[0] + 1), static_cast<char>(hi[0] - 1)});
    for (size_t i = 1; i < n; ++i) p.push_back({'0', '9'});
    out.push_back(std::move(p));
  }
  p = prefix;
  p.push_back({hi[0], hi[0]});
  same_length_patterns(p, std::string(n - 1, '0'), rest_hi, out);
}

// Decimal patterns (no leading zeros) matching exactly the integers in [lo, hi], 0 <= lo <= hi.
std::vector<DigitPattern> range_patterns(int64_t lo, int64_t hi) {
  std::vector<DigitPattern> out;
  const std::string a = std::to_string(lo), b = std::to_string(hi);
  for (size_t n = a.size(); n <= b.size(); ++n) {
    const std::string lo_n = n == a.size() ? a : "1" + std::string(n - 1, '0');
    const std::string hi_n = n == b.size() ? b : std::string(n, '9');
    same_length_patterns({}, lo_n, hi_n, out);
  }
  return out;
}

struct Bound {
  double value = 0.0;
  bool exclusive = false;
};

class Compiler {
 public:
  Compiler(const json& root, const JsonSchemaOptions& o) : root_(root), o_(o) {}

  Result<Grammar> compile() {
    const auto top = value(root_, "#", 0);
    if (!top) return Error{error_};
    uint32_t root = *top;
    if (!o_.prefix.empty() || !o_.suffix.empty()) {
      Seq framed = g_.literal(o_.prefix);
      framed.push_back(Grammar::ref(root));
      const Seq tail = g_.literal(o_.suffix);
      framed.insert(framed.end(), tail.begin(), tail.end());
      root = g_.add_rule({framed});
    }
    g_.set_root(root);
    if (Status s = g_.check(); !s.ok()) return Error{s.error()};
    return std::move(g_);
  }

  Grammar json_object() {
    g_.set_root(any_object());
    return std::move(g_);
  }

 private:
  std::nullopt_t fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return std::nullopt;
  }

  // ---- shared building blocks -------------------------------------------------------------
  Grammar::Sym ws() {
    if (!ws_) {
      std::vector<Seq> alts;
      Seq seq;
      const Grammar::Sym w = g_.byte_set(set_of(" \n"));
      for (int k = 0; k <= o_.max_whitespace; ++k) {
        alts.push_back(seq);
        seq.push_back(w);
      }
      ws_ = g_.add_rule(alts);
    }
    return Grammar::ref(*ws_);
  }

  static ByteSet set_of(std::string_view bytes) {
    ByteSet s{};
    for (char c : bytes) {
      const auto b = static_cast<uint8_t>(c);
      s[b >> 6] |= uint64_t{1} << (b & 63);
    }
    return s;
  }

  // One non-ASCII character as well-formed UTF-8 (no overlong forms, no surrogates).
  Grammar::Sym utf8_multibyte() {
    if (!multibyte_) {
      const auto r = [&](uint8_t lo, uint8_t hi) { return g_.byte_range(lo, hi); };
      const auto c = r(0x80, 0xBF);
      multibyte_ = g_.add_rule({{r(0xC2, 0xDF), c},
                                {r(0xE0, 0xE0), r(0xA0, 0xBF), c},
                                {r(0xE1, 0xEC), c, c},
                                {r(0xED, 0xED), r(0x80, 0x9F), c},
                                {r(0xEE, 0xEF), c, c},
                                {r(0xF0, 0xF0), r(0x90, 0xBF), c, c},
                                {r(0xF1, 0xF3), c, c, c},
                                {r(0xF4, 0xF4), r(0x80, 0x8F), c, c}});
    }
    return Grammar::ref(*multibyte_);
  }

  // One character of a JSON string: well-formed UTF-8 (no overlongs or surrogates) except '"',
  // '\\' and control bytes, or an escape. \u escapes of surrogates are excluded so that every
  // string decodes (a lone surrogate is rejected by strict parsers).
  Grammar::Sym string_char() {
    if (!char_) {
      ByteSet plain{};
      for (unsigned b = 0x20; b < 0x80; ++b) {
        if (b != '"' && b != '\\') plain[b >> 6] |= uint64_t{1} << (b & 63);
      }
      const auto r = [&](uint8_t lo, uint8_t hi) { return g_.byte_range(lo, hi); };
      const auto hex = g_.byte_set(set_of("0123456789abcdefABCDEF"));
      const auto hex_no_d = g_.byte_set(set_of("0123456789abcefABCEF"));
      const auto bs = r('\\', '\\');
      const auto u = r('u', 'u');
      char_ = g_.add_rule({{g_.byte_set(plain)},
                           {utf8_multibyte()},
                           {bs, g_.byte_set(set_of("\"\\/bfnrt"))},
                           {bs, u, hex_no_d, hex, hex, hex},
                           {bs, u, g_.byte_set(set_of("dD")), r('0', '7'), hex, hex}});
    }
    return Grammar::ref(*char_);
  }

  // `item` repeated min..max times (max < 0: unbounded), as right-recursive rules.
  std::optional<Seq> repeat(const Seq& item, int64_t min, int64_t max, const std::string& path) {
    if (min > o_.max_repeat || max > o_.max_repeat) {
      return fail(
          fmt::format("length/item bound above {} at {} is not supported", o_.max_repeat, path));
    }
    Seq out = g_.repeat(item, min, max);
    if (g_.n_elems() > Grammar::kMaxElems) return fail(too_large());
    return out;
  }

  static std::string too_large() {
    return fmt::format(
        "the schema is too large for grammar-constrained decoding (limit {} "
        "grammar elements); lower maxLength/maxItems or simplify it",
        Grammar::kMaxElems);
  }

  uint32_t string_rule(int64_t min, int64_t max, const std::string& path, bool& ok) {
    auto body = repeat({string_char()}, min, max, path);
    ok = body.has_value();
    if (!ok) return 0;
    Seq seq = g_.literal("\"");
    seq.insert(seq.end(), body->begin(), body->end());
    seq.push_back(g_.literal("\"")[0]);
    return g_.add_rule({seq});
  }

  Seq digits_seq(const DigitPattern& p) {
    Seq s;
    for (auto [lo, hi] : p)
      s.push_back(g_.byte_range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)));
    return s;
  }

  // Alternatives for the integers in [lo, hi] (any signs).
  std::vector<Seq> integer_alts(int64_t lo, int64_t hi) {
    std::vector<Seq> alts;
    if (lo < 0) {
      for (const DigitPattern& p :
           range_patterns(std::max<int64_t>(1, -std::min<int64_t>(hi, -1)), -lo)) {
        Seq s = g_.literal("-");
        const Seq d = digits_seq(p);
        s.insert(s.end(), d.begin(), d.end());
        alts.push_back(std::move(s));
      }
    }
    if (hi >= 0) {
      for (const DigitPattern& p : range_patterns(std::max<int64_t>(lo, 0), hi))
        alts.push_back(digits_seq(p));
    }
    return alts;
  }

  Grammar::Sym fraction() {
    if (!frac_) {
      Seq dot = g_.literal(".");
      const Grammar::Sym digit = g_.byte_range('0', '9');
      auto digits = repeat({digit}, 1, o_.max_fraction_digits, "#");
      dot.insert(dot.end(), digits->begin(), digits->end());
      frac_ = g_.add_rule({dot, {}});  // optional
    }
    return Grammar::ref(*frac_);
  }

  // Non-negative magnitudes m with lo (<, <=) m (<, <=) hi (hi absent: up to the 18-digit cap)
  // as integer part + optional fraction. Conservative where the fraction would need a bound
  // of its own: a lower bound rounds the integer part up, and an inclusive upper bound allows
  // no fraction on its integer part. Every generated value satisfies the bounds.
  void magnitude_alts(Bound lo, std::optional<Bound> hi, const Seq& prefix,
                      std::vector<Seq>& alts) {
    const auto add = [&](int64_t a, int64_t b, bool with_fraction) {
      if (a > b) return;
      for (const DigitPattern& p : range_patterns(a, b)) {
        Seq s = prefix;
        const Seq d = digits_seq(p);
        s.insert(s.end(), d.begin(), d.end());
        if (with_fraction) s.push_back(fraction());
        alts.push_back(std::move(s));
      }
    };
    const double lo_i = lo.exclusive ? std::floor(lo.value) + 1 : std::ceil(lo.value);
    if (lo_i > static_cast<double>(kIntCap)) return;
    const auto i_min = static_cast<int64_t>(std::max(0.0, lo_i));
    if (!hi || hi->value > static_cast<double>(kIntCap)) {
      add(i_min, kIntCap, true);
    } else if (hi->exclusive && hi->value == std::floor(hi->value)) {
      add(i_min, static_cast<int64_t>(hi->value) - 1, true);
    } else {
      const auto i_max = static_cast<int64_t>(std::floor(hi->value));
      add(i_min, i_max - 1, true);
      add(std::max(i_min, i_max), i_max, false);
    }
  }

  // minimum / exclusiveMinimum (number, or draft-4 boolean) into one bound, the tighter one.
  std::optional<std::optional<Bound>> read_bound(const json& s, const char* inclusive,
                                                 const char* exclusive, bool lower,
                                                 const std::string& path) {
    std::optional<Bound> b;
    const auto tighter = [&](Bound c) {
      if (!b)
        b = c;
      else if (lower ? (c.value > b->value || (c.value == b->value && c.exclusive))
                     : (c.value < b->value || (c.value == b->value && c.exclusive)))
        b = c;
    };
    bool draft4_exclusive = false;
    if (auto it = s.find(exclusive); it != s.end()) {
      if (it->is_boolean())
        draft4_exclusive = it->get<bool>();
      else if (it->is_number())
        tighter({it->get<double>(), true});
      else
        return fail(fmt::format("'{}' at {} must be a number", exclusive, path));
    }
    if (auto it = s.find(inclusive); it != s.end()) {
      if (!it->is_number())
        return fail(fmt::format("'{}' at {} must be a number", inclusive, path));
      tighter({it->get<double>(), draft4_exclusive});
    }
    return b;
  }

  std::optional<uint32_t> number(const json& s, bool integer, const std::string& path) {
    const auto lo = read_bound(s, "minimum", "exclusiveMinimum", true, path);
    const auto hi = read_bound(s, "maximum", "exclusiveMaximum", false, path);
    if (!lo || !hi) return std::nullopt;
    std::vector<Seq> alts;
    if (integer) {
      int64_t a = -kIntCap, b = kIntCap;
      if (*lo)
        a = static_cast<int64_t>(
            std::clamp((*lo)->exclusive ? std::floor((*lo)->value) + 1 : std::ceil((*lo)->value),
                       -1e18, 1e18));
      if (*hi)
        b = static_cast<int64_t>(
            std::clamp((*hi)->exclusive ? std::ceil((*hi)->value) - 1 : std::floor((*hi)->value),
                       -1e18, 1e18));
      a = std::clamp(a, -kIntCap, kIntCap);
      b = std::clamp(b, -kIntCap, kIntCap);
      if (a <= b) alts = integer_alts(a, b);
    } else if (!*lo && !*hi) {
      // Unbounded: the full JSON number syntax, with bounded digit counts.
      return any_number();
    } else {
      // x >= 0 part: magnitude in [max(lo, 0), hi]; x < 0 part: "-" magnitude in [-hi, -lo].
      if (!*hi || (*hi)->value > 0 || ((*hi)->value == 0 && !(*hi)->exclusive)) {
        Bound m_lo{0.0, false};
        if (*lo && (*lo)->value >= 0) m_lo = **lo;
        magnitude_alts(m_lo, *hi, {}, alts);
      }
      if (!*lo || (*lo)->value < 0) {
        Bound m_lo{0.0, false};
        if (*hi && (*hi)->value <= 0) m_lo = {-(*hi)->value, (*hi)->exclusive};
        std::optional<Bound> m_hi;
        if (*lo) m_hi = Bound{-(*lo)->value, (*lo)->exclusive};
        magnitude_alts(m_lo, m_hi, g_.literal("-"), alts);
      }
    }
    if (alts.empty())
      return fail(
          fmt::format("no {} satisfies the bounds at {}", integer ? "integer" : "number", path));
    return g_.add_rule(alts);
  }

  uint32_t any_number() {
    if (!number_) {
      const Grammar::Sym digit = g_.byte_range('0', '9');
      Seq int_part = g_.literal("-");
      const uint32_t sign = g_.add_rule({int_part, {}});
      Seq nonzero = {g_.byte_range('1', '9')};
      const Seq more = *repeat({digit}, 0, 17, "#");
      nonzero.insert(nonzero.end(), more.begin(), more.end());
      const uint32_t integer = g_.add_rule({g_.literal("0"), nonzero});
      Seq e = {g_.byte_set(set_of("eE")),
               Grammar::ref(g_.add_rule({g_.literal("+"), g_.literal("-"), {}}))};
      const Seq e_digits = *repeat({digit}, 1, 2, "#");
      e.insert(e.end(), e_digits.begin(), e_digits.end());
      const uint32_t exponent = g_.add_rule({e, {}});
      number_ = g_.add_rule(
          {{Grammar::ref(sign), Grammar::ref(integer), fraction(), Grammar::ref(exponent)}});
    }
    return *number_;
  }

  // Any JSON value / object / array (the {} schema and json_object mode). Recursive: nesting
  // depth is bounded by max_tokens, not by the grammar.
  uint32_t any_value() {
    if (any_value_) return *any_value_;
    any_value_ = g_.reserve_rule();
    const uint32_t object = any_object();
    const uint32_t array = g_.reserve_rule();
    bool ok = true;
    const uint32_t str = string_rule(0, -1, "#", ok);
    const Seq item = {Grammar::ref(*any_value_)};
    Seq more = {ws(), g_.literal(",")[0], ws(), Grammar::ref(*any_value_)};
    const Seq items = *repeat(more, 0, -1, "#");
    Seq full = g_.literal("[");
    full.push_back(ws());
    full.push_back(Grammar::ref(*any_value_));
    full.insert(full.end(), items.begin(), items.end());
    full.push_back(ws());
    full.push_back(g_.literal("]")[0]);
    g_.define_rule(array, {full, {g_.literal("[")[0], ws(), g_.literal("]")[0]}});
    g_.define_rule(*any_value_, {{Grammar::ref(object)},
                                 {Grammar::ref(array)},
                                 {Grammar::ref(str)},
                                 {Grammar::ref(any_number())},
                                 g_.literal("true"),
                                 g_.literal("false"),
                                 g_.literal("null")});
    return *any_value_;
  }

  uint32_t any_object() {
    if (any_object_) return *any_object_;
    any_object_ = g_.reserve_rule();
    const uint32_t value = any_value();
    bool ok = true;
    const uint32_t key = string_rule(0, -1, "#", ok);
    const Seq member = {Grammar::ref(key), ws(), g_.literal(":")[0], ws(), Grammar::ref(value)};
    Seq more = {ws(), g_.literal(",")[0], ws()};
    more.insert(more.end(), member.begin(), member.end());
    const Seq members = *repeat(more, 0, -1, "#");
    Seq full = g_.literal("{");
    full.push_back(ws());
    full.insert(full.end(), member.begin(), member.end());
    full.insert(full.end(), members.begin(), members.end());
    full.push_back(ws());
    full.push_back(g_.literal("}")[0]);
    g_.define_rule(*any_object_, {full, {g_.literal("{")[0], ws(), g_.literal("}")[0]}});
    return *any_object_;
  }

  // ---- schema nodes -----------------------------------------------------------------------
  std::optional<uint32_t> value(const json& s, const std::string& path, int depth) {
    if (depth > o_.max_depth) {
      return fail(fmt::format("the schema nests deeper than {} levels at {}", o_.max_depth, path));
    }
    if (s.is_boolean()) {
      if (s.get<bool>()) return any_value();
      return fail(fmt::format("the schema 'false' at {} can never be satisfied", path));
    }
    if (!s.is_object()) return fail(fmt::format("the schema at {} must be an object", path));
    // Equal subschemas (a $def used twice, repeated anyOf branches) share one rule: a smaller
    // grammar, and parse stacks that deduplicate.
    const std::string key = s.dump();
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    const auto r = value_uncached(s, path, depth);
    if (r) memo_[key] = *r;
    return r;
  }

  std::optional<uint32_t> value_uncached(const json& s, const std::string& path, int depth) {
    std::vector<std::string> constraints;  // keys that are not annotations
    for (const auto& [k, v] : s.items()) {
      if (kAnnotations.contains(k)) continue;
      if (!kTypeKeywords.contains(k) && !kCombinators.contains(k)) {
        return fail(fmt::format("unsupported JSON Schema keyword '{}' at {}", k, path));
      }
      constraints.push_back(k);
    }
    const auto alone = [&](const char* key) -> bool {
      for (const std::string& k : constraints) {
        if (k != key) {
          fail(
              fmt::format("'{}' at {} together with '{}' is not supported; move '{}' into the "
                          "alternatives",
                          key, path, k, k));
          return false;
        }
      }
      return true;
    };
    if (s.contains("$ref")) {
      if (!alone("$ref")) return std::nullopt;
      return resolve_ref(s["$ref"], path, depth);
    }
    for (const char* key : {"anyOf", "oneOf", "allOf"}) {
      if (!s.contains(key)) continue;
      if (!alone(key)) return std::nullopt;
      const json& list = s[key];
      if (!list.is_array() || list.empty()) {
        return fail(fmt::format("'{}' at {} must be a non-empty array", key, path));
      }
      if (std::string_view(key) == "allOf" && list.size() != 1) {
        return fail(
            fmt::format("'allOf' with more than one schema (at {}) is not supported", path));
      }
      std::vector<Seq> alts;
      for (size_t i = 0; i < list.size(); ++i) {
        const auto sub = value(list[i], fmt::format("{}/{}/{}", path, key, i), depth + 1);
        if (!sub) return std::nullopt;
        alts.push_back({Grammar::ref(*sub)});
      }
      return g_.add_rule(alts);
    }
    std::vector<std::string> types;
    if (auto it = s.find("type"); it != s.end()) {
      if (it->is_string())
        types.push_back(it->get<std::string>());
      else if (it->is_array()) {
        for (const json& t : *it) {
          if (!t.is_string()) return fail(fmt::format("'type' at {} must list strings", path));
          types.push_back(t.get<std::string>());
        }
      } else {
        return fail(fmt::format("'type' at {} must be a string or an array of strings", path));
      }
    }
    if (s.contains("enum") || s.contains("const")) return literals(s, types, path);
    if (types.empty()) {
      for (const std::string& k : constraints) {
        if (kTypeKeywords.contains(k)) {
          return fail(fmt::format("'{}' at {} needs a 'type' to apply to", k, path));
        }
      }
      return any_value();
    }
    std::vector<Seq> alts;
    for (const std::string& t : types) {
      std::optional<uint32_t> r;
      if (t == "object")
        r = object(s, path, depth);
      else if (t == "array")
        r = array(s, path, depth);
      else if (t == "string")
        r = string(s, path);
      else if (t == "integer" || t == "number")
        r = number(s, t == "integer", path);
      else if (t == "boolean")
        r = g_.add_rule({g_.literal("true"), g_.literal("false")});
      else if (t == "null")
        r = g_.add_rule({g_.literal("null")});
      else
        return fail(fmt::format("unknown type '{}' at {}", t, path));
      if (!r) return std::nullopt;
      alts.push_back({Grammar::ref(*r)});
    }
    if (g_.n_elems() > Grammar::kMaxElems) return fail(too_large());
    return g_.add_rule(alts);
  }

  static bool has_type(const json& v, const std::vector<std::string>& types) {
    if (types.empty()) return true;
    for (const std::string& t : types) {
      if ((t == "string" && v.is_string()) || (t == "number" && v.is_number()) ||
          (t == "integer" && v.is_number_integer()) || (t == "boolean" && v.is_boolean()) ||
          (t == "null" && v.is_null()) || (t == "object" && v.is_object()) ||
          (t == "array" && v.is_array()))
        return true;
    }
    return false;
  }

  // enum / const: each value as its compact JSON text.
  std::optional<uint32_t> literals(const json& s, const std::vector<std::string>& types,
                                   const std::string& path) {
    for (const auto& [k, v] : s.items()) {
      if (k != "enum" && k != "const" && k != "type" && !kAnnotations.contains(k)) {
        return fail(fmt::format("'{}' at {} next to 'enum'/'const' is not supported", k, path));
      }
    }
    std::vector<json> values;
    if (auto it = s.find("const"); it != s.end()) values.push_back(*it);
    if (auto it = s.find("enum"); it != s.end()) {
      if (!it->is_array() || it->empty()) {
        return fail(fmt::format("'enum' at {} must be a non-empty array", path));
      }
      if (!values.empty()) return fail(fmt::format("'enum' and 'const' together at {}", path));
      values.assign(it->begin(), it->end());
    }
    std::vector<Seq> alts;
    for (const json& v : values) {
      if (!has_type(v, types)) {
        return fail(
            fmt::format("enum/const value {} at {} does not match its 'type'", v.dump(), path));
      }
      alts.push_back(g_.literal(v.dump()));
    }
    return g_.add_rule(alts);
  }

  std::optional<uint32_t> resolve_ref(const json& ref_json, const std::string& path, int depth) {
    if (!ref_json.is_string()) return fail(fmt::format("'$ref' at {} must be a string", path));
    const std::string ref = ref_json.get<std::string>();
    if (ref.rfind("#/", 0) != 0) {
      return fail(
          fmt::format("'$ref' \"{}\" at {}: only local references (#/$defs/..., "
                      "#/definitions/...) are supported",
                      ref, path));
    }
    if (auto it = refs_done_.find(ref); it != refs_done_.end()) return it->second;
    if (refs_active_.contains(ref)) {
      return fail(
          fmt::format("recursive '$ref' \"{}\" at {} is not supported (only "
                      "non-recursive schemas)",
                      ref, path));
    }
    const json* target = nullptr;
    try {
      target = &root_.at(json::json_pointer(ref.substr(1)));
    } catch (const json::exception&) {
      return fail(fmt::format("'$ref' \"{}\" at {} does not resolve", ref, path));
    }
    refs_active_.insert(ref);
    const auto r = value(*target, ref, depth + 1);
    refs_active_.erase(ref);
    if (r) refs_done_[ref] = *r;
    return r;
  }

  // A non-negative integer keyword, or `fallback` when absent.
  std::optional<int64_t> count(const json& s, const char* key, int64_t fallback,
                               const std::string& path) {
    auto it = s.find(key);
    if (it == s.end()) return fallback;
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      return fail(fmt::format("'{}' at {} must be a non-negative integer", key, path));
    }
    return it->get<int64_t>();
  }

  std::optional<uint32_t> string(const json& s, const std::string& path) {
    if (auto it = s.find("pattern"); it != s.end()) {
      if (!it->is_string()) return fail(fmt::format("'pattern' at {} must be a string", path));
      if (s.contains("minLength") || s.contains("maxLength")) {
        return fail(
            fmt::format("'pattern' together with minLength/maxLength (at {}) is not "
                        "supported; put the length into the pattern, e.g. ^.{{1,20}}$",
                        path));
      }
      PatternCompiler pc(g_, utf8_multibyte());
      auto body = pc.compile(it->get<std::string>());
      if (!body.ok()) return fail(fmt::format("'pattern' at {}: {}", path, body.error()));
      Seq seq = g_.literal("\"");
      seq.insert(seq.end(), body->begin(), body->end());
      seq.push_back(g_.literal("\"")[0]);
      if (g_.n_elems() > Grammar::kMaxElems) return fail(too_large());
      return g_.add_rule({seq});
    }
    const auto min = count(s, "minLength", 0, path);
    const auto max = count(s, "maxLength", -1, path);
    if (!min || !max) return std::nullopt;
    if (*max >= 0 && *min > *max) {
      return fail(fmt::format("minLength > maxLength at {}", path));
    }
    bool ok = true;
    const uint32_t r = string_rule(*min, *max, path, ok);
    if (!ok) return std::nullopt;
    return r;
  }

  std::optional<uint32_t> array(const json& s, const std::string& path, int depth) {
    std::optional<uint32_t> item;
    const auto it = s.find("items");
    if (it == s.end())
      item = any_value();
    else if (it->is_array()) {
      return fail(fmt::format("tuple 'items' (an array) at {} is not supported", path));
    } else {
      item = value(*it, path + "/items", depth + 1);
    }
    if (!item) return std::nullopt;
    const auto min = count(s, "minItems", 0, path);
    const auto max = count(s, "maxItems", -1, path);
    if (!min || !max) return std::nullopt;
    if (*max >= 0 && *min > *max) return fail(fmt::format("minItems > maxItems at {}", path));
    const Grammar::Sym open = g_.literal("[")[0], close = g_.literal("]")[0];
    std::vector<Seq> alts;
    if (*min == 0) alts.push_back({open, ws(), close});
    if (*max != 0) {
      const Seq more = {ws(), g_.literal(",")[0], ws(), Grammar::ref(*item)};
      const auto rest =
          repeat(more, std::max<int64_t>(*min - 1, 0), *max < 0 ? -1 : *max - 1, path);
      if (!rest) return std::nullopt;
      Seq full = {open, ws(), Grammar::ref(*item)};
      full.insert(full.end(), rest->begin(), rest->end());
      full.push_back(ws());
      full.push_back(close);
      alts.push_back(std::move(full));
    }
    return g_.add_rule(alts);
  }

  // Properties in declared order; optional ones may be left out. Only declared properties are
  // generated (as additionalProperties: false, which strict mode implies).
  std::optional<uint32_t> object(const json& s, const std::string& path, int depth) {
    const json props = s.value("properties", json::object());
    if (!props.is_object()) return fail(fmt::format("'properties' at {} must be an object", path));
    std::set<std::string> required;
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) return fail(fmt::format("'required' at {} must be an array", path));
      for (const json& r : *it) {
        if (!r.is_string()) return fail(fmt::format("'required' at {} must list strings", path));
        if (!props.contains(r.get<std::string>())) {
          return fail(fmt::format("required property \"{}\" at {} is not in 'properties'",
                                  r.get<std::string>(), path));
        }
        required.insert(r.get<std::string>());
      }
    }
    bool closed = false;
    if (auto it = s.find("additionalProperties"); it != s.end()) {
      if (!it->is_boolean()) {
        return fail(
            fmt::format("'additionalProperties' with a schema (at {}) is not supported; "
                        "use false or list the properties",
                        path));
      }
      closed = !it->get<bool>();
    }
    const Grammar::Sym open = g_.literal("{")[0], close = g_.literal("}")[0];
    if (props.empty()) {
      if (!closed) return any_object();
      return g_.add_rule({{open, ws(), close}});
    }
    std::vector<Seq> kv;
    std::vector<bool> is_required;
    for (const auto& [name, sub] : props.items()) {
      const auto v = value(sub, path + "/properties/" + name, depth + 1);
      if (!v) return std::nullopt;
      Seq seq = {ws()};
      const Seq key = g_.literal(json(name).dump());
      seq.insert(seq.end(), key.begin(), key.end());
      seq.insert(seq.end(), {ws(), g_.literal(":")[0], ws(), Grammar::ref(*v)});
      kv.push_back(std::move(seq));
      is_required.push_back(required.contains(name));
    }
    // after[i]: the properties from i on, some property already written (each needs a comma);
    // first[i]: the same with none written yet. Built from the back.
    const size_t n = kv.size();
    std::optional<uint32_t> after, first;
    for (size_t i = n; i-- > 0;) {
      Seq with_comma = {ws(), g_.literal(",")[0]};
      with_comma.insert(with_comma.end(), kv[i].begin(), kv[i].end());
      Seq without = kv[i];
      if (after) {
        with_comma.push_back(Grammar::ref(*after));
        without.push_back(Grammar::ref(*after));
      }
      std::vector<Seq> a_alts = {with_comma}, f_alts = {without};
      if (!is_required[i]) {
        a_alts.push_back(after ? Seq{Grammar::ref(*after)} : Seq{});
        f_alts.push_back(first ? Seq{Grammar::ref(*first)} : Seq{});
      }
      after = g_.add_rule(a_alts);
      first = g_.add_rule(f_alts);
    }
    return g_.add_rule({{open, Grammar::ref(*first), ws(), close}});
  }

  Grammar g_;
  const json& root_;
  const JsonSchemaOptions& o_;
  std::string error_;
  std::optional<uint32_t> ws_, char_, multibyte_, frac_, number_, any_value_, any_object_;
  std::map<std::string, uint32_t> refs_done_;
  std::map<std::string, uint32_t> memo_;  // compact dump of a subschema -> its rule
  std::set<std::string> refs_active_;
};

}  // namespace

Result<Grammar> compile_json_schema(const nlohmann::ordered_json& schema,
                                    const JsonSchemaOptions& options) {
  return Compiler(schema, options).compile();
}

Result<Grammar> compile_json_schema(const nlohmann::json& schema,
                                    const JsonSchemaOptions& options) {
  // nlohmann::json has already sorted the keys; the copy keeps that (alphabetical) order.
  const nlohmann::ordered_json ordered = schema;
  return Compiler(ordered, options).compile();
}

Grammar json_object_grammar(const JsonSchemaOptions& options) {
  static const json kEmpty = json::object();
  return Compiler(kEmpty, options).json_object();
}

}  // namespace bie::grammar
