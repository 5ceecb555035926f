#include "bie/grammar/grammar_constraint.h"

#include <limits>

namespace bie::grammar {

GrammarConstraint::GrammarConstraint(const Grammar& grammar, const TokenTrie& trie)
    : trie_(trie), matcher_(grammar), state_(matcher_.initial()) {}

GrammarConstraint::GrammarConstraint(const GrammarConstraint& other)
    : trie_(other.trie_), matcher_(other.matcher_.grammar()), state_(other.state_) {}

const GrammarMatcher::State* GrammarConstraint::walk(std::string_view bytes) {
  const GrammarMatcher::State* cur = &state_;
  int next = 0;
  for (char c : bytes) {
    if (!matcher_.advance(*cur, static_cast<uint8_t>(c), walk_[next])) return nullptr;
    cur = &walk_[next];
    next ^= 1;
  }
  return cur;
}

bool GrammarConstraint::allows(int32_t token) {
  if (token < 0 || token >= trie_.n_vocab()) return false;
  if (trie_.is_stop(token)) return state_.complete;
  const std::string& piece = trie_.piece(token);
  if (piece.empty()) return false;
  return walk(piece) != nullptr;
}

void GrammarConstraint::compute_mask(std::vector<uint64_t>& allowed) {
  const auto n_vocab = static_cast<size_t>(trie_.n_vocab());
  allowed.assign((n_vocab + 63) / 64, 0);
  const auto set = [&](int32_t id) { allowed[id >> 6] |= uint64_t{1} << (id & 63); };
  if (state_.complete) {
    for (int32_t id : trie_.stop_tokens()) set(id);
  }
  if (!state_.can_continue()) return;
  by_depth_.resize(trie_.max_depth() + 1);
  by_depth_[0] = state_;
  // Preorder walk: a node's state is its parent's advanced by one byte; a rejected node skips
  // its whole subtree, so a prefix shared by many tokens is matched once.
  const uint32_t n = trie_.n_nodes();
  for (uint32_t i = 1; i < n;) {
    const uint32_t d = trie_.depth(i);
    GrammarMatcher::State& s = by_depth_[d];
    if (!matcher_.advance(by_depth_[d - 1], trie_.byte(i), s)) {
      i = trie_.end(i);
      continue;
    }
    for (int32_t id : trie_.tokens_at(i)) set(id);
    i = s.can_continue() ? i + 1 : trie_.end(i);
  }
}

void GrammarConstraint::mask_logits(float* logits, int32_t n_vocab) {
  compute_mask(mask_);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int32_t id = 0; id < n_vocab; ++id) {
    const bool ok = id < trie_.n_vocab() && ((mask_[id >> 6] >> (id & 63)) & 1u);
    if (!ok) logits[id] = neg_inf;
  }
}

bool GrammarConstraint::accept(int32_t token) {
  if (token < 0 || token >= trie_.n_vocab()) return false;
  if (trie_.is_stop(token)) return state_.complete;  // the end: the state stays complete
  const std::string& piece = trie_.piece(token);
  return !piece.empty() && accept_bytes(piece);
}

bool GrammarConstraint::accept_bytes(std::string_view bytes) {
  const GrammarMatcher::State* s = walk(bytes);
  if (s == nullptr) return false;
  if (s != &state_) state_ = *s;
  return true;
}

}  // namespace bie::grammar
