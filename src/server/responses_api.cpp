#include "server/responses_api.h"

#include <fmt/format.h>

namespace bie::server {

namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

ApiError invalid(const std::string& message, const std::string& param) {
  return bad_request(message, param, "invalid_value");
}

// A message's content: a string, or parts of type input_text / output_text / text.
std::variant<std::string, ApiError> content_text(const ojson& content, const std::string& at) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return invalid(at + " must be a string or an array of text parts", at);
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const ojson& part = content[i];
    const std::string type = part.is_object() ? part.value("type", "") : "";
    if ((type != "input_text" && type != "output_text" && type != "text") ||
        !part.contains("text") || !part["text"].is_string()) {
      return invalid(
          fmt::format("{}[{}]: only text parts (input_text, output_text) are supported", at, i),
          fmt::format("{}[{}]", at, i));
    }
    out += part["text"].get<std::string>();
  }
  return out;
}

std::optional<ApiError> input_messages(const ojson& input, ojson& messages) {
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
    return std::nullopt;
  }
  if (!input.is_array()) return invalid("'input' must be a string or an array of items", "input");
  for (size_t i = 0; i < input.size(); ++i) {
    const ojson& item = input[i];
    const std::string at = fmt::format("input[{}]", i);
    if (!item.is_object()) return invalid(at + " must be an object", at);
    const std::string type = item.value("type", item.contains("role") ? "message" : "");
    if (type == "message") {
      if (!item.contains("role") || !item["role"].is_string()) {
        return invalid(at + ".role must be a string", at + ".role");
      }
      auto text = content_text(item.value("content", ojson("")), at + ".content");
      if (auto* e = std::get_if<ApiError>(&text)) return *e;
      messages.push_back({{"role", item["role"]}, {"content", std::get<std::string>(text)}});
    } else if (type == "function_call") {
      if (!item.contains("call_id") || !item["call_id"].is_string() || !item.contains("name") ||
          !item["name"].is_string() || !item.contains("arguments") ||
          !item["arguments"].is_string()) {
        return invalid(at + ": a function_call needs string call_id, name and arguments", at);
      }
      ojson call = {{"id", item["call_id"]},
                    {"type", "function"},
                    {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}};
      // Calls of one turn go into one assistant message.
      if (!messages.empty() && messages.back()["role"] == "assistant" &&
          messages.back().contains("tool_calls")) {
        messages.back()["tool_calls"].push_back(std::move(call));
      } else {
        messages.push_back(
            {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", ojson::array({call})}});
      }
    } else if (type == "function_call_output") {
      if (!item.contains("call_id") || !item["call_id"].is_string()) {
        return invalid(at + ".call_id must be a string", at + ".call_id");
      }
      ojson out = item.value("output", ojson(""));
      if (!out.is_string()) out = out.dump();
      messages.push_back({{"role", "tool"}, {"tool_call_id", item["call_id"]}, {"content", out}});
    } else {
      return invalid(at + ".type '" + type +
                         "' is not supported (message, function_call, function_call_output)",
                     at + ".type");
    }
  }
  return std::nullopt;
}

}  // namespace

std::variant<std::string, ApiError> responses_to_chat(std::string_view body) {
  const ojson j = ojson::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return bad_request("the JSON body must be an object", {}, "invalid_json");
  const auto given = [&](const char* k) { return j.contains(k) && !j[k].is_null(); };
  if (given("previous_response_id")) {
    return invalid("'previous_response_id' is not supported (responses are not stored)",
                   "previous_response_id");
  }
  ojson chat = ojson::object();
  for (const char* k : {"model", "temperature", "top_p", "stream", "parallel_tool_calls", "seed",
                        "stop", "top_k", "min_p", "ignore_eos"}) {
    if (given(k)) chat[k] = j[k];
  }
  if (given("max_output_tokens")) chat["max_tokens"] = j["max_output_tokens"];
  ojson messages = ojson::array();
  if (given("instructions")) {
    if (!j["instructions"].is_string())
      return invalid("'instructions' must be a string", "instructions");
    messages.push_back({{"role", "system"}, {"content", j["instructions"]}});
  }
  if (!given("input")) return bad_request("'input' is required", "input", "missing_field");
  if (auto e = input_messages(j["input"], messages)) return *e;
  chat["messages"] = std::move(messages);
  if (given("tools")) {
    if (!j["tools"].is_array()) return invalid("'tools' must be an array", "tools");
    ojson tools = ojson::array();
    for (size_t i = 0; i < j["tools"].size(); ++i) {
      const ojson& t = j["tools"][i];
      const std::string at = fmt::format("tools[{}]", i);
      if (!t.is_object() || t.value("type", "") != "function") {
        return invalid(at + ": only function tools are supported", at + ".type");
      }
      ojson fn = ojson::object();
      for (const char* k : {"name", "description", "parameters"}) {
        if (t.contains(k) && !t[k].is_null()) fn[k] = t[k];
      }
      tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    chat["tools"] = std::move(tools);
  }
  if (given("tool_choice")) {
    const ojson& c = j["tool_choice"];
    if (c.is_object() && c.value("type", "") == "function" && c.contains("name")) {
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", c["name"]}}}};
    } else {
      chat["tool_choice"] = c;
    }
  }
  if (given("text") && j["text"].is_object() && j["text"].contains("format")) {
    const ojson& f = j["text"]["format"];
    if (f.is_object() && f.value("type", "") == "json_schema") {
      ojson js = ojson::object();
      for (const char* k : {"name", "schema", "strict"}) {
        if (f.contains(k)) js[k] = f[k];
      }
      chat["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(js)}};
    } else {
      chat["response_format"] = f;
    }
  }
  return chat.dump();
}

namespace {

json usage_of(const Usage& u) {
  return {{"input_tokens", u.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", u.cached_tokens}}},
          {"output_tokens", u.completion_tokens},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

json message_item(const ResponseContext& ctx, const std::string& text, const char* status) {
  json content = json::array();
  if (std::string(status) == "completed") {
    content.push_back({{"type", "output_text"}, {"text", text}, {"annotations", json::array()}});
  }
  return {{"type", "message"},
          {"id", "msg_" + ctx.id},
          {"status", status},
          {"role", "assistant"},
          {"content", content}};
}

json call_item(const ToolCall& c, bool done) {
  return {{"type", "function_call"},
          {"id", "fc_" + c.id},
          {"call_id", c.id},
          {"name", c.name},
          {"arguments", done ? c.arguments : std::string()},
          {"status", done ? "completed" : "in_progress"}};
}

json response_shell(const ResponseContext& ctx, const char* status) {
  return {{"id", ctx.id},          {"object", "response"},    {"created_at", ctx.created},
          {"status", status},      {"error", nullptr},        {"incomplete_details", nullptr},
          {"model", ctx.model},    {"output", json::array()}, {"parallel_tool_calls", true},
          {"tool_choice", "auto"}, {"tools", json::array()},  {"usage", nullptr},
          {"bie", bie_object(ctx)}};
}

void set_outcome(json& r, const std::string& reason, const Usage& usage) {
  const bool cut = reason == "length";
  r["status"] = cut ? "incomplete" : "completed";
  if (cut) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  r["usage"] = usage_of(usage);
}

}  // namespace

json response_object(const ResponseContext& ctx, const std::string& text,
                     std::span<const ToolCall> calls, const std::string& finish_reason,
                     const Usage& usage) {
  json r = response_shell(ctx, "completed");
  if (!text.empty() || calls.empty()) r["output"].push_back(message_item(ctx, text, "completed"));
  for (const ToolCall& c : calls) r["output"].push_back(call_item(c, true));
  set_outcome(r, finish_reason, usage);
  return r;
}

std::string ResponseEvents::event(const std::string& type, json payload) {
  payload["type"] = type;
  payload["sequence_number"] = seq_++;
  return "event: " + type +
         "\ndata: " + payload.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string ResponseEvents::start() {
  const json shell = response_shell(ctx_, "in_progress");
  return event("response.created", {{"response", shell}}) +
         event("response.in_progress", {{"response", shell}});
}

std::string ResponseEvents::open_message() {
  std::string out;
  if (!message_open_) {
    message_open_ = true;
    out += event("response.output_item.added",
                 {{"output_index", 0}, {"item", message_item(ctx_, "", "in_progress")}});
    out +=
        event("response.content_part.added",
              {{"item_id", "msg_" + ctx_.id},
               {"output_index", 0},
               {"content_index", 0},
               {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}});
  }
  return out;
}

std::string ResponseEvents::text(const std::string& delta) {
  if (delta.empty()) return {};
  std::string out = open_message();
  text_ += delta;
  return out + event("response.output_text.delta", {{"item_id", "msg_" + ctx_.id},
                                                    {"output_index", 0},
                                                    {"content_index", 0},
                                                    {"delta", delta}});
}

std::string ResponseEvents::finish(std::span<const ToolCall> calls, const std::string& reason,
                                   const Usage& usage) {
  std::string out;
  if (calls.empty()) out += open_message();  // an empty answer is still a message
  json done = response_shell(ctx_, "completed");
  int index = 0;
  if (message_open_) {
    const std::string id = "msg_" + ctx_.id;
    const json part = {{"type", "output_text"}, {"text", text_}, {"annotations", json::array()}};
    out += event("response.output_text.done",
                 {{"item_id", id}, {"output_index", 0}, {"content_index", 0}, {"text", text_}});
    out += event("response.content_part.done",
                 {{"item_id", id}, {"output_index", 0}, {"content_index", 0}, {"part", part}});
    const json item = message_item(ctx_, text_, "completed");
    out += event("response.output_item.done", {{"output_index", 0}, {"item", item}});
    done["output"].push_back(item);
    index = 1;
  }
  for (const ToolCall& c : calls) {
    out += event("response.output_item.added",
                 {{"output_index", index}, {"item", call_item(c, false)}});
    out += event("response.function_call_arguments.delta",
                 {{"item_id", "fc_" + c.id}, {"output_index", index}, {"delta", c.arguments}});
    out += event("response.function_call_arguments.done",
                 {{"item_id", "fc_" + c.id}, {"output_index", index}, {"arguments", c.arguments}});
    out +=
        event("response.output_item.done", {{"output_index", index}, {"item", call_item(c, true)}});
    done["output"].push_back(call_item(c, true));
    ++index;
  }
  set_outcome(done, reason, usage);
  return out + event(reason == "length" ? "response.incomplete" : "response.completed",
                     {{"response", done}});
}

}  // namespace bie::server
