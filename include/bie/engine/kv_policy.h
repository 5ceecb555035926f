// KV regime policy (../shared/BRIEF.md §3): which KV format a request runs in. Precedence, first
// match wins: the kill switch (f16 for every new request), the request's own choice, the length
// policy (--kv-policy "int4_asym:0-16384,int8:16384-", by prompt + max_tokens), the default.
// Pure functions over plain data; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bie/common/result.h"

namespace bie {

struct KvLengthRule {
  std::string regime;  // a KV format name, e.g. "int8"
  int64_t from = 0;    // tokens, inclusive
  int64_t to = -1;     // tokens, exclusive; -1: no upper end
};

// "fmt:A-B,fmt:C-" (A, B, C in tokens; k/K = 1024 allowed, e.g. "16k"). Ranges must not overlap.
[[nodiscard]] Result<std::vector<KvLengthRule>> parse_kv_policy(std::string_view text);
// The rule's regime for a sequence of `length` tokens, if one covers it.
[[nodiscard]] std::optional<std::string> kv_policy_regime(const std::vector<KvLengthRule>& rules,
                                                          int64_t length);
// "int4_asym:0-16384,int8:16384-" again.
[[nodiscard]] std::string format_kv_policy(const std::vector<KvLengthRule>& rules);

}  // namespace bie
