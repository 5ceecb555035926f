// UTF-8 helpers for the Python str semantics templates rely on: len(), indexing and slicing count
// code points, and str.strip()/split() treat Unicode whitespace as whitespace. Stateless.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace bie::jinja {

// The string's code points as byte ranges (a malformed byte is one character of its own).
[[nodiscard]] std::vector<std::string_view> utf8_chars(std::string_view s);
[[nodiscard]] size_t utf8_length(std::string_view s);
// Python's str.isspace() for one code point given as its UTF-8 bytes.
[[nodiscard]] bool is_python_space(std::string_view ch);

}  // namespace bie::jinja
