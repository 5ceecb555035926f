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

}  // namespace bie::jinja
