// BpeModel: GGUF "gpt2" byte-level BPE. Pre-tokenizes with the vocabulary's regexes, maps bytes
// to GPT-2's printable code points and merges by rank (lowest first, leftmost on ties) with a
// heap over a linked list of symbols, as llama.cpp's llm_tokenizer_bpe_session does.
// Thread-safe: the word cache is guarded by a mutex; everything else is immutable.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "bie/common/result.h"
#include "bie/tokenizer/vocab.h"
#include "tokenizer/pre_tokenizer.h"

namespace bie::tokenizer {

class BpeModel {
 public:
  // note: `vocab` must outlive the model.
  static Result<std::unique_ptr<BpeModel>> create(const Vocab& vocab);

  // Appends the ids of one raw-text fragment (no special-token handling here).
  void encode(std::string_view text, std::vector<TokenId>& out) const;

  // Byte-level BPE of one pre-tokenized word (raw bytes), bypassing the cache.
  void encode_word(std::string_view word, std::vector<TokenId>& out) const;

  [[nodiscard]] size_t cache_size() const;

 private:
  struct Merge {
    int32_t rank;
    int32_t result;  // symbol id of the merged text
  };
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  BpeModel(const Vocab& vocab, PreTokenizer pre) : vocab_(vocab), pre_(std::move(pre)) {}
  [[nodiscard]] static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  [[nodiscard]] const Merge* find_merge(int32_t left, int32_t right) const;
  // Emits a final symbol: its token, or llama.cpp's per-byte fallback when it is not one.
  void emit(int32_t sym, std::string_view raw, std::vector<TokenId>& out) const;

  const Vocab& vocab_;
  PreTokenizer pre_;
  // Symbols are token ids, plus ids >= n_tokens for merge texts that are not tokens.
  std::vector<std::string> extra_texts_;  // [sym - n_tokens]
  int32_t byte_sym_[256] = {};            // symbol of each byte's mapped code point, or -1
  std::unordered_map<uint64_t, Merge> merges_;

  static constexpr size_t kMaxCachedWordBytes = 128;
  static constexpr size_t kMaxCacheEntries = 1 << 18;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<TokenId>, StringHash, std::equal_to<>> cache_;
};

}  // namespace bie::tokenizer
