#include "bie/engine/drafter.h"

#include <algorithm>
#include <cassert>

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

}  // namespace bie
