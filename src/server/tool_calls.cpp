#include "server/tool_calls.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace bie::server {

// ordered: a call's arguments keep the order the model wrote them in (the schema's order).
using json = nlohmann::ordered_json;

namespace {

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralMarker = "[TOOL_CALLS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";

std::string_view trim(std::string_view s) {
  const auto ws = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
  while (!s.empty() && ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && ws(s.back())) s.remove_suffix(1);
  return s;
}

// One {"name", "arguments"|"parameters"} object to a call; nullopt with `why` otherwise.
std::optional<ToolCall> call_from(const json& j, std::string& why) {
  if (!j.is_object()) {
    why = "a tool call must be a JSON object";
    return std::nullopt;
  }
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) {
    why = "a tool call has no \"name\" string";
    return std::nullopt;
  }
  ToolCall c;
  c.name = name->get<std::string>();
  const json* args = nullptr;
  if (auto a = j.find("arguments"); a != j.end()) args = &*a;
  if (auto p = j.find("parameters"); args == nullptr && p != j.end()) args = &*p;
  if (args == nullptr || args->is_null()) {
    c.arguments = "{}";
  } else if (args->is_string()) {
    // Some models write the arguments already as a JSON string: keep it if it parses.
    const json inner = json::parse(args->get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (inner.is_discarded() || !inner.is_object()) {
      why = "a tool call's \"arguments\" string is not a JSON object";
      return std::nullopt;
    }
    c.arguments = inner.dump();
  } else if (args->is_object()) {
    c.arguments = args->dump();
  } else {
    why = "a tool call's \"arguments\" must be an object";
    return std::nullopt;
  }
  return c;
}

json parse_json(std::string_view text) {
  return json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}

void number(ToolCallParse& out, std::string_view id_prefix) {
  for (size_t i = 0; i < out.calls.size(); ++i) {
    out.calls[i].id = fmt::format("call_{}_{}", id_prefix, i);
  }
}

// Small models of the Hermes family (Qwen2.5-Coder 1.5B, for one) often write the call as a
// bare JSON object or inside a ```json fence instead of <tool_call> tags. Such a message is a
// call when it is exactly one {"name", "arguments"} object; anything else stays text.
std::optional<ToolCall> unfenced_call(std::string_view text) {
  std::string_view t = trim(text);
  if (t.substr(0, 3) == "```") {
    const size_t nl = t.find('\n');
    if (nl == std::string_view::npos || t.size() < 6 || t.substr(t.size() - 3) != "```") {
      return std::nullopt;
    }
    t = trim(t.substr(nl + 1, t.size() - 3 - (nl + 1)));
  }
  if (t.empty() || t.front() != '{') return std::nullopt;
  const json j = parse_json(t);
  if (j.is_discarded() || !j.is_object() || !j.contains("arguments")) return std::nullopt;
  std::string why;
  return call_from(j, why);
}

ToolCallParse parse_hermes(std::string_view text) {
  ToolCallParse out;
  if (text.find(kHermesOpen) == std::string_view::npos) {
    if (auto c = unfenced_call(text)) {
      out.calls.push_back(std::move(*c));
      return out;
    }
  }
  std::string content;
  size_t pos = 0;
  while (true) {
    const size_t open = text.find(kHermesOpen, pos);
    if (open == std::string_view::npos) {
      content += text.substr(pos);
      break;
    }
    content += text.substr(pos, open - pos);
    const size_t body = open + kHermesOpen.size();
    size_t close = text.find(kHermesClose, body);
    // A call cut off by max_tokens or EOS has no closing tag: parse what is there.
    const std::string_view inner =
        text.substr(body, close == std::string_view::npos ? std::string_view::npos : close - body);
    std::string why;
    const json j = parse_json(trim(inner));
    std::optional<ToolCall> c;
    if (j.is_discarded()) {
      why = "a <tool_call> does not hold valid JSON";
    } else {
      c = call_from(j, why);
    }
    if (!c) {
      out.error = why;
      out.calls.clear();
      out.content = std::string(trim(text));
      return out;
    }
    out.calls.push_back(std::move(*c));
    if (close == std::string_view::npos) break;
    pos = close + kHermesClose.size();
  }
  out.content = std::string(trim(content));
  return out;
}

// A JSON value (object or array of objects) of calls.
bool calls_from_value(const json& j, ToolCallParse& out, std::string& why) {
  if (j.is_array()) {
    for (const json& e : j) {
      auto c = call_from(e, why);
      if (!c) return false;
      out.calls.push_back(std::move(*c));
    }
    return !out.calls.empty() || (why = "an empty tool-call list", false);
  }
  auto c = call_from(j, why);
  if (!c) return false;
  out.calls.push_back(std::move(*c));
  return true;
}

ToolCallParse parse_marked_json(std::string_view text, std::string_view marker, bool bare_json) {
  ToolCallParse out;
  std::string_view t = trim(text);
  std::string_view prefix;
  if (const size_t m = t.find(marker); m != std::string_view::npos) {
    prefix = trim(t.substr(0, m));
    t = trim(t.substr(m + marker.size()));
  } else if (!bare_json || t.empty() || t.front() != '{') {
    out.content = std::string(t);  // plain text answer
    return out;
  }
  std::string why;
  const json j = parse_json(t);
  if (j.is_discarded()) {
    why = "the tool call is not valid JSON";
  } else if (calls_from_value(j, out, why)) {
    out.content = std::string(prefix);
    return out;
  }
  out.calls.clear();
  out.error = why;
  out.content = std::string(trim(text));
  return out;
}

// The longest suffix of `s` that is a proper prefix of `marker`.
size_t partial_marker(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

std::string_view marker_of(ToolCallSyntax s) {
  switch (s) {
    case ToolCallSyntax::kHermes:
      return kHermesOpen;
    case ToolCallSyntax::kMistral:
      return kMistralMarker;
    case ToolCallSyntax::kLlama3:
      return kPythonTag;
    case ToolCallSyntax::kNone:
      break;
  }
  return {};
}

}  // namespace

ToolCallSyntax tool_call_syntax_of(std::string_view t) {
  if (t.find(kHermesOpen) != std::string_view::npos) return ToolCallSyntax::kHermes;
  if (t.find(kMistralMarker) != std::string_view::npos) return ToolCallSyntax::kMistral;
  if (t.find("<|start_header_id|>") != std::string_view::npos &&
      (t.find("tools") != std::string_view::npos || t.find(kPythonTag) != std::string_view::npos)) {
    return ToolCallSyntax::kLlama3;
  }
  return ToolCallSyntax::kNone;
}

ToolCallParse parse_tool_calls(ToolCallSyntax syntax, std::string_view text,
                               std::string_view id_prefix) {
  ToolCallParse out;
  switch (syntax) {
    case ToolCallSyntax::kHermes:
      out = parse_hermes(text);
      break;
    case ToolCallSyntax::kMistral:
      out = parse_marked_json(text, kMistralMarker, /*bare_json=*/false);
      break;
    case ToolCallSyntax::kLlama3:
      out = parse_marked_json(text, kPythonTag, /*bare_json=*/true);
      break;
    case ToolCallSyntax::kNone:
      out.content = std::string(text);
      break;
  }
  number(out, id_prefix);
  return out;
}

std::string ToolCallStream::feed(std::string_view piece) {
  held_ += piece;
  if (syntax_ == ToolCallSyntax::kNone) {
    std::string out;
    out.swap(held_);
    return out;
  }
  if (in_call_) return {};
  // Llama 3 writes a call as a bare JSON object, small Hermes-family models sometimes too (or in
  // a ```json fence): the first non-space characters decide, so they are held until they do.
  if ((syntax_ == ToolCallSyntax::kLlama3 || syntax_ == ToolCallSyntax::kHermes) && !any_sent_) {
    const std::string_view t = trim(held_);
    if (t.empty()) return {};
    const bool fence = syntax_ == ToolCallSyntax::kHermes && t.substr(0, 3) == "```";
    if (t.front() == '{' || fence) {
      in_call_ = true;
      return {};
    }
    if (syntax_ == ToolCallSyntax::kHermes && std::string_view("```").substr(0, t.size()) == t) {
      return {};  // "`" or "``": may become a fence
    }
  }
  const std::string_view marker = marker_of(syntax_);
  if (const size_t m = held_.find(marker); m != std::string::npos) {
    std::string out = held_.substr(0, m);
    held_.erase(0, m);
    in_call_ = true;
    any_sent_ = any_sent_ || !out.empty();
    return out;
  }
  const size_t keep = partial_marker(held_, marker);
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  any_sent_ = any_sent_ || !out.empty();
  return out;
}

ToolCallParse ToolCallStream::finish() {
  ToolCallParse out;
  if (!in_call_) {
    out.content = std::move(held_);
    held_.clear();
    return out;
  }
  out = parse_tool_calls(syntax_, held_, id_prefix_);
  held_.clear();
  return out;
}

}  // namespace bie::server
