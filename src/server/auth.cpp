#include "server/auth.h"

namespace bie::server {

bool authorized(std::string_view header, std::string_view expected) {
  if (expected.empty()) return true;
  constexpr std::string_view kBearer = "Bearer ";
  if (header.size() < kBearer.size()) return false;
  // The scheme is case-insensitive (RFC 7235).
  for (size_t i = 0; i < kBearer.size(); ++i) {
    const char a = header[i], b = kBearer[i];
    if ((a | 0x20) != (b | 0x20)) return false;
  }
  std::string_view key = header.substr(kBearer.size());
  while (!key.empty() && key.front() == ' ') key.remove_prefix(1);
  while (!key.empty() && (key.back() == ' ' || key.back() == '\r')) key.remove_suffix(1);
  unsigned diff = key.size() == expected.size() ? 0u : 1u;
  for (size_t i = 0; i < expected.size(); ++i) {
    const char k = i < key.size() ? key[i] : 0;
    diff |= static_cast<unsigned>(static_cast<unsigned char>(k) ^
                                  static_cast<unsigned char>(expected[i]));
  }
  return diff == 0;
}

}  // namespace bie::server
