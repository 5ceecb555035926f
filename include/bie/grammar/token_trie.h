// TokenTrie: a vocabulary's token byte strings as a trie laid out in preorder, so a grammar
// walks each shared prefix once when it masks the vocabulary. Immutable after construction:
// build one per model and share it between requests and threads.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace bie::grammar {

class TokenTrie {
 public:
  // pieces[id]: the bytes token `id` stands for (tokenizer::Tokenizer::token_to_piece with
  // render_special = false). Empty pieces (control tokens) are never allowed by a grammar,
  // except `stop_tokens` (EOS, end of turn), which are allowed exactly when the grammar is
  // complete.
  TokenTrie(std::vector<std::string> pieces, std::vector<int32_t> stop_tokens);

  [[nodiscard]] int32_t n_vocab() const { return static_cast<int32_t>(pieces_.size()); }
  [[nodiscard]] const std::string& piece(int32_t id) const { return pieces_[id]; }
  [[nodiscard]] bool is_stop(int32_t id) const { return is_stop_[id]; }
  [[nodiscard]] std::span<const int32_t> stop_tokens() const { return stops_; }

  // Preorder nodes; node 0 is the root (the empty prefix). Node i's subtree is [i, end(i)).
  [[nodiscard]] uint32_t n_nodes() const { return static_cast<uint32_t>(byte_.size()); }
  [[nodiscard]] uint8_t byte(uint32_t node) const { return byte_[node]; }
  [[nodiscard]] uint32_t depth(uint32_t node) const { return depth_[node]; }
  [[nodiscard]] uint32_t end(uint32_t node) const { return end_[node]; }
  [[nodiscard]] uint32_t max_depth() const { return max_depth_; }
  // The tokens whose piece ends exactly at `node`.
  [[nodiscard]] std::span<const int32_t> tokens_at(uint32_t node) const {
    return {sorted_.data() + tok_begin_[node], sorted_.data() + tok_begin_[node + 1]};
  }

 private:
  std::vector<std::string> pieces_;
  std::vector<int32_t> stops_;
  std::vector<bool> is_stop_;
  std::vector<uint8_t> byte_;        // [n_nodes] the byte on the edge into the node
  std::vector<uint32_t> depth_;      // [n_nodes]
  std::vector<uint32_t> end_;        // [n_nodes] one past the subtree
  std::vector<uint32_t> tok_begin_;  // [n_nodes + 1] into sorted_
  std::vector<int32_t> sorted_;      // token ids ordered by piece
  uint32_t max_depth_ = 0;
};

}  // namespace bie::grammar
