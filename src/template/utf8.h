// UTF-8 helpers for the Python str semantics templates rely on: len(), indexing and slicing count
// code points, and str.strip()/split() treat Unicode whitespace as whitespace. Stateless.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace bie::jinja {

// The string's code points as byte ranges (a malformed byte is one character of its own).
[[nodiscard]] std::vector<std::string_view> utf8_chars(std::string_view s);
[[nodiscard]] size_t utf8_length(std::string_view s);
// Python's str.isspace() for one code point given as its UTF-8 bytes.
[[nodiscard]] bool is_python_space(std::string_view ch);
// Appends code point cp (< 0x110000) as UTF-8.
void utf8_append(std::string& out, uint32_t cp);

}  // namespace bie::jinja

namespace bie::jinja {

// Python's str.lower()/str.upper() for the scripts chat text is mostly written in: ASCII,
// Latin-1, Latin Extended-A, Greek, Cyrillic and fullwidth Latin (others are left as they are;
// Greek final sigma is not special-cased).
[[nodiscard]] std::string utf8_lower(std::string_view s);
[[nodiscard]] std::string utf8_upper(std::string_view s);
// Python's str.title() and str.capitalize() over the same mapping.
[[nodiscard]] std::string utf8_title(std::string_view s);
[[nodiscard]] std::string utf8_capitalize(std::string_view s);

}  // namespace bie::jinja
