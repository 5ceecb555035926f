// SpmModel: GGUF "llama" SentencePiece (BPE flavour) as llama.cpp runs it: split into UTF-8
// characters, repeatedly merge the adjacent pair whose concatenation is the highest-scoring
// token (leftmost on ties), and spell leftovers with <0xXX> byte tokens.
// Immutable; thread-safe.
#pragma once

#include <string_view>
#include <vector>

#include "bie/tokenizer/vocab.h"

namespace bie::tokenizer {

class SpmModel {
 public:
  // note: `vocab` must outlive the model.
  explicit SpmModel(const Vocab& vocab) : vocab_(vocab) {}

  // Appends the ids of `text`, which must already have spaces escaped as U+2581.
  void encode(std::string_view text, std::vector<TokenId>& out) const;

 private:
  const Vocab& vocab_;
};

}  // namespace bie::tokenizer
