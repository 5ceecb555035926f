// ChatTemplate: renders OpenAI-style messages into the prompt text a chat model was trained on.
// BIE does not run Jinja; it recognises the template families it knows from the GGUF's
// tokenizer.chat_template (ChatML as in SmolLM2/Qwen, Gemma's <start_of_turn>, Llama 3's
// <|start_header_id|>) and renders them natively; an unknown or missing template falls back to
// ChatML when the vocabulary has <|im_start|>, else is an error. Immutable; thread-safe.
#pragma once
#include <span>
#include <string>
#include <string_view>

#include "bie/common/result.h"

namespace bie::tokenizer {

class Tokenizer;

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" (others rejected by render)
  std::string content;
};

class ChatTemplate {
 public:
  // Picks the family from the template source (may be empty) and the tokenizer's vocabulary.
  [[nodiscard]] static Result<ChatTemplate> detect(std::string_view template_source,
                                                   const Tokenizer& tok);
  // The prompt text (special tokens written as their text; encode with parse_special = true).
  // Errors: no messages, an unknown role, a family that cannot express a message (e.g. Gemma's
  // system turn is folded into the first user turn, as its template does).
  [[nodiscard]] Result<std::string> render(std::span<const ChatMessage> messages,
                                           bool add_generation_prompt = true) const;
  [[nodiscard]] const std::string& name() const { return name_; }  // "chatml", "gemma", "llama3"
  // Texts that end an assistant turn (e.g. "<|im_end|>"), as extra stop strings.
  [[nodiscard]] const std::string& end_of_turn() const { return end_of_turn_; }

 private:
  std::string name_;
  std::string end_of_turn_;
  std::string bos_text_;  // prepended where the family's template writes bos_token
  // System turn the template inserts when the conversation has none (SmolLM2's ChatML does).
  std::string default_system_;
};

}  // namespace bie::tokenizer
