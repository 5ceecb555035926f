// API-key check for the Authorization header ("Bearer <key>"), as the OpenAI clients send it.
// Pure function; thread-safe.
#pragma once

#include <string_view>

namespace bie::server {

// True when `expected_key` is empty (auth off) or the header carries exactly that bearer key.
// The comparison takes the same time wherever the first difference is.
[[nodiscard]] bool authorized(std::string_view authorization_header, std::string_view expected_key);

}  // namespace bie::server
