// ApiError: an HTTP error in OpenAI's JSON shape {"error": {"message", "type", "param", "code"}}.
// Plain data; thread-safe as values are.
#pragma once

#include <string>

namespace bie::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending request field, empty if none
  std::string code;   // machine-readable code, empty if none

  // The response body (JSON text).
  [[nodiscard]] std::string body() const;
};

// Convenience constructors for the statuses the server uses.
[[nodiscard]] ApiError bad_request(std::string message, std::string param = {},
                                   std::string code = {});
[[nodiscard]] ApiError unauthorized(std::string message);
[[nodiscard]] ApiError forbidden(std::string message);
[[nodiscard]] ApiError not_found(std::string message, std::string param = {},
                                 std::string code = {});
[[nodiscard]] ApiError too_large(std::string message, std::string param = {},
                                 std::string code = {});
[[nodiscard]] ApiError too_many_requests(std::string message);
[[nodiscard]] ApiError unavailable(std::string message);
[[nodiscard]] ApiError internal_error(std::string message);

}  // namespace bie::server
