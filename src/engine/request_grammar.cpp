#include "engine/request_grammar.h"

#include <string>

#include "bie/tokenizer/tokenizer.h"

namespace bie {

grammar::TokenTrie make_vocab_trie(const tokenizer::Tokenizer& tok) {
  const int32_t n = tok.n_tokens();
  std::vector<std::string> pieces(static_cast<size_t>(n));
  std::vector<int32_t> stops;
  for (int32_t id = 0; id < n; ++id) {
    pieces[static_cast<size_t>(id)] = std::string(tok.token_to_piece(id, false));
    if (tok.is_eog(id)) stops.push_back(id);
  }
  if (tok.eos() >= 0 && tok.eos() < n && !tok.is_eog(tok.eos())) stops.push_back(tok.eos());
  return grammar::TokenTrie(std::move(pieces), std::move(stops));
}

const grammar::TokenTrie& VocabTrie::get() {
  std::call_once(once_,
                 [this] { trie_ = std::make_unique<grammar::TokenTrie>(make_vocab_trie(tok_)); });
  return *trie_;
}

Result<std::unique_ptr<RequestGrammar>> RequestGrammar::create(
    std::shared_ptr<const grammar::Grammar> grammar, const grammar::TokenTrie& trie,
    std::string_view prefix) {
  if (grammar == nullptr) return Error{"no grammar"};
  if (Status st = grammar->check(); !st)
    return Error{"the grammar is not well formed: " + st.error()};
  std::unique_ptr<RequestGrammar> rg(new RequestGrammar(std::move(grammar), trie));
  if (!prefix.empty() && !rg->constraint_.accept_bytes(prefix)) {
    return Error{"the grammar rejects the text the prompt already ends with"};
  }
  return rg;
}

bool RequestGrammar::accept(int32_t token) {
  if (token >= 0 && token < trie_.n_vocab() && trie_.is_stop(token)) return true;
  return constraint_.accept(token);
}

void RequestGrammar::trim_drafts(std::vector<int32_t>& draft) {
  if (draft.empty()) return;
  const grammar::GrammarMatcher::State saved = constraint_.state();
  size_t keep = 0;
  for (; keep < draft.size(); ++keep) {
    const int32_t d = draft[keep];
    if (d < 0 || d >= trie_.n_vocab()) break;
    if (trie_.is_stop(d)) {
      if (constraint_.is_complete()) ++keep;  // the end, and nothing after it
      break;
    }
    if (!constraint_.accept(d)) break;
  }
  constraint_.set_state(saved);
  draft.resize(keep);
}

}  // namespace bie
