#include "bie/tokenizer/vocab.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <span>
#include <unordered_map>

#include "bie/gguf/gguf_file.h"

namespace bie::tokenizer {

namespace {

// Texts llama.cpp (llama_vocab::impl::load, ggml-org/llama.cpp as vendored by llama-cpp-python
// 0.3.36) recognises. The first token in token_to_id iteration order matching a list becomes that
// id (when the file does not name it) and is forced to control type.
constexpr std::string_view kEotTexts[] = {
    "<|eot_id|>",      "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>", "<EOT>",      "_<EOT>",  "[EOT]",         "<end_of_utterance>"};
constexpr std::string_view kEomTexts[] = {"<|eom_id|>"};
constexpr std::string_view kFimPreTexts[] = {"<|fim_prefix|>", "<fim-prefix>",    "<fim_prefix>",
                                             "<PRE>",          "<|code_prefix|>", "<|prefix|>"};
constexpr std::string_view kFimSufTexts[] = {"<|fim_suffix|>", "<fim-suffix>",    "<fim_suffix>",
                                             "<SUF>",          "<|code_suffix|>", "<|suffix|>"};
constexpr std::string_view kFimMidTexts[] = {"<|fim_middle|>", "<fim-middle>",    "<fim_middle>",
                                             "<MID>",          "<|code_middle|>", "<|middle|>"};
constexpr std::string_view kFimPadTexts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>",
                                             "[PAD]"};
constexpr std::string_view kFimRepTexts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                             "<REPO>", "<reponame>"};
constexpr std::string_view kFimSepTexts[] = {"<|file_sep|>"};
// Every token with one of these texts ends generation (and is forced to control type).
constexpr std::string_view kEogTexts[] = {"<|eot_id|>",
                                          "<|im_end|>",
                                          "<|end|>",
                                          "<|return|>",
                                          "<|call|>",
                                          "<|flush|>",
                                          "<|calls|>",
                                          "<end_of_turn>",
                                          "<|endoftext|>",
                                          "</s>",
                                          "<|eom_id|>",
                                          "<EOT>",
                                          "_<EOT>",
                                          "[EOT]",
                                          "[EOS]",
                                          "<|end_of_text|>",
                                          "<end_of_utterance>",
                                          "<eos>",
                                          "<turn|>",
                                          "<|tool_response>"};
// gpt-oss: always rendered, so set to user-defined.
constexpr std::string_view kUserDefinedTexts[] = {"<|channel|>", "<|message|>", "<|start|>",
                                                  "<|constrain|>"};

uint16_t attr_of(TokenType t) {
  switch (t) {
    case TokenType::kUnknown:
      return kAttrUnknown;
    case TokenType::kUnused:
      return kAttrUnused;
    case TokenType::kNormal:
      return kAttrNormal;
    case TokenType::kControl:
      return kAttrControl;
    case TokenType::kUserDefined:
      return kAttrUserDefined;
    case TokenType::kByte:
      return kAttrByte;
    case TokenType::kUndefined:
      break;
  }
  return kAttrUndefined;
}

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
  read_id("tokenizer.ggml.fim_pre_token_id", d.ids.fim_pre);
  read_id("tokenizer.ggml.fim_suf_token_id", d.ids.fim_suf);
  read_id("tokenizer.ggml.fim_mid_token_id", d.ids.fim_mid);
  read_id("tokenizer.ggml.fim_pad_token_id", d.ids.fim_pad);
  read_id("tokenizer.ggml.fim_rep_token_id", d.ids.fim_rep);
  read_id("tokenizer.ggml.fim_sep_token_id", d.ids.fim_sep);
  read_id("tokenizer.ggml.prefix_token_id", d.ids.fim_pre);  // deprecated spellings win, as in
  read_id("tokenizer.ggml.suffix_token_id", d.ids.fim_suf);  // llama.cpp, which reads them last
  read_id("tokenizer.ggml.middle_token_id", d.ids.fim_mid);
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

  v.attrs_.resize(n);
  for (size_t i = 0; i < n; ++i) v.attrs_[i] = attr_of(v.type(static_cast<TokenId>(i)));
  size_t cap = 16;
  while (cap < 2 * n) cap *= 2;
  v.table_.assign(cap, Slot{});
  v.mask_ = cap - 1;
  for (size_t i = 0; i < n; ++i) {
    if (d.tokens[i].empty()) d.tokens[i] = fmt::format("[EMPTY_{}]", i);  // as llama.cpp does
    v.index_insert(static_cast<TokenId>(i));
  }

  v.detect_special_by_text();

  for (size_t i = 0; i < n; ++i) {
    if (v.attrs_[i] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) {
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

void Vocab::detect_special_by_text() {
  SpecialIds& ids = d_.ids;
  struct Category {
    std::span<const std::string_view> texts;
    TokenId* id;
  };
  const Category categories[] = {{kEotTexts, &ids.eot},        {kEomTexts, &ids.eom},
                                 {kFimPreTexts, &ids.fim_pre}, {kFimSufTexts, &ids.fim_suf},
                                 {kFimMidTexts, &ids.fim_mid}, {kFimPadTexts, &ids.fim_pad},
                                 {kFimRepTexts, &ids.fim_rep}, {kFimSepTexts, &ids.fim_sep}};

  // llama.cpp takes the first match in the iteration order of its token_to_id, a
  // std::unordered_map<std::string, llama_token> filled in id order. That order only matters
  // when a category has several candidates; then we rebuild the same map to read it.
  std::vector<std::pair<Category, std::vector<TokenId>>> pending;
  bool need_order = false;
  for (const Category& c : categories) {
    if (*c.id != kNoToken) continue;  // named by the file
    std::vector<TokenId> found;
    for (std::string_view t : c.texts) {
      if (const TokenId id = find(t); id != kNoToken) found.push_back(id);
    }
    need_order |= found.size() > 1;
    if (!found.empty()) pending.emplace_back(c, std::move(found));
  }
  if (need_order) {
    std::unordered_map<std::string, TokenId> token_to_id;
    for (size_t i = 0; i < d_.tokens.size(); ++i)
      token_to_id[d_.tokens[i]] = static_cast<TokenId>(i);
    std::unordered_map<TokenId, size_t> position;
    size_t pos = 0;
    for (const auto& [text, id] : token_to_id) position.emplace(id, pos++);
    for (auto& [c, found] : pending) {
      std::stable_sort(found.begin(), found.end(),
                       [&](TokenId a, TokenId b) { return position.at(a) < position.at(b); });
    }
  }
  for (const auto& [c, found] : pending) {
    *c.id = found.front();
    attrs_[found.front()] |= kAttrControl;
  }

  // Control tokens whose text says "unused" are marked unused.
  for (size_t i = 0; i < attrs_.size(); ++i) {
    if ((attrs_[i] & kAttrControl) && std::strstr(d_.tokens[i].c_str(), "unused") != nullptr) {
      attrs_[i] |= kAttrUnused;
    }
  }

  std::vector<TokenId> eog;
  for (TokenId id : {ids.fim_pad, ids.fim_rep, ids.fim_sep}) {
    if (id != kNoToken) eog.push_back(id);
  }
  for (std::string_view t : kEogTexts) {
    if (const TokenId id = find(t); id != kNoToken) {
      eog.push_back(id);
      attrs_[id] |= kAttrControl;
    }
  }
  for (std::string_view t : kUserDefinedTexts) {
    if (const TokenId id = find(t); id != kNoToken) attrs_[id] = kAttrUserDefined;
  }
  for (TokenId id : {ids.eos, ids.eot, ids.eom}) {
    if (id != kNoToken) eog.push_back(id);
  }
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());

  const auto eog_text = [&](std::string_view t) {
    return std::find_if(eog.begin(), eog.end(), [&](TokenId id) { return d_.tokens[id] == t; });
  };
  const auto drop = [&](std::vector<TokenId>::iterator it, uint16_t attr) {
    attrs_[*it] = attr;
    eog.erase(it);
  };
  // o200k_harmony / solar-open: "<|end|>" is not end-of-generation there.
  if (auto end = eog_text("<|end|>"); end != eog.end()) {
    const bool has_return = eog_text("<|return|>") != eog.end();
    const bool has_call = eog_text("<|call|>") != eog.end() || eog_text("<|calls|>") != eog.end();
    const bool has_flush = eog_text("<|flush|>") != eog.end();
    if ((has_return && has_call) || (has_call && has_flush)) drop(end, kAttrUserDefined);
  }
  // gemma4 / paddleocr: "</s>" is text when "<|tool_response>" exists.
  if (auto s = eog_text("</s>"); s != eog.end() && eog_text("<|tool_response>") != eog.end()) {
    drop(s, kAttrNormal);
  }
  eog_ = std::move(eog);
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
