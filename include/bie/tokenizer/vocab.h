// Vocab: a tokenizer vocabulary as a GGUF file describes it (tokens, scores, types, BPE merges,
// special ids and flags), plus the lookups every tokenizer model needs (text -> id, special-token
// list, end-of-generation set). Follows llama.cpp's llama_vocab::load, including its overrides.
// Immutable after construction; safe to read from many threads.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "bie/common/result.h"

namespace bie::gguf {
class GgufFile;
}

namespace bie::tokenizer {

using TokenId = int32_t;
inline constexpr TokenId kNoToken = -1;

// GGUF tokenizer.ggml.token_type values.
enum class TokenType : uint8_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// Token attributes, bit for bit llama.cpp's llama_token_attr. A token starts with the one bit of
// its file type; loading may add bits (e.g. an end-of-turn text gains kAttrControl).
enum TokenAttr : uint16_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1 << 0,
  kAttrUnused = 1 << 1,
  kAttrNormal = 1 << 2,
  kAttrControl = 1 << 3,
  kAttrUserDefined = 1 << 4,
  kAttrByte = 1 << 5,
};

// GGUF tokenizer.ggml.model: "gpt2" is byte-level BPE, "llama" is SentencePiece (SPM).
enum class VocabKind : uint8_t { kBpe, kSpm };

// Pre-tokenizer regex families (tokenizer.ggml.pre); each names one list of regexes.
enum class PreType : uint8_t {
  kDefault,    // "default" (and SPM vocabularies, which do not pre-tokenize)
  kGpt2,       // "gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "roberta-bpe", ...
  kStarcoder,  // "starcoder", "smollm", "refact", "command-r", "codeshell", "exaone", ...
  kQwen2,      // "qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"
  kLlama3,     // "llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe", ...
};

// Maps a tokenizer.ggml.pre name; an Error names the unsupported value.
[[nodiscard]] Result<PreType> pre_type_from_name(std::string_view name);

// Ids the file names, completed by llama.cpp's detection by text (eot, eom, fim_*) at load.
struct SpecialIds {
  TokenId bos = kNoToken;
  TokenId eos = kNoToken;
  TokenId eot = kNoToken;  // end of turn
  TokenId eom = kNoToken;  // end of message
  TokenId unk = kNoToken;
  TokenId pad = kNoToken;
  TokenId sep = kNoToken;
  TokenId fim_pre = kNoToken;
  TokenId fim_suf = kNoToken;
  TokenId fim_mid = kNoToken;
  TokenId fim_pad = kNoToken;
  TokenId fim_rep = kNoToken;
  TokenId fim_sep = kNoToken;
};

// What the file says, before any derived lookups. Tests build these by hand.
struct VocabData {
  VocabKind kind = VocabKind::kBpe;
  std::string pre_name = "default";
  PreType pre = PreType::kDefault;
  std::vector<std::string> tokens;
  std::vector<float> scores;        // empty (all 0) or one per token
  std::vector<TokenType> types;     // empty (all normal) or one per token
  std::vector<std::string> merges;  // BPE: "left right", rank = index
  SpecialIds ids;
  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = false;  // SPM: prepend ' ' to text that follows a special token/start
  bool ignore_merges = false;     // BPE (llama3): a word that is a whole token skips merging
  bool clean_spaces = false;      // decode: llama.cpp's clean_up_tokenization_spaces
};

class Vocab {
 public:
  // Reads tokenizer.ggml.* from a model file. Unknown tokenizer models and pre-tokenizer names
  // are errors (llama.cpp silently falls back to "default" for the latter; we refuse).
  static Result<Vocab> from_gguf(const gguf::GgufFile& file);
  // Validates `data` (sizes, ids in range) and builds the lookups.
  static Result<Vocab> from_data(VocabData data);

  [[nodiscard]] const VocabData& data() const { return d_; }
  [[nodiscard]] VocabKind kind() const { return d_.kind; }
  [[nodiscard]] PreType pre() const { return d_.pre; }
  [[nodiscard]] int32_t n_tokens() const { return static_cast<int32_t>(d_.tokens.size()); }
  [[nodiscard]] bool valid(TokenId id) const { return id >= 0 && id < n_tokens(); }

  // note: call only if valid(id)
  [[nodiscard]] const std::string& text(TokenId id) const { return d_.tokens[id]; }
  [[nodiscard]] float score(TokenId id) const { return d_.scores.empty() ? 0.0f : d_.scores[id]; }
  // Type as the file gives it.
  [[nodiscard]] TokenType type(TokenId id) const {
    return d_.types.empty() ? TokenType::kNormal : d_.types[id];
  }
  // Attributes after llama.cpp's load-time overrides (TokenAttr bits).
  [[nodiscard]] uint16_t attr(TokenId id) const { return attrs_[id]; }
  [[nodiscard]] bool is_control(TokenId id) const { return (attr(id) & kAttrControl) != 0; }
  [[nodiscard]] bool is_eog(TokenId id) const;

  // Exact text lookup; kNoToken if absent. When two tokens share a text the later id wins.
  [[nodiscard]] TokenId find(std::string_view text) const;
  // SPM byte-fallback token for a byte: "<0xXX>", else the one-byte text, else unk.
  [[nodiscard]] TokenId byte_token(uint8_t b) const;

  [[nodiscard]] const SpecialIds& ids() const { return d_.ids; }
  [[nodiscard]] const std::vector<TokenId>& eog_ids() const { return eog_; }
  // Control, user-defined and unknown tokens, longest text first (ties by id): the order in
  // which llama.cpp's tokenizer_st_partition carves them out of raw text.
  [[nodiscard]] const std::vector<TokenId>& special_tokens() const { return special_; }

 private:
  // Open-addressing text -> id table (linear probing): one cache line per probe instead of a
  // node-based map's several, which matters for SPM's many failing lookups on 262k tokens.
  struct Slot {
    uint32_t hash = 0;
    TokenId id = kNoToken;  // kNoToken: empty
  };
  [[nodiscard]] static uint64_t hash_text(std::string_view s);
  void index_insert(TokenId id);

  // llama.cpp's detection of eot/eom/fim ids and end-of-generation tokens by their text.
  void detect_special_by_text();

  VocabData d_;
  std::vector<uint16_t> attrs_;
  std::vector<Slot> table_;
  uint64_t mask_ = 0;
  std::vector<TokenId> eog_;  // sorted
  std::vector<TokenId> special_;
  TokenId byte_tokens_[256] = {};
};

}  // namespace bie::tokenizer
