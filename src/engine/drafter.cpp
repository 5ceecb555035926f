#include "bie/engine/drafter.h"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace bie {

void NgramDrafter::propose(int64_t /*seq*/, std::span<const int32_t> tokens, int max_tokens,
                           std::vector<int32_t>& out) {
  assert(n_min_ >= 1 && n_min_ <= n_max_);
  out.clear();
  const auto len = static_cast<int64_t>(tokens.size());
  if (max_tokens <= 0) return;
  for (int n = std::min<int64_t>(n_max_, len - 1); n >= n_min_; --n) {
    const auto key = tokens.subspan(static_cast<size_t>(len - n));
    // Most recent earlier occurrence: its continuation starts at p + n < len.
    for (int64_t p = len - n - 1; p >= 0; --p) {
      if (!std::equal(key.begin(), key.end(), tokens.begin() + p)) continue;
      const int64_t from = p + n;
      const int64_t cnt = std::min<int64_t>(max_tokens, len - from);
      out.assign(tokens.begin() + from, tokens.begin() + from + cnt);
      return;
    }
  }
}

namespace {

// best_draft_len's model: step cost relative to a base step and a draft token's relative cost.
struct StepCosts {
  std::span<const double> step_ms;
  int64_t base = 0;
  double draft_cost = 0.0;

  [[nodiscard]] double guess(int64_t n) const {
    return 1.0 + 0.44 * static_cast<double>(n - base) / static_cast<double>(base);
  }
  [[nodiscard]] double ms(int64_t n) const { return step_ms[static_cast<size_t>(n)]; }
  // Cost of a step with n decode tokens relative to one with base: measured, else interpolated
  // between the nearest measured sizes around it (a step of 4 is measured long before one of 2
  // when drafts are mostly full), else guessed.
  [[nodiscard]] double cost(int64_t n) const {
    if (ms(base) <= 0) return guess(n);
    if (ms(n) > 0) return ms(n) / ms(base);
    int64_t lo = n - 1;
    while (ms(lo) <= 0) --lo;  // stops at base
    int64_t hi = n + 1;
    const auto n_max = static_cast<int64_t>(step_ms.size()) - 1;
    while (hi <= n_max && ms(hi) <= 0) ++hi;
    if (hi > n_max) return guess(n);
    const double f = static_cast<double>(n - lo) / static_cast<double>(hi - lo);
    return (ms(lo) + f * (ms(hi) - ms(lo))) / ms(base);
  }
  // Expected tokens per unit of cost when g drafts are each accepted with probability a, in a row.
  [[nodiscard]] double value(double a, int64_t g) const {
    a = std::clamp(a, 0.0, 0.999);
    const double accepted = a * (1.0 - std::pow(a, static_cast<double>(g))) / (1.0 - a);
    return (1.0 + accepted) / (cost(base + g) + draft_cost * static_cast<double>(g));
  }
};

StepCosts step_costs(int64_t base, std::span<const double> step_ms,
                     double draft_seconds_per_token) {
  StepCosts c{step_ms, base, 0.0};
  const auto n_max = static_cast<int64_t>(step_ms.size()) - 1;
  // A base step's time, estimated from another measured size while it is unseen.
  double base_ms = c.ms(base);
  for (int64_t n = base + 1; base_ms <= 0 && n <= n_max; ++n) {
    if (c.ms(n) > 0) base_ms = c.ms(n) / c.guess(n);
  }
  c.draft_cost = base_ms > 0 ? 1000.0 * draft_seconds_per_token / base_ms : 0.0;
  return c;
}

}  // namespace

DraftChoice best_draft(double accept_rate, int64_t base, int64_t cap,
                       std::span<const double> step_ms, double draft_seconds_per_token) {
  const auto n_max = static_cast<int64_t>(step_ms.size()) - 1;
  cap = std::min(cap, n_max - base);
  DraftChoice best;  // no drafts: one token per unit cost
  if (base < 1 || cap < 1) return best;
  const StepCosts c = step_costs(base, step_ms, draft_seconds_per_token);
  for (int64_t g = 1; g <= cap; ++g) {
    const double value = c.value(accept_rate, g);
    if (value > best.value * 1.02) best = {static_cast<int>(g), value};  // demand a clear gain
  }
  return best;
}

int best_draft_len(double accept_rate, int64_t base, int64_t cap, std::span<const double> step_ms,
                   double draft_seconds_per_token) {
  return best_draft(accept_rate, base, cap, step_ms, draft_seconds_per_token).len;
}

double free_draft_value(double accept_rate, int64_t base, int64_t len,
                        std::span<const double> step_ms) {
  const auto n_max = static_cast<int64_t>(step_ms.size()) - 1;
  if (base < 1 || len < 1 || base + len > n_max) return 0.0;
  return step_costs(base, step_ms, 0.0).value(accept_rate, len);
}

}  // namespace bie
