#include "tokenizer/special_matcher.h"

#include <algorithm>

namespace bie::tokenizer {

namespace {
uint64_t edge_key(int32_t node, uint8_t byte) {
  return (static_cast<uint64_t>(node) << 8) | byte;
}
}  // namespace

SpecialMatcher::SpecialMatcher(const Vocab& vocab) : vocab_(vocab) {
  nodes_.emplace_back();
  const auto& special = vocab.special_tokens();
  for (size_t rank = 0; rank < special.size(); ++rank) {
    const std::string& text = vocab.text(special[rank]);
    int32_t node = 0;
    for (char c : text) {
      const uint64_t k = edge_key(node, static_cast<uint8_t>(c));
      auto it = edges_.find(k);
      if (it == edges_.end()) {
        it = edges_.emplace(k, static_cast<int32_t>(nodes_.size())).first;
        nodes_.emplace_back();
      }
      node = it->second;
    }
    // Two tokens with one text: keep the first in partition order.
    if (nodes_[node].rank < 0) nodes_[node].rank = static_cast<int32_t>(rank);
    first_byte_[static_cast<uint8_t>(text[0])] = true;
  }
}

int32_t SpecialMatcher::child(int32_t node, uint8_t byte) const {
  const auto it = edges_.find(edge_key(node, byte));
  return it == edges_.end() ? -1 : it->second;
}

std::vector<Tokenizer::Fragment> SpecialMatcher::partition(std::string_view text,
                                                           bool parse_special) const {
  std::vector<Tokenizer::Fragment> out;
  if (text.empty()) return out;
  const auto& special = vocab_.special_tokens();

  // Every occurrence of every eligible special token, as (rank, position).
  struct Occurrence {
    int32_t rank;
    uint32_t pos;
  };
  std::vector<Occurrence> occ;
  for (size_t pos = 0; pos < text.size(); ++pos) {
    if (!first_byte_[static_cast<uint8_t>(text[pos])]) continue;
    int32_t node = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      node = child(node, static_cast<uint8_t>(text[i]));
      if (node < 0) break;
      const int32_t rank = nodes_[node].rank;
      if (rank < 0) continue;
      if (!parse_special && (vocab_.attr(special[rank]) & (kAttrControl | kAttrUnknown))) continue;
      occ.push_back({rank, static_cast<uint32_t>(pos)});
    }
  }
  if (occ.empty()) {
    out.push_back({kNoToken, 0, text.size()});
    return out;
  }

  // llama.cpp takes tokens in rank order and, for each, its leftmost occurrences that lie
  // wholly in still-raw text; an occurrence overlapping an earlier one is therefore skipped.
  std::sort(occ.begin(), occ.end(), [](const Occurrence& a, const Occurrence& b) {
    return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos;
  });
  std::vector<uint8_t> taken(text.size(), 0);
  std::vector<Tokenizer::Fragment> tokens;
  for (const Occurrence& o : occ) {
    const size_t len = vocab_.text(special[o.rank]).size();
    if (std::any_of(taken.begin() + o.pos, taken.begin() + o.pos + len,
                    [](uint8_t t) { return t != 0; })) {
      continue;
    }
    std::fill(taken.begin() + o.pos, taken.begin() + o.pos + len, uint8_t{1});
    tokens.push_back({special[o.rank], o.pos, o.pos + len});
  }
  std::sort(
      tokens.begin(), tokens.end(),
      [](const Tokenizer::Fragment& a, const Tokenizer::Fragment& b) { return a.begin < b.begin; });
  size_t cursor = 0;
  for (const auto& t : tokens) {
    if (t.begin > cursor) out.push_back({kNoToken, cursor, t.begin});
    out.push_back(t);
    cursor = t.end;
  }
  if (cursor < text.size()) out.push_back({kNoToken, cursor, text.size()});
  return out;
}

}  // namespace bie::tokenizer
