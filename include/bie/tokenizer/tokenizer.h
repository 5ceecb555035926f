// Tokenizer: text <-> token ids for GGUF vocabularies ("gpt2" byte-level BPE and "llama"
// SentencePiece), matching llama.cpp's llama_tokenize / llama_token_to_piece / llama_detokenize.
// Owns its Vocab and models. Immutable after construction except for an internal, mutex-guarded
// BPE word cache: every method is safe to call from many threads.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bie/common/result.h"
#include "bie/tokenizer/vocab.h"

namespace bie::gguf {
class GgufFile;
}

namespace bie::tokenizer {

struct EncodeOptions {
  // Add BOS/EOS where the model's metadata asks for them (llama.cpp's add_special).
  bool add_special = true;
  // Match control-token texts (e.g. "<|im_start|>") in the text and emit their ids. User-defined
  // tokens are matched even when false, as llama.cpp does.
  bool parse_special = false;
  // Override the metadata's add_bos / add_eos (still only when add_special is true).
  std::optional<bool> add_bos;
  std::optional<bool> add_eos;
  // Remove kPlainMark from raw text before encoding it (text prepared by mark_plain()).
  bool strip_plain_marks = false;
};

// U+FDD0, a Unicode noncharacter: mark_plain() puts it inside control-token texts so they no
// longer match as control tokens; encode() with strip_plain_marks deletes it again.
inline constexpr std::string_view kPlainMark = "\xEF\xB7\x90";

struct DecodeOptions {
  // Drop a leading BOS and trailing EOS when the model adds them (llama.cpp's remove_special).
  bool remove_special = false;
  // Render control/unknown tokens as their text instead of nothing (llama.cpp's unparse_special).
  bool render_special = false;
};

class Tokenizer {
 public:
  static Result<Tokenizer> from_gguf(const gguf::GgufFile& file);
  static Result<Tokenizer> from_vocab(Vocab vocab);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  [[nodiscard]] std::vector<TokenId> encode(std::string_view text,
                                            const EncodeOptions& opts = {}) const;

  // The bytes a token stands for (not necessarily valid UTF-8 on its own). Control and unknown
  // tokens are empty unless render_special; an invalid id is empty.
  // `text` with every control-token text in it (e.g. "<|im_start|>") broken by kPlainMark, so
  // that encode(..., parse_special, strip_plain_marks) reads it as the plain characters: chat
  // message content goes through this, so a user cannot forge turns or system prompts.
  [[nodiscard]] std::string mark_plain(std::string_view text) const;

  [[nodiscard]] std::string_view token_to_piece(TokenId id, bool render_special = false) const;

  // Concatenated pieces, as llama_detokenize (including SPM leading-space removal and, for
  // vocabularies that ask for it, clean_up_tokenization_spaces).
  [[nodiscard]] std::string decode(std::span<const TokenId> ids,
                                   const DecodeOptions& opts = {}) const;

  [[nodiscard]] const Vocab& vocab() const { return *vocab_; }
  [[nodiscard]] int32_t n_tokens() const { return vocab_->n_tokens(); }
  [[nodiscard]] TokenId bos() const { return vocab_->ids().bos; }
  [[nodiscard]] TokenId eos() const { return vocab_->ids().eos; }
  // Newline token (llama.cpp's linefeed id): SPM "<0x0A>", BPE the encoding of "\n".
  [[nodiscard]] TokenId nl() const { return nl_; }
  [[nodiscard]] bool is_eog(TokenId id) const { return vocab_->is_eog(id); }

  // Raw-text fragments and special tokens, in order: llama.cpp's tokenizer_st_partition.
  struct Fragment {
    TokenId token = kNoToken;   // kNoToken for raw text
    size_t begin = 0, end = 0;  // byte range of the text
  };
  [[nodiscard]] std::vector<Fragment> partition(std::string_view text, bool parse_special) const;

 private:
  struct Models;
  Tokenizer() = default;

  std::unique_ptr<const Vocab> vocab_;
  std::unique_ptr<Models> models_;
  TokenId nl_ = kNoToken;
};

}  // namespace bie::tokenizer
