// SpecialMatcher: finds special-token texts in raw text and carves the text into fragments the
// way llama.cpp's tokenizer_st_partition does (tokens taken longest first, each leftmost and
// non-overlapping, never across an already-carved token), but in one trie pass instead of one
// substring search per special token. Immutable; thread-safe.
#pragma once

#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "bie/tokenizer/tokenizer.h"
#include "bie/tokenizer/vocab.h"

namespace bie::tokenizer {

class SpecialMatcher {
 public:
  // note: `vocab` must outlive the matcher.
  explicit SpecialMatcher(const Vocab& vocab);

  // With parse_special false, control and unknown tokens are skipped (llama.cpp); user-defined
  // ones are still carved out.
  [[nodiscard]] std::vector<Tokenizer::Fragment> partition(std::string_view text,
                                                           bool parse_special) const;

 private:
  struct Node {
    int32_t rank = -1;  // index into vocab.special_tokens() of the token ending here, or -1
  };
  [[nodiscard]] int32_t child(int32_t node, uint8_t byte) const;

  const Vocab& vocab_;
  std::vector<Node> nodes_;                      // [0] is the root
  std::unordered_map<uint64_t, int32_t> edges_;  // (node << 8 | byte) -> child
  bool first_byte_[256] = {};
};

}  // namespace bie::tokenizer
