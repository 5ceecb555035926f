#include "tokenizer/unicode.h"

#include <array>

namespace bie::tokenizer::unicode {

namespace {

bool is_cont(uint8_t b) {
  return (b & 0xC0) == 0x80;
}

struct ByteLevelTables {
  std::array<std::string, 256> to_text;
  std::array<uint32_t, 256> to_cpt{};

  ByteLevelTables() {
    // Printable Latin-1 bytes map to themselves; the other 68 bytes map to U+0100.. in order.
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_cpt[b] = keep ? static_cast<uint32_t>(b) : next++;
      append_utf8(to_text[b], to_cpt[b]);
    }
  }
};

const ByteLevelTables& tables() {
  static const ByteLevelTables t;
  return t;
}

}  // namespace

std::vector<uint32_t> decode_lenient(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t b = s[i];
    if (b < 0x80) {
      out.push_back(b);
      i += 1;
    } else if ((b & 0x40) == 0) {  // stray continuation byte
      out.push_back(kReplacement);
      i += 1;
    } else if ((b & 0x20) == 0) {
      if (i + 1 >= n || !is_cont(s[i + 1])) {
        out.push_back(kReplacement);
        i += 1;
      } else {
        out.push_back(((b & 0x1Fu) << 6) | (s[i + 1] & 0x3Fu));
        i += 2;
      }
    } else if ((b & 0x10) == 0) {
      if (i + 2 >= n || !is_cont(s[i + 1]) || !is_cont(s[i + 2])) {
        out.push_back(kReplacement);
        i += 1;
      } else {
        out.push_back(((b & 0x0Fu) << 12) | ((s[i + 1] & 0x3Fu) << 6) | (s[i + 2] & 0x3Fu));
        i += 3;
      }
    } else if ((b & 0x08) == 0) {
      if (i + 3 >= n || !is_cont(s[i + 1]) || !is_cont(s[i + 2]) || !is_cont(s[i + 3])) {
        out.push_back(kReplacement);
        i += 1;
      } else {
        out.push_back(((b & 0x07u) << 18) | ((s[i + 1] & 0x3Fu) << 12) | ((s[i + 2] & 0x3Fu) << 6) |
                      (s[i + 3] & 0x3Fu));
        i += 4;
      }
    } else {
      out.push_back(kReplacement);
      i += 1;
    }
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cpt) {
  if (cpt > 0x10FFFF) cpt = kReplacement;
  if (cpt < 0x80) {
    out.push_back(static_cast<char>(cpt));
  } else if (cpt < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cpt >> 6)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cpt >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cpt >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  }
}

int classify_sequence(std::string_view str) {
  if (str.empty()) return 0;
  const auto* s = reinterpret_cast<const uint8_t*>(str.data());
  const uint8_t b = s[0];
  if (b < 0x80) return 1;
  int len;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode Table 3-7)
  if (b >= 0xC2 && b <= 0xDF) {
    len = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    len = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    len = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k < len; ++k) {
    if (static_cast<size_t>(k) >= str.size()) return 0;
    const uint8_t c = s[k];
    if (k == 1 ? (c < lo || c > hi) : !is_cont(c)) return -k;
  }
  return len;
}

size_t valid_prefix_len(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const int k = classify_sequence(s.substr(i));
    if (k <= 0) break;
    i += static_cast<size_t>(k);
  }
  return i;
}

const std::string& byte_to_unicode(uint8_t b) {
  return tables().to_text[b];
}

int unicode_to_byte(uint32_t cpt) {
  if (cpt < 256) {
    const bool keep = (cpt >= '!' && cpt <= '~') || (cpt >= 0xA1 && cpt <= 0xAC) || (cpt >= 0xAE);
    return keep ? static_cast<int>(cpt) : -1;
  }
  const auto& t = tables();
  if (cpt >= 256 && cpt < 256 + 68) {
    for (int b = 0; b < 256; ++b) {
      if (t.to_cpt[b] == cpt) return b;
    }
  }
  return -1;
}

}  // namespace bie::tokenizer::unicode
