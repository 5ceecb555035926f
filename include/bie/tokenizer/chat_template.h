// ChatTemplate: renders OpenAI-style messages into the prompt text a chat model was trained on,
// by running the model's own Jinja chat template (the GGUF's tokenizer.chat_template, or a
// --chat-template file) through bie::jinja with the context transformers gives it: messages,
// tools, documents, add_generation_prompt, bos_token and eos_token. A GGUF without a template
// gets a built-in one chosen by its vocabulary (ChatML when it has <|im_start|>, else Gemma's
// when it has <start_of_turn>), else detect() is an error naming --chat-template; see
// docs/chat-templates.md. Immutable after creation; render() is thread-safe.
#pragma once
#include <ctime>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "bie/common/result.h"
#include "bie/template/jinja.h"

namespace bie::tokenizer {

class Tokenizer;

struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string r, std::string c) : role(std::move(r)), content(std::move(c)) {}

  std::string role;     // "system", "user", "assistant", "tool", ... (the template decides)
  std::string content;  // text content
  // The rest of the OpenAI message as the template should see it: "tool_calls",
  // "tool_call_id", "name"; a "content" here (null, or an array of parts) replaces `content`.
  // An object or null.
  nlohmann::ordered_json extra;

  // The message as the template sees it: {"role", "content", ...extra}.
  [[nodiscard]] nlohmann::ordered_json to_json() const;
};

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  nlohmann::ordered_json tools;      // OpenAI "tools" array; null: the template sees none
  nlohmann::ordered_json documents;  // RAG documents; null: none
  // More template variables (OpenAI's chat_template_kwargs, e.g. enable_thinking); they cannot
  // replace messages, tools, documents or add_generation_prompt.
  nlohmann::ordered_json variables;
  std::optional<std::tm> now;  // what strftime_now() formats (unset: local time)
  // OpenAI sends tool_calls[].function.arguments as a JSON string; HF templates expect the
  // object (transformers' convention; vLLM converts too). When set, an arguments string that
  // parses as a JSON object is passed as that object; anything else is left as it is.
  bool tool_arguments_as_objects = true;
};

class ChatTemplate {
 public:
  // The model's template: `gguf_source` is its tokenizer.chat_template (may be empty, then the
  // vocabulary picks a built-in one). Errors: a template that does not parse (with line and
  // column), or no template and no known chat tokens.
  [[nodiscard]] static Result<ChatTemplate> detect(std::string_view gguf_source,
                                                   const Tokenizer& tok);
  // A template given as text (--chat-template FILE); `origin` names it in name()/errors.
  [[nodiscard]] static Result<ChatTemplate> from_source(std::string_view source,
                                                        const Tokenizer& tok,
                                                        std::string origin = "file");

  // The prompt text (special tokens written as their text; encode with parse_special = true).
  // Errors: no messages, or whatever the template refuses (raise_exception, a type error),
  // with the template's line and column.
  [[nodiscard]] Result<std::string> render(std::span<const ChatMessage> messages,
                                           bool add_generation_prompt = true) const;
  [[nodiscard]] Result<std::string> render(std::span<const ChatMessage> messages,
                                           const ChatRenderOptions& opts) const;
  // Messages as OpenAI JSON (an array of objects), passed to the template unchanged.
  [[nodiscard]] Result<std::string> render_json(const nlohmann::ordered_json& messages,
                                                const ChatRenderOptions& opts) const;

  // The turn format the template writes, for logs and model_info: "chatml", "gemma",
  // "llama3", "phi3", "mistral", "deepseek" or "jinja" (rendering never depends on it).
  [[nodiscard]] const std::string& name() const { return name_; }
  // Where the template came from: "gguf", "file", "builtin:chatml" or "builtin:gemma".
  [[nodiscard]] const std::string& origin() const { return origin_; }
  [[nodiscard]] const std::string& source() const { return source_; }
  // Text that ends an assistant turn, as an extra stop string: the first of the known
  // end-of-turn tokens (<|im_end|>, <end_of_turn>, <|eot_id|>, <|end|>, ...) that the template
  // writes and the vocabulary has, else the EOS token's text.
  [[nodiscard]] const std::string& end_of_turn() const { return end_of_turn_; }

 private:
  jinja::Template tmpl_;
  std::string source_;
  std::string name_;
  std::string origin_;
  std::string end_of_turn_;
  std::optional<std::string> bos_text_;
  std::optional<std::string> eos_text_;
};

}  // namespace bie::tokenizer
