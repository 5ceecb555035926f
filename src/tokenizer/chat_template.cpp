#include "bie/tokenizer/chat_template.h"

#include <string_view>

#include "bie/tokenizer/tokenizer.h"

namespace bie::tokenizer {

namespace {

bool contains(std::string_view hay, std::string_view needle) {
  return hay.find(needle) != std::string_view::npos;
}

// Jinja's `| trim`: strips leading and trailing whitespace (Python's str.strip()).
std::string_view trim(std::string_view s) {
  constexpr std::string_view kWs = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(kWs);
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(kWs);
  return s.substr(b, e - b + 1);
}

// The literal system turn a ChatML template writes when messages[0] is not a system message,
// e.g. SmolLM2's '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, ...<|im_end|>'.
// Only a literal inside a template string counts (a '{{' inside it means it is computed).
std::string chatml_default_system(std::string_view src) {
  constexpr std::string_view kOpen = "<|im_start|>system\\n";
  constexpr std::string_view kClose = "<|im_end|>";
  const size_t at = src.find(kOpen);
  if (at == std::string_view::npos) return {};
  const size_t body = at + kOpen.size();
  const size_t end = src.find(kClose, body);
  if (end == std::string_view::npos) return {};
  const std::string_view lit = src.substr(body, end - body);
  if (contains(lit, "'") || contains(lit, "\"") || contains(lit, "{") || contains(lit, "+")) {
    return {};
  }
  // Undo the template string's escapes (\n, \\, \').
  std::string out;
  for (size_t i = 0; i < lit.size(); ++i) {
    if (lit[i] == '\\' && i + 1 < lit.size()) {
      const char c = lit[++i];
      out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
    } else {
      out += lit[i];
    }
  }
  return out;
}

bool known_role(const std::string& r) {
  return r == "system" || r == "user" || r == "assistant";
}

}  // namespace

Result<ChatTemplate> ChatTemplate::detect(std::string_view src, const Tokenizer& tok) {
  const Vocab& v = tok.vocab();
  const auto has = [&](std::string_view t) { return v.find(t) != kNoToken; };
  ChatTemplate t;
  std::string_view family;
  if (contains(src, "<|im_start|>")) {
    family = "chatml";
  } else if (contains(src, "<start_of_turn>")) {
    family = "gemma";
  } else if (contains(src, "<|start_header_id|>")) {
    family = "llama3";
  } else if (!src.empty()) {
    return Error{
        "unsupported chat template (BIE renders ChatML, Gemma and Llama 3 templates); "
        "use /v1/completions with a prompt you format yourself"};
  } else if (has("<|im_start|>")) {
    family = "chatml";
  } else if (has("<start_of_turn>")) {
    family = "gemma";
  } else if (has("<|start_header_id|>")) {
    family = "llama3";
  } else {
    return Error{"the model has no chat template and no known chat tokens; use /v1/completions"};
  }
  t.name_ = std::string(family);
  const TokenId bos = tok.bos();
  const std::string bos_text = v.valid(bos) ? v.text(bos) : std::string();
  if (family == "chatml") {
    t.end_of_turn_ = "<|im_end|>";
    t.default_system_ = chatml_default_system(src);
  } else if (family == "gemma") {
    t.end_of_turn_ = "<end_of_turn>";
    t.bos_text_ = bos_text;
  } else {
    t.end_of_turn_ = "<|eot_id|>";
    t.bos_text_ = bos_text;
  }
  return t;
}

Result<std::string> ChatTemplate::render(std::span<const ChatMessage> messages,
                                         bool add_generation_prompt) const {
  if (messages.empty()) return Error{"messages must not be empty"};
  for (const ChatMessage& m : messages) {
    if (!known_role(m.role)) {
      return Error{"unknown message role '" + m.role +
                   "' (expected 'system', 'user' or 'assistant')"};
    }
  }
  std::string out;
  if (name_ == "chatml") {
    if (!default_system_.empty() && messages[0].role != "system") {
      out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
    }
    for (const ChatMessage& m : messages) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    }
    if (add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
  }
  if (name_ == "gemma") {
    // Gemma has no system role: the system text opens the first user turn, and turns must
    // alternate user/model starting with user.
    out += bos_text_;
    std::string prefix;
    size_t first = 0;
    if (messages[0].role == "system") {
      prefix = messages[0].content + "\n\n";
      first = 1;
    }
    for (size_t i = first; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      const bool want_user = (i - first) % 2 == 0;
      if ((m.role == "user") != want_user || m.role == "system") {
        return Error{
            "Gemma chat roles must alternate user/assistant/user/... (after an "
            "optional first system message)"};
      }
      out += "<start_of_turn>";
      out += m.role == "assistant" ? "model" : "user";
      out += "\n";
      if (i == first) out += prefix;
      out += trim(m.content);
      out += "<end_of_turn>\n";
    }
    if (add_generation_prompt) out += "<start_of_turn>model\n";
    return out;
  }
  // llama3
  out += bos_text_;
  for (const ChatMessage& m : messages) {
    out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
    out += trim(m.content);
    out += "<|eot_id|>";
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

}  // namespace bie::tokenizer
