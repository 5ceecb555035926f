#include "server/api_error.h"

#include <nlohmann/json.hpp>

namespace bie::server {

std::string ApiError::body() const {
  nlohmann::json e = {{"message", message},
                      {"type", type},
                      {"param", param.empty() ? nlohmann::json() : nlohmann::json(param)},
                      {"code", code.empty() ? nlohmann::json() : nlohmann::json(code)}};
  // Messages may quote user input that is not valid UTF-8: replace rather than throw.
  return nlohmann::json{{"error", e}}.dump(-1, ' ', false,
                                           nlohmann::json::error_handler_t::replace);
}

namespace {
ApiError make(int status, std::string message, std::string type, std::string param,
              std::string code) {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}
}  // namespace

ApiError bad_request(std::string message, std::string param, std::string code) {
  return make(400, std::move(message), "invalid_request_error", std::move(param), std::move(code));
}
ApiError unauthorized(std::string message) {
  return make(401, std::move(message), "authentication_error", {}, "invalid_api_key");
}
ApiError forbidden(std::string message) {
  return make(403, std::move(message), "permission_error", {}, "forbidden");
}

ApiError not_found(std::string message, std::string param, std::string code) {
  return make(404, std::move(message), "not_found_error", std::move(param), std::move(code));
}
ApiError too_large(std::string message, std::string param, std::string code) {
  return make(413, std::move(message), "invalid_request_error", std::move(param), std::move(code));
}
ApiError too_many_requests(std::string message) {
  return make(429, std::move(message), "rate_limit_error", {}, "queue_full");
}
ApiError unavailable(std::string message) {
  return make(503, std::move(message), "service_unavailable", {}, "unavailable");
}
ApiError internal_error(std::string message) {
  return make(500, std::move(message), "server_error", {}, "internal_error");
}

}  // namespace bie::server
