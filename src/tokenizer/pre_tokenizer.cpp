#include "tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>

#include "tokenizer/unicode.h"

namespace bie::tokenizer {

namespace {

// Unicode White_Space, the set llama.cpp's unicode_set_whitespace holds.
constexpr std::string_view kWhiteSpace =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

// Rewrites \s and \S into explicit White_Space classes.
Result<std::string> rewrite_whitespace(std::string_view p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      ++i;
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : fmt::format("[{}]", kWhiteSpace);
      } else if (e == 'S') {
        if (in_class) return Error{fmt::format("pre-tokenizer: \\S inside a class in '{}'", p)};
        out += fmt::format("[^{}]", kWhiteSpace);
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[' && !in_class)
      in_class = true;
    else if (c == ']' && in_class)
      in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

std::vector<std::string> PreTokenizer::patterns_for(PreType type) {
  // Verbatim from llama.cpp (src/llama-vocab.cpp, llm_tokenizer_bpe).
  static const std::string kGpt2 =
      "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
  switch (type) {
    case PreType::kLlama3:
      return {
          "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
          "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"};
    case PreType::kQwen2:
      return {
          "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
          "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"};
    case PreType::kStarcoder:
      return {"\\p{N}", kGpt2};
    case PreType::kGpt2:
      return {kGpt2};
    case PreType::kDefault:
      break;
  }
  return {"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2, "\\p{N}+", "[0-9][0-9][0-9]"};
}

Result<PreTokenizer> PreTokenizer::from_patterns(const std::vector<std::string>& patterns) {
  PreTokenizer pt;
  for (const std::string& p : patterns) {
    auto rewritten = rewrite_whitespace(p);
    if (!rewritten.ok()) return Error{rewritten.error()};
    int err = 0;
    PCRE2_SIZE err_off = 0;
    auto r = std::make_unique<Regex>();
    r->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten->data()), rewritten->size(),
                            PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
    if (r->code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      return Error{fmt::format("pre-tokenizer: regex '{}' does not compile at offset {}: {}", p,
                               err_off, reinterpret_cast<const char*>(msg))};
    }
    // JIT is an optimisation only; the interpreter gives the same matches if it is unavailable.
    (void)pcre2_jit_compile(r->code, PCRE2_JIT_COMPLETE);
    pt.regexes_.push_back(std::move(r));
  }
  return pt;
}

void PreTokenizer::split(std::string_view text, std::string& normalized,
                         std::vector<std::pair<size_t, size_t>>& words) const {
  words.clear();
  // PCRE2 needs valid UTF-8; llama.cpp decodes leniently. When the two differ, `normalized` is
  // llama.cpp's re-encoding and `subject` the same with surrogates (valid for llama.cpp, not for
  // PCRE2) shown as U+FFFD, which has the same length and the same regex classes (not L, N, or
  // space).
  std::string subject_storage;
  std::string_view subject;
  if (unicode::valid_prefix_len(text) == text.size()) {
    normalized.assign(text);
    subject = normalized;
  } else {
    normalized.clear();
    for (uint32_t c : unicode::decode_lenient(text)) {
      unicode::append_utf8(normalized, c);
      unicode::append_utf8(subject_storage,
                           (c >= 0xD800 && c <= 0xDFFF) ? unicode::kReplacement : c);
    }
    subject = subject_storage;
  }
  if (normalized.empty()) return;

  std::vector<std::pair<size_t, size_t>> pieces{{0, subject.size()}};
  std::vector<std::pair<size_t, size_t>> next;
  const auto* base = reinterpret_cast<PCRE2_SPTR>(subject.data());
  for (const auto& re : regexes_) {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(re->code, nullptr);
    next.clear();
    for (const auto& [begin, end] : pieces) {
      // Each piece is matched on its own, so lookarounds cannot see past its ends.
      const PCRE2_SPTR s = base + begin;
      const size_t len = end - begin;
      size_t pos = 0;   // search start
      size_t last = 0;  // end of the previous match
      while (pos < len) {
        const int rc = pcre2_match(re->code, s, len, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
        if (rc < 0) break;
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        const size_t m0 = ov[0], m1 = ov[1];
        if (m1 == m0) {  // empty match: step one code point on (no piece for it)
          pos = m0 + 1;
          while (pos < len && (s[pos] & 0xC0) == 0x80) ++pos;
          continue;
        }
        if (m0 > last) next.emplace_back(begin + last, begin + m0);
        next.emplace_back(begin + m0, begin + m1);
        last = pos = m1;
      }
      if (last < len) next.emplace_back(begin + last, end);
    }
    pcre2_match_data_free(md);
    pieces.swap(next);
  }
  words = std::move(pieces);
}

}  // namespace bie::tokenizer
