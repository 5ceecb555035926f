#include "bie/grammar/grammar_constraint.h"

#include <limits>

namespace bie::grammar {

GrammarConstraint::GrammarConstraint(const Grammar& grammar, const TokenTrie& trie)
    : trie_(trie), matcher_(grammar), state_(matcher_.initial()) {}

// A copy starts with empty caches: they are an optimization, rebuilt on demand.
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

int32_t GrammarConstraint::intern(const GrammarMatcher::State& s) {
  // Key: stack count, completeness, then the stacks' words and their ends.
  const uint32_t head[2] = {static_cast<uint32_t>(s.ends.size()), s.complete ? 1u : 0u};
  key_.assign(reinterpret_cast<const char*>(head), sizeof head);
  key_.append(reinterpret_cast<const char*>(s.data.data()), s.data.size() * sizeof(uint32_t));
  key_.append(reinterpret_cast<const char*>(s.ends.data()), s.ends.size() * sizeof(uint32_t));
  const auto [it, inserted] = ids_.try_emplace(key_, static_cast<int32_t>(states_.size()));
  if (inserted) states_.push_back(s);
  return it->second;
}

int32_t GrammarConstraint::step(int32_t id, uint8_t byte) {
  const uint64_t k = (static_cast<uint64_t>(id) << 8) | byte;
  if (auto it = next_.find(k); it != next_.end()) return it->second;
  int32_t r = -1;
  if (matcher_.advance(states_[id], byte, scratch_)) r = intern(scratch_);
  next_.emplace(k, r);
  return r;
}

void GrammarConstraint::compute_mask(std::vector<uint64_t>& allowed) {
  if (states_.size() > kMaxCachedStates || next_.size() > kMaxCachedTransitions) {
    ids_.clear();
    states_.clear();
    next_.clear();
    masks_.clear();
  }
  const int32_t root = intern(state_);
  if (auto it = masks_.find(root); it != masks_.end()) {
    allowed = it->second;
    return;
  }
  const auto n_vocab = static_cast<size_t>(trie_.n_vocab());
  allowed.assign((n_vocab + 63) / 64, 0);
  const auto set = [&](int32_t id) { allowed[id >> 6] |= uint64_t{1} << (id & 63); };
  if (state_.complete) {
    for (int32_t id : trie_.stop_tokens()) set(id);
  }
  if (state_.can_continue()) {
    id_by_depth_.resize(trie_.max_depth() + 1);
    id_by_depth_[0] = root;
    // Preorder walk: a node's state is its parent's advanced by one byte; a rejected node
    // skips its whole subtree, so a prefix shared by many tokens is matched once.
    const uint32_t n = trie_.n_nodes();
    for (uint32_t i = 1; i < n;) {
      const uint32_t d = trie_.depth(i);
      const int32_t id = step(id_by_depth_[d - 1], trie_.byte(i));
      if (id < 0) {
        i = trie_.end(i);
        continue;
      }
      for (int32_t t : trie_.tokens_at(i)) set(t);
      id_by_depth_[d] = id;
      i = states_[id].can_continue() ? i + 1 : trie_.end(i);
    }
  }
  if (masks_.size() >= kMaxCachedMasks) masks_.clear();
  masks_.emplace(root, allowed);
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
