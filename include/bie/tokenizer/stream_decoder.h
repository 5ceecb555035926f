// StreamDecoder: turns a stream of token ids into text one id at a time, returning only complete,
// valid UTF-8. A multi-byte character split across tokens is held back until its last byte
// arrives; bytes that can never form a character become U+FFFD at once; flush() ends the stream,
// replacing an unfinished tail with U+FFFD. One per sequence; not thread-safe.
#pragma once

#include <string>

#include "bie/tokenizer/tokenizer.h"

namespace bie::tokenizer {

class StreamDecoder {
 public:
  // note: `tokenizer` must outlive the decoder.
  explicit StreamDecoder(const Tokenizer& tokenizer, DecodeOptions opts = {})
      : tok_(tokenizer), opts_(opts) {}

  // Adds one token; returns the text that became complete (often empty).
  [[nodiscard]] std::string push(TokenId id);
  // Ends the stream: returns what is held back (an incomplete tail as U+FFFD) and resets.
  [[nodiscard]] std::string flush();
  // Forgets everything (a new stream).
  void reset();

  [[nodiscard]] size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tok_;
  DecodeOptions opts_;
  std::string pending_;  // bytes that do not yet form a complete character
  bool first_ = true;
};

}  // namespace bie::tokenizer
