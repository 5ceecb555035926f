// PreTokenizer: splits raw text into words with a list of regexes applied in sequence, the way
// llama.cpp's unicode_regex_split does: each regex splits every current piece, and the text
// between matches is kept as a piece of its own. Regexes run through PCRE2 (UTF + UCP, JIT).
// Immutable after create(); split() is thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bie/common/result.h"
#include "bie/tokenizer/vocab.h"

namespace bie::tokenizer {

class PreTokenizer {
 public:
  // The regexes exactly as llama.cpp's llm_tokenizer_bpe lists them for `type`.
  [[nodiscard]] static std::vector<std::string> patterns_for(PreType type);

  static Result<PreTokenizer> create(PreType type) { return from_patterns(patterns_for(type)); }
  // Patterns in llama.cpp's spelling; `\s` and `\S` are rewritten to Unicode White_Space (what
  // llama.cpp's tables call whitespace; PCRE2's own \s also takes U+180E).
  static Result<PreTokenizer> from_patterns(const std::vector<std::string>& patterns);

  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

  // Splits `text`. `normalized` receives the text as llama.cpp sees it (malformed UTF-8 bytes
  // become U+FFFD); the returned [begin, end) byte ranges index into it, in order, covering it.
  void split(std::string_view text, std::string& normalized,
             std::vector<std::pair<size_t, size_t>>& words) const;

 private:
  struct Regex;
  PreTokenizer() = default;
  std::vector<std::unique_ptr<Regex>> regexes_;
};

}  // namespace bie::tokenizer
