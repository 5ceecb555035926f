// GrammarConstraint: one request's structured-output state: the grammar's parse state plus the
// scratch space to check a token or mask the whole vocabulary. Owns its GrammarMatcher and
// State; borrows the Grammar and TokenTrie (both immutable, shared; they must outlive it).
// Not thread-safe: one per request (copy it to fork a request, e.g. for n > 1).
//
// How the engine drives it, per generated token:
//   1. token = sampler.sample(logits, history, &constraint)   // lazy: mask only on rejection
//      (kNoToken: no token can continue; finish the request with a "grammar" stop reason);
//   2. constraint.accept(token)  -- required: the sampler never advances the state;
//   3. when constraint.is_complete() and the token is a stop token, the output is done; a
//      complete state with no live stack (can_continue() false) allows only stop tokens.
// Speculative decoding: before verifying a draft, walk the drafts on a copy
// (GrammarConstraint draft = constraint; draft.accept(d) per draft token; stop proposing at the
// first draft it rejects), because the target's logits at draft position j must be masked with
// the state after drafts 0..j-1. Verify position j with sampler.verify(logits_j, history, d_j,
// q, &state_j), where state_j is the copy advanced by the accepted drafts; after verification,
// accept() the emitted tokens (accepted drafts + the replacement/bonus token) on the request's
// constraint, in order.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "bie/grammar/grammar.h"
#include "bie/grammar/matcher.h"
#include "bie/grammar/token_trie.h"
#include "bie/sampling/token_constraint.h"

namespace bie::grammar {

class GrammarConstraint final : public TokenConstraint {
 public:
  // note: grammar.check() must be ok; trie.n_vocab() must be the model's n_vocab.
  GrammarConstraint(const Grammar& grammar, const TokenTrie& trie);
  GrammarConstraint(const GrammarConstraint& other);
  GrammarConstraint& operator=(const GrammarConstraint&) = delete;

  [[nodiscard]] bool allows(int32_t token) override;
  void mask_logits(float* logits, int32_t n_vocab) override;

  // The full mask: bit `id` of allowed[id / 64] set iff token id may come next.
  void compute_mask(std::vector<uint64_t>& allowed);

  // Cache caps: past them the caches are dropped (at the start of the next mask).
  static constexpr size_t kMaxCachedStates = 200'000;
  static constexpr size_t kMaxCachedTransitions = 2'000'000;
  static constexpr size_t kMaxCachedMasks = 64;

  // Advances the state by `token`'s bytes; false (state unchanged) if the grammar rejects it.
  [[nodiscard]] bool accept(int32_t token);
  // Advances by raw bytes (e.g. a forced prefix); false (state unchanged) if rejected.
  [[nodiscard]] bool accept_bytes(std::string_view bytes);

  [[nodiscard]] bool is_complete() const { return state_.complete; }
  [[nodiscard]] bool can_continue() const { return state_.can_continue(); }
  [[nodiscard]] const GrammarMatcher::State& state() const { return state_; }
  void set_state(GrammarMatcher::State state) { state_ = std::move(state); }

 private:
  // The state after `bytes` into scratch (walk_[0] / walk_[1]); nullptr if rejected.
  const GrammarMatcher::State* walk(std::string_view bytes);

  // Parse states interned by content, with a lazily filled transition table: the mask walk
  // visits ~333k trie nodes for a 152k vocabulary, but inside a string nearly all of them
  // lead to a handful of distinct states, so almost every node is one hash lookup instead of
  // a matcher step. Content-addressed, so the caches stay valid from one step to the next,
  // and a whole mask is reused when the request comes back to a state (e.g. inside a string).
  [[nodiscard]] int32_t intern(const GrammarMatcher::State& s);
  [[nodiscard]] int32_t step(int32_t id, uint8_t byte);  // -1: rejected

  const TokenTrie& trie_;
  GrammarMatcher matcher_;
  GrammarMatcher::State state_;
  GrammarMatcher::State walk_[2];
  std::vector<uint64_t> mask_;  // mask_logits()' scratch

  std::unordered_map<std::string, int32_t> ids_;              // state content -> id
  std::vector<GrammarMatcher::State> states_;                 // [n_states] by id
  std::unordered_map<uint64_t, int32_t> next_;                // (id << 8 | byte) -> id or -1
  std::unordered_map<int32_t, std::vector<uint64_t>> masks_;  // state id -> its full mask
  std::vector<int32_t> id_by_depth_;                          // mask walk: state per trie depth
  GrammarMatcher::State scratch_;
  std::string key_;
};

}  // namespace bie::grammar
