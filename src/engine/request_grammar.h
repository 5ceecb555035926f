// The engine's side of structured output: one TokenTrie per model (VocabTrie, built on first
// use and shared by every request) and, per request, a GrammarConstraint driven the way
// grammar/grammar_constraint.h describes: the sampler masks with it, every emitted token
// advances it, speculative drafts are walked on a copy of its state and cut at the first one
// the grammar rejects. VocabTrie is thread-safe; a RequestGrammar belongs to one request (the
// engine thread).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "bie/common/result.h"
#include "bie/grammar/grammar.h"
#include "bie/grammar/grammar_constraint.h"
#include "bie/grammar/token_trie.h"

namespace bie::tokenizer {
class Tokenizer;
}

namespace bie {

// The model's vocabulary as a TokenTrie: token pieces without special rendering (control tokens
// are empty, so a grammar never allows them) and the end-of-generation tokens as stop tokens.
class VocabTrie {
 public:
  explicit VocabTrie(const tokenizer::Tokenizer& tok) : tok_(tok) {}
  // Builds the trie on the first call (~0.1 s for a 150k vocabulary); later calls return it.
  [[nodiscard]] const grammar::TokenTrie& get();

 private:
  const tokenizer::Tokenizer& tok_;
  std::once_flag once_;
  std::unique_ptr<grammar::TokenTrie> trie_;
};

// The trie of `tok`'s vocabulary (what VocabTrie builds), for tests and tools.
[[nodiscard]] grammar::TokenTrie make_vocab_trie(const tokenizer::Tokenizer& tok);

class RequestGrammar {
 public:
  // A request's constraint, already advanced through `prefix`; an error if the grammar is not
  // well formed or rejects the prefix.
  [[nodiscard]] static Result<std::unique_ptr<RequestGrammar>> create(
      std::shared_ptr<const grammar::Grammar> grammar, const grammar::TokenTrie& trie,
      std::string_view prefix);

  // What Sampler::sample / verify mask with (the state before the next token).
  [[nodiscard]] TokenConstraint* constraint() { return &constraint_; }
  // Advances by an emitted token; a stop token leaves the state as it is. false: the grammar
  // rejects it (the state is unchanged).
  [[nodiscard]] bool accept(int32_t token);
  // Cuts `draft` before the first token the grammar rejects, walking the drafts on a copy of the
  // state (the request's own state is unchanged). A stop token is kept only where the grammar
  // is complete, and nothing after it.
  void trim_drafts(std::vector<int32_t>& draft);
  [[nodiscard]] bool is_complete() const { return constraint_.is_complete(); }
  // A copy in the same state (another choice of the request, n > 1).
  [[nodiscard]] std::unique_ptr<RequestGrammar> fork() const {
    return std::unique_ptr<RequestGrammar>(new RequestGrammar(*this));
  }

 private:
  RequestGrammar(std::shared_ptr<const grammar::Grammar> grammar, const grammar::TokenTrie& trie)
      : grammar_(std::move(grammar)), trie_(trie), constraint_(*grammar_, trie) {}
  RequestGrammar(const RequestGrammar&) = default;

  std::shared_ptr<const grammar::Grammar> grammar_;  // outlives constraint_ (declared first)
  const grammar::TokenTrie& trie_;
  grammar::GrammarConstraint constraint_;
};

}  // namespace bie
