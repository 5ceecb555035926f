#include "server/openai_response.h"

#include <fmt/format.h>

#include "bie/tokenizer/tokenizer.h"
#include "server/openai_request.h"

namespace bie::server {

using nlohmann::json;

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse_frame(const json& payload) {
  return "data: " + dump(payload) + "\n\n";
}

json bie_object(const ResponseContext& ctx) {
  return {{"kv", ctx.kv_regime}, {"model_sha256", ctx.model_sha256}};
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

namespace {

// Token text, made valid for JSON (a token may be part of a multi-byte character).
std::string token_text(const ResponseContext& ctx, int32_t id) {
  if (ctx.tok == nullptr) return {};
  return std::string(ctx.tok->token_to_piece(id));
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// Chat shape: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}.
json chat_logprobs(const ResponseContext& ctx, std::span<const TokenEvent> events) {
  json content = json::array();
  for (const TokenEvent& e : events) {
    const std::string t = token_text(ctx, e.token);
    json top = json::array();
    for (const TopLogprob& alt : e.top) {
      const std::string at = token_text(ctx, alt.token);
      top.push_back({{"token", at}, {"logprob", alt.logprob}, {"bytes", bytes_of(at)}});
    }
    content.push_back(
        {{"token", t}, {"logprob", e.logprob}, {"bytes", bytes_of(t)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

}  // namespace

std::string logprob_key(std::string_view piece, int32_t id, const nlohmann::json& taken) {
  std::string key;
  if (valid_utf8(piece)) {
    key = piece;
  } else {
    // Part of a multi-byte character: its bytes, so two such tokens never share "\ufffd".
    key = "bytes:";
    for (unsigned char c : piece) key += fmt::format("\\x{:02x}", c);
  }
  if (key.empty() || taken.contains(key)) key = fmt::format("token_id:{}", id);
  return key;
}

namespace {

// Legacy completions shape: parallel arrays; text_offset counts bytes from `offset`. A
// top_logprobs object needs distinct keys: logprob_key gives each alternative its own.
json completion_logprobs(const ResponseContext& ctx, std::span<const TokenEvent> events,
                         int64_t offset) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  const json none = json::object();
  for (const TokenEvent& e : events) {
    tokens.push_back(logprob_key(token_text(ctx, e.token), e.token, none));
    lps.push_back(e.logprob);
    json top = json::object();
    for (const TopLogprob& alt : e.top) {
      top[logprob_key(token_text(ctx, alt.token), alt.token, top)] = alt.logprob;
    }
    tops.push_back(top);
    offs.push_back(offset);
    offset += static_cast<int64_t>(e.text.size());
  }
  return {
      {"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

json logprobs_for(const ResponseContext& ctx, std::span<const TokenEvent> events) {
  if (!ctx.logprobs) return nullptr;
  return ctx.endpoint == Endpoint::kChat ? chat_logprobs(ctx, events)
                                         : completion_logprobs(ctx, events, 0);
}

json finish_or_null(const std::string& reason) {
  return reason.empty() ? json(nullptr) : json(reason);
}

json tool_calls_json(std::span<const ToolCall> calls, bool indexed) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = {{"id", calls[i].id},
              {"type", "function"},
              {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (indexed) c["index"] = i;
    out.push_back(std::move(c));
  }
  return out;
}

// One streamed chunk around its single choice.
json chunk_envelope(const ResponseContext& ctx, json choice, bool with_usage_null) {
  const bool chat = ctx.endpoint == Endpoint::kChat;
  json j = {{"id", ctx.id},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", ctx.created},
            {"model", ctx.model},
            {"system_fingerprint", nullptr},
            {"choices", json::array({std::move(choice)})},
            {"bie", bie_object(ctx)}};
  if (with_usage_null) j["usage"] = nullptr;
  return j;
}

}  // namespace

json full_response(const ResponseContext& ctx, const std::string& text,
                   const std::string& finish_reason, const Usage& usage,
                   std::span<const TokenEvent> events, std::span<const ToolCall> tool_calls) {
  json choice = {{"index", ctx.choice},
                 {"logprobs", logprobs_for(ctx, events)},
                 {"finish_reason", finish_or_null(finish_reason)}};
  const bool chat = ctx.endpoint == Endpoint::kChat;
  if (chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
    if (!tool_calls.empty()) {
      if (text.empty()) choice["message"]["content"] = nullptr;
      choice["message"]["tool_calls"] = tool_calls_json(tool_calls, /*indexed=*/false);
    }
  } else {
    choice["text"] = text;
  }
  return {{"id", ctx.id},
          {"object", chat ? "chat.completion" : "text_completion"},
          {"created", ctx.created},
          {"model", ctx.model},
          {"system_fingerprint", nullptr},
          {"choices", json::array({choice})},
          {"usage", usage_json(usage)},
          {"bie", bie_object(ctx)}};
}

json stream_chunk(const ResponseContext& ctx, const std::string& text,
                  std::span<const TokenEvent> events, const std::string& finish_reason,
                  bool first_chat_chunk, bool with_usage_null) {
  const bool chat = ctx.endpoint == Endpoint::kChat;
  json choice = {{"index", ctx.choice},
                 {"logprobs", events.empty() ? json(nullptr) : logprobs_for(ctx, events)},
                 {"finish_reason", finish_or_null(finish_reason)}};
  if (chat) {
    json delta = json::object();
    if (first_chat_chunk) delta["role"] = "assistant";
    if (!text.empty() || first_chat_chunk) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  return chunk_envelope(ctx, std::move(choice), with_usage_null);
}

json tool_calls_chunk(const ResponseContext& ctx, std::span<const ToolCall> calls,
                      bool with_usage_null) {
  json choice = {{"index", ctx.choice},
                 {"logprobs", nullptr},
                 {"finish_reason", nullptr},
                 {"delta", {{"tool_calls", tool_calls_json(calls, /*indexed=*/true)}}}};
  return chunk_envelope(ctx, std::move(choice), with_usage_null);
}

json usage_chunk(const ResponseContext& ctx, const Usage& usage) {
  const bool chat = ctx.endpoint == Endpoint::kChat;
  return {{"id", ctx.id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", ctx.created},
          {"model", ctx.model},
          {"system_fingerprint", nullptr},
          {"choices", json::array()},
          {"usage", usage_json(usage)},
          {"bie", bie_object(ctx)}};
}

}  // namespace bie::server
