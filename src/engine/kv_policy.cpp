#include "bie/engine/kv_policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>

namespace bie {

namespace {

std::optional<int64_t> parse_tokens(std::string_view s) {
  int64_t mult = 1;
  if (!s.empty() && (s.back() == 'k' || s.back() == 'K')) {
    mult = 1024;
    s.remove_suffix(1);
  }
  int64_t v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v < 0) return std::nullopt;
  return v * mult;
}

}  // namespace

Result<std::vector<KvLengthRule>> parse_kv_policy(std::string_view text) {
  std::vector<KvLengthRule> rules;
  const auto bad = [&](std::string_view part, const char* why) {
    return Error{fmt::format(
        "--kv-policy '{}': {} in '{}' (expected e.g. \"int4_asym:0-16384,int8:16384-\")", text, why,
        part)};
  };
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string_view part = text.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    start = comma == std::string_view::npos ? text.size() + 1 : comma + 1;
    if (part.empty()) continue;
    const size_t colon = part.find(':');
    if (colon == std::string_view::npos || colon == 0) return bad(part, "no format");
    const std::string_view range = part.substr(colon + 1);
    const size_t dash = range.find('-');
    if (dash == std::string_view::npos) return bad(part, "no '-' in the token range");
    KvLengthRule r;
    r.regime = std::string(part.substr(0, colon));
    const auto from = parse_tokens(range.substr(0, dash));
    if (!from) return bad(part, "bad range start");
    r.from = *from;
    if (dash + 1 < range.size()) {
      const auto to = parse_tokens(range.substr(dash + 1));
      if (!to || *to <= r.from) return bad(part, "bad range end");
      r.to = *to;
    }
    rules.push_back(r);
  }
  if (rules.empty()) return Error{fmt::format("--kv-policy '{}': no rules", text)};
  std::vector<KvLengthRule> sorted = rules;
  std::sort(sorted.begin(), sorted.end(),
            [](const KvLengthRule& a, const KvLengthRule& b) { return a.from < b.from; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i - 1].to < 0 || sorted[i - 1].to > sorted[i].from) {
      return Error{fmt::format("--kv-policy '{}': ranges of {} and {} overlap", text,
                               sorted[i - 1].regime, sorted[i].regime)};
    }
  }
  return rules;
}

std::optional<std::string> kv_policy_regime(const std::vector<KvLengthRule>& rules,
                                            int64_t length) {
  for (const KvLengthRule& r : rules) {
    if (length >= r.from && (r.to < 0 || length < r.to)) return r.regime;
  }
  return std::nullopt;
}

std::string format_kv_policy(const std::vector<KvLengthRule>& rules) {
  std::string s;
  for (const KvLengthRule& r : rules) {
    if (!s.empty()) s += ',';
    s += fmt::format("{}:{}-{}", r.regime, r.from, r.to < 0 ? std::string() : std::to_string(r.to));
  }
  return s;
}

}  // namespace bie
