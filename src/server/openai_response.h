// OpenAI response bodies: whole completions, streaming chunks (SSE framed), usage and logprobs,
// each carrying BIE's extra "bie" object (KV regime, model sha256). Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>

#include "bie/engine/engine.h"
#include "server/openai_request.h"
#include "server/tool_calls.h"

namespace bie::tokenizer {
class Tokenizer;
}

namespace bie::server {

struct ResponseContext {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;       // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;    // served model name
  std::string kv_regime;
  std::string model_sha256;
  bool logprobs = false;
  const tokenizer::Tokenizer* tok = nullptr;  // token texts for logprobs
  int32_t choice = 0;                         // the choice's "index" (n > 1)
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
};

// The key of one alternative in a legacy completions top_logprobs object: the token's text when
// it is valid UTF-8, else "bytes:\\xNN..." of its bytes; "token_id:N" when that key is empty or
// already in `taken`. Keys never collide, so a client sees every alternative.
[[nodiscard]] std::string logprob_key(std::string_view piece, int32_t id,
                                      const nlohmann::json& taken);

// The SSE frame for one JSON payload: "data: <json>\n\n".
[[nodiscard]] std::string sse_frame(const nlohmann::json& payload);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

// The "bie" extension object.
[[nodiscard]] nlohmann::json bie_object(const ResponseContext& ctx);
[[nodiscard]] nlohmann::json usage_json(const Usage& u);

// The whole (non-streamed) response. `events` are the generated tokens (for logprobs).
[[nodiscard]] nlohmann::json full_response(const ResponseContext& ctx, const std::string& text,
                                           const std::string& finish_reason, const Usage& usage,
                                           std::span<const TokenEvent> events,
                                           std::span<const ToolCall> tool_calls = {});

// One streamed chunk: `text` is the new text, `events` the tokens it came from (for logprobs),
// finish_reason empty until the last chunk; first_chat_chunk adds the assistant role (chat);
// with_usage_null adds "usage": null (stream_options.include_usage).
[[nodiscard]] nlohmann::json stream_chunk(const ResponseContext& ctx, const std::string& text,
                                          std::span<const TokenEvent> events,
                                          const std::string& finish_reason, bool first_chat_chunk,
                                          bool with_usage_null);

// The final usage chunk of a stream with include_usage ("choices": []).
// A chat chunk whose delta carries whole tool calls (OpenAI's delta.tool_calls, with index).
[[nodiscard]] nlohmann::json tool_calls_chunk(const ResponseContext& ctx,
                                              std::span<const ToolCall> calls,
                                              bool with_usage_null);
[[nodiscard]] nlohmann::json usage_chunk(const ResponseContext& ctx, const Usage& usage);

// JSON text that never throws on invalid UTF-8 (replaced by U+FFFD).
[[nodiscard]] std::string dump(const nlohmann::json& j);

}  // namespace bie::server
