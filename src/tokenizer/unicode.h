// UTF-8 and byte-level helpers shared by the tokenizer models (private to src/tokenizer).
// Pure functions over immutable tables; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace bie::tokenizer::unicode {

inline constexpr uint32_t kReplacement = 0xFFFD;

// Length of the UTF-8 sequence a lead byte announces, from its high nibble only (continuation
// and invalid bytes count 1). This is how llama.cpp splits text into symbols.
[[nodiscard]] inline size_t seq_len_from_lead(uint8_t lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

// Decodes leniently, as llama.cpp's unicode_cpts_from_utf8 does: a malformed sequence yields
// U+FFFD and consumes one byte; overlong forms and surrogates are passed through as decoded.
[[nodiscard]] std::vector<uint32_t> decode_lenient(std::string_view text);

// Appends the UTF-8 encoding of cpt (surrogates are encoded like any other value; values above
// U+10FFFF become U+FFFD).
void append_utf8(std::string& out, uint32_t cpt);

// Length of the longest prefix of `s` that is complete, strictly valid UTF-8 (no overlongs, no
// surrogates, nothing above U+10FFFF).
[[nodiscard]] size_t valid_prefix_len(std::string_view s);

// Classifies the sequence starting at s[0] under strict UTF-8:
//   > 0: a complete valid sequence of that many bytes;
//     0: a valid but incomplete prefix (more bytes could complete it);
//   < 0: invalid; -n is the length of the maximal ill-formed subpart to replace by one U+FFFD.
[[nodiscard]] int classify_sequence(std::string_view s);

// GPT-2 byte-level mapping: every byte to one printable code point (as UTF-8 text), and back.
[[nodiscard]] const std::string& byte_to_unicode(uint8_t b);
// Returns the byte for a mapped code point, or -1 if cpt is not in the mapping.
[[nodiscard]] int unicode_to_byte(uint32_t cpt);

}  // namespace bie::tokenizer::unicode
