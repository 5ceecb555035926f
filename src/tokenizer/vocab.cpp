#include "bie/tokenizer/vocab.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "bie/gguf/gguf_file.h"

namespace bie::tokenizer {

namespace {

// Texts llama.cpp treats as end-of-generation (and forces to control type); llama_vocab::load.
constexpr std::array<std::string_view, 10> kEotTexts = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "<\xef\xbd\x9c"
    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
    "<end_of_utterance>"};
constexpr std::array<std::string_view, 9> kEogOnlyTexts = {
    "<|return|>", "<|call|>", "<|eom_id|>",   "<|fim_pad|>", "<fim-pad>",
    "<fim_pad>",  "<PAD>",    "<|fim_repo|>", "<|file_sep|>"};
// FIM markers are forced to control type too (they are not end-of-generation).
constexpr std::array<std::string_view, 15> kFimTexts = {
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>", "\xe2\x96\x81<PRE>",
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>", "\xe2\x96\x81<SUF>",
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>", "\xe2\x96\x81<MID>"};

struct PreName {
  std::string_view name;
  PreType type;
};
constexpr std::array<PreName, 28> kPreNames = {{
    {"default", PreType::kDefault},
    {"gpt-2", PreType::kGpt2},
    {"gpt2", PreType::kGpt2},
    {"phi-2", PreType::kGpt2},
    {"mpt", PreType::kGpt2},
    {"olmo", PreType::kGpt2},
    {"jais", PreType::kGpt2},
    {"jina-v1-en", PreType::kGpt2},
    {"jina-v2-code", PreType::kGpt2},
    {"roberta-bpe", PreType::kGpt2},
    {"exaone4", PreType::kGpt2},
    {"starcoder", PreType::kStarcoder},
    {"smollm", PreType::kStarcoder},
    {"refact", PreType::kStarcoder},
    {"command-r", PreType::kStarcoder},
    {"codeshell", PreType::kStarcoder},
    {"exaone", PreType::kStarcoder},
    {"minerva-7b", PreType::kStarcoder},
    {"qwen2", PreType::kQwen2},
    {"deepseek-r1-qwen", PreType::kQwen2},
    {"stablelm2", PreType::kQwen2},
    {"megrez", PreType::kQwen2},
    {"llama3", PreType::kLlama3},
    {"llama-v3", PreType::kLlama3},
    {"llama-bpe", PreType::kLlama3},
    {"falcon3", PreType::kLlama3},
    {"dbrx", PreType::kLlama3},
    {"smaug-bpe", PreType::kLlama3},
}};

// Names whose llama.cpp setup turns on ignore_merges and add_bos (the llama3 family proper).
bool is_llama3_proper(std::string_view n) {
  return n == "llama3" || n == "llama-v3" || n == "llama-bpe" || n == "falcon3";
}
// Names for which llama.cpp turns clean_up_tokenization_spaces off.
bool no_clean_spaces(std::string_view n) {
  return n == "smollm" || n == "qwen2" || n == "deepseek-r1-qwen" || n == "command-r";
}

Result<std::vector<std::string>> read_strings(const gguf::GgufFile& f, std::string_view key) {
  const gguf::Array* a = f.get_array(key);
  if (a == nullptr) return Error{fmt::format("tokenizer: missing array '{}'", key)};
  std::vector<std::string> out;
  out.reserve(a->items.size());
  for (const auto& v : a->items) {
    const auto* s = std::get_if<std::string>(&v);
    if (s == nullptr) return Error{fmt::format("tokenizer: '{}' must be an array of strings", key)};
    out.push_back(*s);
  }
  return out;
}

}  // namespace

Result<PreType> pre_type_from_name(std::string_view name) {
  for (const auto& p : kPreNames) {
    if (p.name == name) return p.type;
  }
  return Error{fmt::format(
      "tokenizer: unsupported pre-tokenizer '{}' (tokenizer.ggml.pre); supported: default, gpt-2, "
      "smollm/starcoder, qwen2, llama3/llama-bpe and their aliases",
      name)};
}

Result<Vocab> Vocab::from_gguf(const gguf::GgufFile& f) {
  VocabData d;
  const auto model = f.get_string("tokenizer.ggml.model");
  if (!model) return Error{"tokenizer: model file has no tokenizer.ggml.model"};
  if (*model == "gpt2") {
    d.kind = VocabKind::kBpe;
    d.ids.bos = 11;  // llama.cpp's defaults when the file names none
    d.ids.eos = 11;
    d.clean_spaces = true;
  } else if (*model == "llama") {
    d.kind = VocabKind::kSpm;
    d.ids.bos = 1;
    d.ids.eos = 2;
    d.ids.unk = 0;
    d.add_space_prefix = true;
    d.add_bos = true;
  } else {
    return Error{fmt::format(
        "tokenizer: unsupported tokenizer model '{}' (tokenizer.ggml.model); supported: gpt2 "
        "(byte-level BPE), llama (SentencePiece)",
        *model)};
  }

  const auto pre = f.get_string("tokenizer.ggml.pre");
  d.pre_name = pre ? std::string(*pre) : "default";
  if (d.kind == VocabKind::kBpe) {
    auto pt = pre_type_from_name(d.pre_name);
    if (!pt.ok()) return Error{pt.error()};
    d.pre = *pt;
    if (is_llama3_proper(d.pre_name)) {
      d.ignore_merges = true;
      d.add_bos = true;
    }
    if (no_clean_spaces(d.pre_name)) d.clean_spaces = false;
  }

  auto tokens = read_strings(f, "tokenizer.ggml.tokens");
  if (!tokens.ok()) return Error{tokens.error()};
  d.tokens = std::move(tokens.value());
  const size_t n = d.tokens.size();

  if (const gguf::Array* a = f.get_array("tokenizer.ggml.scores")) {
    if (a->items.size() != n) {
      return Error{fmt::format("tokenizer: {} scores for {} tokens", a->items.size(), n)};
    }
    d.scores.reserve(n);
    for (const auto& v : a->items) {
      const auto x = gguf::value_as_float(v);
      if (!x) return Error{"tokenizer: tokenizer.ggml.scores must be numeric"};
      d.scores.push_back(static_cast<float>(*x));
    }
  }
  if (const gguf::Array* a = f.get_array("tokenizer.ggml.token_type")) {
    if (a->items.size() != n) {
      return Error{fmt::format("tokenizer: {} token types for {} tokens", a->items.size(), n)};
    }
    d.types.reserve(n);
    for (const auto& v : a->items) {
      const auto x = gguf::value_as_int(v);
      if (!x) return Error{"tokenizer: tokenizer.ggml.token_type must be integers"};
      // llama.cpp maps anything outside 1..6 to "undefined".
      d.types.push_back(*x >= 1 && *x <= 6 ? static_cast<TokenType>(*x) : TokenType::kUndefined);
    }
  }
  if (d.kind == VocabKind::kBpe) {
    auto merges = read_strings(f, "tokenizer.ggml.merges");
    if (!merges.ok()) return Error{"tokenizer: gpt2 model file has no tokenizer.ggml.merges"};
    d.merges = std::move(merges.value());
  }

  // Special ids: an id outside the vocabulary keeps the default, as in llama.cpp.
  const auto read_id = [&](std::string_view key, TokenId& id) {
    if (const auto v = f.get_uint(key); v && *v < n) id = static_cast<TokenId>(*v);
  };
  read_id("tokenizer.ggml.bos_token_id", d.ids.bos);
  read_id("tokenizer.ggml.eos_token_id", d.ids.eos);
  read_id("tokenizer.ggml.eot_token_id", d.ids.eot);
  read_id("tokenizer.ggml.eom_token_id", d.ids.eom);
  read_id("tokenizer.ggml.unknown_token_id", d.ids.unk);
  read_id("tokenizer.ggml.seperator_token_id", d.ids.sep);  // sic: the GGUF key is misspelled
  read_id("tokenizer.ggml.padding_token_id", d.ids.pad);
  if (const auto v = f.get_bool("tokenizer.ggml.add_bos_token")) d.add_bos = *v;
  if (const auto v = f.get_bool("tokenizer.ggml.add_eos_token")) d.add_eos = *v;
  if (const auto v = f.get_bool("tokenizer.ggml.add_space_prefix")) d.add_space_prefix = *v;

  return from_data(std::move(d));
}

Result<Vocab> Vocab::from_data(VocabData data) {
  Vocab v;
  v.d_ = std::move(data);
  VocabData& d = v.d_;
  const size_t n = d.tokens.size();
  if (n == 0) return Error{"tokenizer: the vocabulary is empty"};
  if (n > static_cast<size_t>(INT32_MAX)) return Error{"tokenizer: vocabulary too large"};
  if (!d.scores.empty() && d.scores.size() != n) return Error{"tokenizer: scores/tokens mismatch"};
  if (!d.types.empty() && d.types.size() != n) return Error{"tokenizer: types/tokens mismatch"};
  for (TokenId* id :
       {&d.ids.bos, &d.ids.eos, &d.ids.eot, &d.ids.eom, &d.ids.unk, &d.ids.pad, &d.ids.sep}) {
    if (*id < kNoToken || *id >= static_cast<TokenId>(n)) *id = kNoToken;
  }
  if ((d.add_bos && d.ids.bos == kNoToken) || (d.add_eos && d.ids.eos == kNoToken)) {
    return Error{"tokenizer: add_bos/add_eos is set but the BOS/EOS id is missing"};
  }

  v.types_ = d.types.empty() ? std::vector<TokenType>(n, TokenType::kNormal) : d.types;
  size_t cap = 16;
  while (cap < 2 * n) cap *= 2;
  v.table_.assign(cap, Slot{});
  v.mask_ = cap - 1;
  for (size_t i = 0; i < n; ++i) {
    if (d.tokens[i].empty()) d.tokens[i] = fmt::format("[EMPTY_{}]", i);  // as llama.cpp does
    v.index_insert(static_cast<TokenId>(i));
  }

  // End-of-generation tokens are recognised by text and forced to control type.
  std::vector<TokenId> eog;
  for (std::string_view t : kEotTexts) {
    const TokenId id = v.find(t);
    if (id == kNoToken) continue;
    if (d.ids.eot == kNoToken) d.ids.eot = id;
    eog.push_back(id);
  }
  for (std::string_view t : kEogOnlyTexts) {
    const TokenId id = v.find(t);
    if (id == kNoToken) continue;
    if (t == "<|eom_id|>" && d.ids.eom == kNoToken) d.ids.eom = id;
    eog.push_back(id);
  }
  for (TokenId id : eog) v.types_[id] = TokenType::kControl;
  for (std::string_view t : kFimTexts) {
    if (const TokenId id = v.find(t); id != kNoToken) v.types_[id] = TokenType::kControl;
  }
  for (TokenId id : {d.ids.eos, d.ids.eot, d.ids.eom}) {
    if (id != kNoToken) eog.push_back(id);
  }
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
  v.eog_ = std::move(eog);

  for (size_t i = 0; i < n; ++i) {
    const TokenType t = v.types_[i];
    if (t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown) {
      v.special_.push_back(static_cast<TokenId>(i));
    }
  }
  std::stable_sort(v.special_.begin(), v.special_.end(),
                   [&](TokenId a, TokenId b) { return d.tokens[a].size() > d.tokens[b].size(); });

  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const char name[7] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>', 0};
    TokenId id = v.find(std::string_view(name, 6));
    const char byte = static_cast<char>(b);
    if (id == kNoToken) id = v.find(std::string_view(&byte, 1));
    v.byte_tokens_[b] = id != kNoToken ? id : d.ids.unk;
  }
  return v;
}

bool Vocab::is_eog(TokenId id) const {
  return std::binary_search(eog_.begin(), eog_.end(), id);
}

uint64_t Vocab::hash_text(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, then a murmur finaliser to spread low bits
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

void Vocab::index_insert(TokenId id) {
  const std::string& text = d_.tokens[id];
  const uint64_t h = hash_text(text);
  for (uint64_t i = h & mask_;; i = (i + 1) & mask_) {
    Slot& s = table_[i];
    if (s.id == kNoToken) {
      s = {static_cast<uint32_t>(h), id};
      return;
    }
    if (s.hash == static_cast<uint32_t>(h) && d_.tokens[s.id] == text) {
      s.id = id;  // a later duplicate wins, as in llama.cpp's token_to_id
      return;
    }
  }
}

TokenId Vocab::find(std::string_view text) const {
  const uint64_t h = hash_text(text);
  for (uint64_t i = h & mask_;; i = (i + 1) & mask_) {
    const Slot& s = table_[i];
    if (s.id == kNoToken) return kNoToken;
    if (s.hash == static_cast<uint32_t>(h) && d_.tokens[s.id] == text) return s.id;
  }
}

TokenId Vocab::byte_token(uint8_t b) const {
  return byte_tokens_[b];
}

}  // namespace bie::tokenizer
