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

int best_draft_len(double accept_rate, int64_t base, int64_t cap, std::span<const double> step_ms,
                   double draft_seconds_per_token) {
  const auto n_max = static_cast<int64_t>(step_ms.size()) - 1;
  cap = std::min(cap, n_max - base);
  if (base < 1 || cap < 1) return 0;
  const auto ms = [&](int64_t n) { return step_ms[static_cast<size_t>(n)]; };
  const auto guess = [&](int64_t n) {
    return 1.0 + 0.44 * static_cast<double>(n - base) / static_cast<double>(base);
  };
  // Cost of a step with n decode tokens relative to one with base.
  const auto cost = [&](int64_t n) {
    return ms(n) > 0 && ms(base) > 0 ? ms(n) / ms(base) : guess(n);
  };
  // A base step's time, estimated from another measured size while it is unseen.
  double base_ms = ms(base);
  for (int64_t n = base + 1; base_ms <= 0 && n <= n_max; ++n) {
    if (ms(n) > 0) base_ms = ms(n) / guess(n);
  }
  const double draft_cost = base_ms > 0 ? 1000.0 * draft_seconds_per_token / base_ms : 0.0;
  const double a = std::clamp(accept_rate, 0.0, 0.999);
  int best = 0;
  double best_value = 1.0;  // no drafts: one token per unit cost
  for (int64_t g = 1; g <= cap; ++g) {
    // Expected accepted drafts when each is accepted with probability a, in a row.
    const double accepted = a * (1.0 - std::pow(a, static_cast<double>(g))) / (1.0 - a);
    const double value = (1.0 + accepted) / (cost(base + g) + draft_cost * static_cast<double>(g));
    if (value > best_value * 1.02) {  // demand a clear gain
      best = static_cast<int>(g);
      best_value = value;
    }
  }
  return best;
}

}  // namespace bie
