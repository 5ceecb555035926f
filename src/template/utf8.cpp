#include "template/utf8.h"

namespace bie::jinja {

namespace {

size_t char_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  if ((c >> 3) == 0x1E) return 4;
  return 1;
}

}  // namespace

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::vector<std::string_view> utf8_chars(std::string_view s) {
  std::vector<std::string_view> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t n = char_len(static_cast<unsigned char>(s[i]));
    if (i + n > s.size()) n = 1;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) n = 1;
    }
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

bool is_python_space(std::string_view ch) {
  if (ch.size() == 1) {
    const auto c = static_cast<unsigned char>(ch[0]);
    return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  }
  // The non-ASCII code points for which Python's str.isspace() is true.
  static constexpr std::string_view kSpaces[] = {"\u0085", "\u00A0", "\u1680", "\u2000", "\u2001",
                                                 "\u2002", "\u2003", "\u2004", "\u2005", "\u2006",
                                                 "\u2007", "\u2008", "\u2009", "\u200A", "\u2028",
                                                 "\u2029", "\u202F", "\u205F", "\u3000"};
  for (std::string_view sp : kSpaces) {
    if (ch == sp) return true;
  }
  return false;
}

namespace {

uint32_t decode(std::string_view ch) {
  const auto c = static_cast<unsigned char>(ch[0]);
  if (ch.size() == 1) return c;
  uint32_t cp = ch.size() == 2 ? (c & 0x1F) : ch.size() == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < ch.size(); ++k)
    cp = (cp << 6) | (static_cast<unsigned char>(ch[k]) & 0x3F);
  return cp;
}

// Ranges where upper and lower case alternate: even code point upper, odd lower (or the other
// way round when `odd_upper`).
bool in_pairs(uint32_t cp, uint32_t lo, uint32_t hi) {
  return cp >= lo && cp <= hi;
}

uint32_t lower_cp(uint32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + 32;
  if (cp < 0x80) return cp;
  if ((cp >= 0xC0 && cp <= 0xDE && cp != 0xD7)) return cp + 0x20;
  if (cp == 0x178) return 0xFF;
  if (in_pairs(cp, 0x100, 0x12F) || in_pairs(cp, 0x132, 0x137) || in_pairs(cp, 0x14A, 0x177)) {
    return cp % 2 == 0 ? cp + 1 : cp;
  }
  if (in_pairs(cp, 0x139, 0x148) || in_pairs(cp, 0x179, 0x17E)) return cp % 2 == 1 ? cp + 1 : cp;
  if (cp >= 0x391 && cp <= 0x3AB && cp != 0x3A2) return cp + 0x20;
  if (cp == 0x386) return 0x3AC;
  if (cp >= 0x388 && cp <= 0x38A) return cp + 0x25;
  if (cp == 0x38C) return 0x3CC;
  if (cp == 0x38E || cp == 0x38F) return cp + 0x3F;
  if (cp >= 0x410 && cp <= 0x42F) return cp + 0x20;
  if (cp >= 0x400 && cp <= 0x40F) return cp + 0x50;
  if (in_pairs(cp, 0x460, 0x481) || in_pairs(cp, 0x48A, 0x4BF)) return cp % 2 == 0 ? cp + 1 : cp;
  if (cp >= 0xFF21 && cp <= 0xFF3A) return cp + 0x20;
  return cp;
}

uint32_t upper_cp(uint32_t cp) {
  if (cp >= 'a' && cp <= 'z') return cp - 32;
  if (cp < 0x80) return cp;
  if (cp == 0xB5) return 0x39C;
  if ((cp >= 0xE0 && cp <= 0xFE && cp != 0xF7)) return cp - 0x20;
  if (cp == 0xFF) return 0x178;
  if (cp == 0x131) return 'I';
  if (cp == 0x17F) return 'S';
  if (in_pairs(cp, 0x100, 0x12F) || in_pairs(cp, 0x132, 0x137) || in_pairs(cp, 0x14A, 0x177)) {
    return cp % 2 == 1 ? cp - 1 : cp;
  }
  if (in_pairs(cp, 0x139, 0x148) || in_pairs(cp, 0x179, 0x17E)) return cp % 2 == 0 ? cp - 1 : cp;
  if (cp == 0x3C2) return 0x3A3;
  if (cp >= 0x3B1 && cp <= 0x3CB) return cp - 0x20;
  if (cp == 0x3AC) return 0x386;
  if (cp >= 0x3AD && cp <= 0x3AF) return cp - 0x25;
  if (cp == 0x3CC) return 0x38C;
  if (cp == 0x3CD || cp == 0x3CE) return cp - 0x3F;
  if (cp >= 0x430 && cp <= 0x44F) return cp - 0x20;
  if (cp >= 0x450 && cp <= 0x45F) return cp - 0x50;
  if (in_pairs(cp, 0x460, 0x481) || in_pairs(cp, 0x48A, 0x4BF)) return cp % 2 == 1 ? cp - 1 : cp;
  if (cp >= 0xFF41 && cp <= 0xFF5A) return cp - 0x20;
  return cp;
}

// One character upper-cased; ß becomes "SS" as in Python.
void append_upper(std::string& out, uint32_t cp) {
  if (cp == 0xDF) {
    out += "SS";
  } else {
    utf8_append(out, upper_cp(cp));
  }
}

void append_title(std::string& out, uint32_t cp) {
  if (cp == 0xDF) {
    out += "Ss";  // Python's titlecase of ß
  } else {
    utf8_append(out, upper_cp(cp));
  }
}

bool cased(uint32_t cp) {
  return lower_cp(cp) != cp || upper_cp(cp) != cp || cp == 0xDF;
}

}  // namespace

std::string utf8_lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::string_view ch : utf8_chars(s)) {
    if (ch.size() == 1 && static_cast<unsigned char>(ch[0]) >= 0x80) {
      out += ch;  // a malformed byte stays as it is
    } else {
      utf8_append(out, lower_cp(decode(ch)));
    }
  }
  return out;
}

std::string utf8_upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::string_view ch : utf8_chars(s)) {
    if (ch.size() == 1 && static_cast<unsigned char>(ch[0]) >= 0x80) {
      out += ch;
    } else {
      append_upper(out, decode(ch));
    }
  }
  return out;
}

std::string utf8_title(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  for (std::string_view ch : utf8_chars(s)) {
    if (ch.size() == 1 && static_cast<unsigned char>(ch[0]) >= 0x80) {
      out += ch;
      prev_cased = false;
      continue;
    }
    const uint32_t cp = decode(ch);
    if (cased(cp)) {
      if (prev_cased) {
        utf8_append(out, lower_cp(cp));
      } else {
        append_title(out, cp);
      }
      prev_cased = true;
    } else {
      out += ch;
      prev_cased = false;
    }
  }
  return out;
}

std::string utf8_capitalize(std::string_view s) {
  std::string out;
  bool first = true;
  for (std::string_view ch : utf8_chars(s)) {
    if (ch.size() == 1 && static_cast<unsigned char>(ch[0]) >= 0x80) {
      out += ch;
    } else if (first) {
      append_title(out, decode(ch));
    } else {
      utf8_append(out, lower_cp(decode(ch)));
    }
    first = false;
  }
  return out;
}

}  // namespace bie::jinja
