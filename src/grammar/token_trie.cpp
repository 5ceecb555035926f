#include "bie/grammar/token_trie.h"

#include <algorithm>
#include <numeric>

namespace bie::grammar {

TokenTrie::TokenTrie(std::vector<std::string> pieces, std::vector<int32_t> stop_tokens)
    : pieces_(std::move(pieces)), stops_(std::move(stop_tokens)), is_stop_(pieces_.size()) {
  for (int32_t id : stops_) {
    if (id >= 0 && static_cast<size_t>(id) < pieces_.size()) is_stop_[id] = true;
  }
  std::vector<int32_t> ids(pieces_.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::erase_if(ids, [&](int32_t id) { return pieces_[id].empty() || is_stop_[id]; });
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return pieces_[a] < pieces_[b] || (pieces_[a] == pieces_[b] && a < b);
  });
  // Sorted pieces give the trie in preorder: each piece shares its longest common prefix
  // with the previous one, and adds nodes for the rest.
  byte_.push_back(0);
  depth_.push_back(0);
  end_.push_back(0);
  tok_begin_.push_back(0);
  std::vector<uint32_t> path = {0};  // node per depth along the current piece
  std::string prev;
  for (size_t k = 0; k < ids.size(); ++k) {
    const std::string& p = pieces_[ids[k]];
    size_t lcp = 0;
    while (lcp < p.size() && lcp < prev.size() && p[lcp] == prev[lcp]) ++lcp;
    while (path.size() > lcp + 1) {
      end_[path.back()] = static_cast<uint32_t>(byte_.size());
      path.pop_back();
    }
    for (size_t d = lcp; d < p.size(); ++d) {
      path.push_back(static_cast<uint32_t>(byte_.size()));
      byte_.push_back(static_cast<uint8_t>(p[d]));
      depth_.push_back(static_cast<uint32_t>(d + 1));
      end_.push_back(0);
      tok_begin_.push_back(static_cast<uint32_t>(k));  // tokens at this node start here
    }
    max_depth_ = std::max(max_depth_, static_cast<uint32_t>(p.size()));
    prev = p;
  }
  while (!path.empty()) {
    end_[path.back()] = static_cast<uint32_t>(byte_.size());
    path.pop_back();
  }
  tok_begin_.push_back(static_cast<uint32_t>(ids.size()));
  sorted_ = std::move(ids);
}

}  // namespace bie::grammar
