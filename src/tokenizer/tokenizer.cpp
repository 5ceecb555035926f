#include "bie/tokenizer/tokenizer.h"

#include <fmt/format.h>

#include "tokenizer/bpe_model.h"
#include "tokenizer/special_matcher.h"
#include "tokenizer/spm_model.h"
#include "tokenizer/unicode.h"

namespace bie::tokenizer {

namespace {

constexpr std::string_view kSpmSpace = "\xe2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out.append(to);
    pos = hit + from.size();
  }
  out.append(s, pos);
  s = std::move(out);
}

// Byte-level decode of a BPE token text (llama.cpp's llama_decode_text).
std::string byte_level_decode(const std::string& text) {
  std::string out;
  for (uint32_t cpt : unicode::decode_lenient(text)) {
    const int b = unicode::unicode_to_byte(cpt);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
      continue;
    }
    std::string utf8;
    unicode::append_utf8(utf8, cpt);
    out += "[UNK_BYTE_0x";
    for (char c : utf8) out += fmt::format("{:02x}", static_cast<uint8_t>(c));
    out += text + "]";
  }
  return out;
}

// Piece of a token with specials rendered (llama.cpp's token_to_piece with special = true).
std::string render_piece(const Vocab& v, TokenId id) {
  const std::string& text = v.text(id);
  const uint16_t attr = v.attr(id);
  if (attr & (kAttrControl | kAttrUnknown | kAttrUserDefined)) return text;
  if (attr & kAttrNormal) {
    if (v.kind() == VocabKind::kBpe) return byte_level_decode(text);
    std::string s = text;
    replace_all(s, kSpmSpace, " ");
    return s;
  }
  if ((attr & kAttrByte) && v.kind() == VocabKind::kSpm && text.size() == 6 &&
      text.starts_with("<0x")) {
    return std::string(1, static_cast<char>(std::stoi(text.substr(3, 2), nullptr, 16)));
  }
  return {};  // unused, undefined, and BPE byte tokens render as nothing
}

// llama.cpp's clean_up_tokenization_spaces passes, applied in place.
void clean_spaces(std::string& t) {
  // " ?", " !", " .", " ,": drop the space.
  size_t total = t.empty() ? 0 : 1;
  for (size_t i = 1; i < t.size(); ++i) {
    const char x = t[i];
    if (t[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) --total;
    t[total++] = x;
  }
  t.resize(total);
  // " ' ": drop both spaces around a lone apostrophe.
  total = t.empty() ? 0 : 1;
  for (size_t i = 1; i < t.size(); ++i) {
    const char x = t[i];
    if (x == '\'' && i + 1 < t.size() && t[i - 1] == ' ' && t[i + 1] == ' ') {
      --total;
      t[++i] = '\0';
    }
    t[total++] = x;
  }
  t.resize(total);
  // " 's", " 'm", " 're", " 've": drop the space.
  total = t.empty() ? 0 : 1;
  for (size_t i = 1; i < t.size(); ++i) {
    const char x = t[i];
    if (t[i - 1] == ' ' && x == '\'' && i + 1 < t.size()) {
      const char x1 = t[i + 1];
      if (x1 == 's' || x1 == 'm') {
        --total;
      } else if (i + 2 < t.size()) {
        const char x2 = t[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) --total;
      }
    }
    t[total++] = x;
  }
  t.resize(total);
}

}  // namespace

struct Tokenizer::Models {
  std::unique_ptr<BpeModel> bpe;
  std::unique_ptr<SpmModel> spm;
  std::unique_ptr<SpecialMatcher> special;
  std::vector<std::string> pieces;  // [n_tokens], specials rendered
};

Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Result<Tokenizer> Tokenizer::from_gguf(const gguf::GgufFile& file) {
  auto v = Vocab::from_gguf(file);
  if (!v.ok()) return Error{v.error()};
  return from_vocab(std::move(v.value()));
}

Result<Tokenizer> Tokenizer::from_vocab(Vocab vocab) {
  Tokenizer t;
  t.vocab_ = std::make_unique<const Vocab>(std::move(vocab));
  t.models_ = std::make_unique<Models>();
  const Vocab& v = *t.vocab_;
  if (v.kind() == VocabKind::kBpe) {
    auto bpe = BpeModel::create(v);
    if (!bpe.ok()) return Error{bpe.error()};
    t.models_->bpe = std::move(bpe.value());
  } else {
    t.models_->spm = std::make_unique<SpmModel>(v);
  }
  t.models_->special = std::make_unique<SpecialMatcher>(v);
  t.models_->pieces.reserve(static_cast<size_t>(v.n_tokens()));
  for (TokenId id = 0; id < v.n_tokens(); ++id) t.models_->pieces.push_back(render_piece(v, id));

  // As llama.cpp: the SPM byte token for '\n', else the first id of encoding "\n"; pad if none.
  if (v.kind() == VocabKind::kSpm) {
    t.nl_ = v.byte_token('\n');
  } else {
    EncodeOptions o;
    o.add_special = false;
    const std::vector<TokenId> ids = t.encode("\n", o);
    t.nl_ = ids.empty() ? kNoToken : ids.front();
  }
  if (t.nl_ == kNoToken) t.nl_ = v.ids().pad;
  return t;
}

std::vector<Tokenizer::Fragment> Tokenizer::partition(std::string_view text,
                                                      bool parse_special) const {
  return models_->special->partition(text, parse_special);
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, const EncodeOptions& opts) const {
  const VocabData& d = vocab_->data();
  const bool add_bos = opts.add_special && opts.add_bos.value_or(d.add_bos) && bos() != kNoToken;
  const bool add_eos = opts.add_special && opts.add_eos.value_or(d.add_eos) && eos() != kNoToken;

  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos) out.push_back(bos());
  const std::vector<Fragment> fragments = partition(text, opts.parse_special);
  std::string buf;
  if (vocab_->kind() == VocabKind::kBpe) {
    for (const Fragment& f : fragments) {
      if (f.token != kNoToken) {
        out.push_back(f.token);
      } else {
        std::string_view raw = text.substr(f.begin, f.end - f.begin);
        if (opts.strip_plain_marks && raw.find(kPlainMark) != std::string_view::npos) {
          buf = raw;
          replace_all(buf, kPlainMark, "");
          raw = buf;
        }
        models_->bpe->encode(raw, out);
      }
    }
  } else {
    // A raw fragment at the start or right after a special token gets a leading space when the
    // model asks for one (the BOS does not count: "is_prev_special" starts true either way).
    bool prev_special = true;
    for (const Fragment& f : fragments) {
      if (f.token != kNoToken) {
        out.push_back(f.token);
        prev_special = true;
        continue;
      }
      buf.clear();
      if (d.add_space_prefix && prev_special) buf.push_back(' ');
      buf.append(text.substr(f.begin, f.end - f.begin));
      if (opts.strip_plain_marks) replace_all(buf, kPlainMark, "");
      replace_all(buf, " ", kSpmSpace);
      models_->spm->encode(buf, out);
      prev_special = false;
    }
  }
  if (add_eos) out.push_back(eos());
  return out;
}

std::string Tokenizer::mark_plain(std::string_view text) const {
  std::string out;
  out.reserve(text.size());
  for (const Fragment& f : partition(text, /*parse_special=*/true)) {
    const std::string_view piece = text.substr(f.begin, f.end - f.begin);
    if (f.token == kNoToken || (vocab_->attr(f.token) & kAttrControl) == 0 || piece.empty()) {
      out += piece;
      continue;
    }
    // After the first character, so the text stays valid UTF-8.
    size_t first = 1;
    while (first < piece.size() && (static_cast<unsigned char>(piece[first]) & 0xC0) == 0x80) {
      ++first;
    }
    out += piece.substr(0, first);
    out += kPlainMark;
    out += piece.substr(first);
  }
  return out;
}

std::string_view Tokenizer::token_to_piece(TokenId id, bool render_special) const {
  if (!vocab_->valid(id)) return {};
  if (!render_special && (vocab_->attr(id) & (kAttrControl | kAttrUnknown))) return {};
  return models_->pieces[static_cast<size_t>(id)];
}

std::string Tokenizer::decode(std::span<const TokenId> ids, const DecodeOptions& opts) const {
  const VocabData& d = vocab_->data();
  bool remove_space = d.add_space_prefix;
  if (opts.remove_special && d.add_bos && !ids.empty() && ids.front() == bos()) {
    remove_space = false;
    ids = ids.subspan(1);
  }
  if (opts.remove_special && d.add_eos && !ids.empty() && ids.back() == eos()) {
    ids = ids.first(ids.size() - 1);
  }
  std::string out;
  for (TokenId id : ids) {
    std::string_view piece = token_to_piece(id, opts.render_special);
    if (remove_space && !piece.empty() && piece.front() == ' ') piece.remove_prefix(1);
    remove_space = false;
    out.append(piece);
  }
  if (d.clean_spaces) clean_spaces(out);
  return out;
}

}  // namespace bie::tokenizer
