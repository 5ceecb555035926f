// The OpenAI Responses API (/v1/responses) on top of chat completions: a request is translated
// into the equivalent chat body (input items -> messages, instructions -> a system message, flat
// function tools -> chat tools, text.format -> response_format, max_output_tokens -> max_tokens)
// and validated by the same parser; the result is written back as a Response object (output
// items: a message with output_text, function_call items) or as its streaming events
// (response.created, response.output_text.delta, response.completed, ...). Text and function
// tools only (no built-in tools, no stored state: previous_response_id is a 400). Pure
// functions; thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <variant>

#include "server/api_error.h"
#include "server/openai_response.h"
#include "server/tool_calls.h"

namespace bie::server {

// The /v1/responses body (JSON text) as a /v1/chat/completions body, or the 400.
[[nodiscard]] std::variant<std::string, ApiError> responses_to_chat(std::string_view body);

// The Response object of a finished request.
[[nodiscard]] nlohmann::json response_object(const ResponseContext& ctx, const std::string& text,
                                             std::span<const ToolCall> calls,
                                             const std::string& finish_reason, const Usage& usage);

// Streaming: the events of one response, in order, each as an SSE frame ("event: <type>\n
// data: {...}\n\n") with its sequence number.
class ResponseEvents {
 public:
  explicit ResponseEvents(const ResponseContext& ctx) : ctx_(ctx) {}
  // response.created + response.in_progress.
  [[nodiscard]] std::string start();
  // response.output_text.delta (opening the message item and its text part first).
  [[nodiscard]] std::string text(const std::string& delta);
  // The closing events: the message's done events, each function call as an item (added,
  // arguments done, done), then response.completed (or response.incomplete on "length").
  [[nodiscard]] std::string finish(std::span<const ToolCall> calls, const std::string& reason,
                                   const Usage& usage);

 private:
  [[nodiscard]] std::string event(const std::string& type, nlohmann::json payload);
  [[nodiscard]] std::string open_message();  // its added events, once
  ResponseContext ctx_;
  int64_t seq_ = 0;
  bool message_open_ = false;
  std::string text_;
};

}  // namespace bie::server
