// Parsing and validation of OpenAI /v1/completions and /v1/chat/completions request bodies into
// an EngineRequest plus what the response needs (stream flags, logprobs shape, model name).
// Every problem becomes an ApiError naming the field. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "bie/engine/engine.h"
#include "bie/tokenizer/chat_template.h"
#include "server/api_error.h"

namespace bie::server {

enum class Endpoint { kCompletions, kChat };

struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // as given; empty when absent
  // Completions: the prompt as text, or as token ids when the client sent integers.
  std::string prompt_text;
  std::vector<int32_t> prompt_tokens;
  bool prompt_is_tokens = false;
  // Chat: the conversation.
  std::vector<tokenizer::ChatMessage> messages;
  bool stream = false;
  bool include_usage = false;         // stream_options.include_usage
  bool logprobs = false;              // any logprobs asked for
  int32_t top_logprobs = 0;           // alternatives per token
  std::optional<int32_t> max_tokens;  // absent: the endpoint's default
  bool echo = false;                  // completions: the prompt's text before the completion
  EngineRequest engine;               // sampling, stop, logprobs (prompt filled in later)
  // Chat tools (OpenAI "tools", validated: each {"type": "function", "function": {"name", ...}}).
  nlohmann::ordered_json tools;  // null when absent or empty (keys in the client's order)
  enum class ToolChoice { kAuto, kNone, kRequired, kFunction };
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string tool_choice_name;  // kFunction: the function's name (one of tools)
  bool parallel_tool_calls = true;
  // response_format: "text" (default), "json_object" or "json_schema" (schema below).
  std::string response_format = "text";
  nlohmann::ordered_json response_schema;  // json_schema's "schema" object (client's order)
};

struct ParseLimits {
  int64_t max_model_len = 0;  // max_tokens above it is refused
  int32_t max_stop = 16;      // stop strings
  int32_t max_top_logprobs = 20;
  // Checked while the JSON text is scanned, before any value is built: OpenAI's shapes nest a
  // few levels (tool schemas a few dozen), and a prompt of token ids is one value per token.
  int32_t max_json_depth = 64;
  int64_t max_json_values = int64_t{1} << 21;
};

// Scans JSON text without building it; a 400 if it is malformed, nests deeper than
// max_json_depth, holds more than max_json_values values, or has a number that overflows.
[[nodiscard]] std::optional<ApiError> check_json_shape(std::string_view body,
                                                       const ParseLimits& limits);

// The body text to a ParsedRequest, or the 400 describing the first problem.
[[nodiscard]] std::variant<ParsedRequest, ApiError> parse_request(std::string_view body,
                                                                  Endpoint endpoint,
                                                                  const ParseLimits& limits);

// True when s is entirely valid UTF-8.
[[nodiscard]] bool valid_utf8(std::string_view s);

}  // namespace bie::server
