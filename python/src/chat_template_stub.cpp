// TEMPORARY stand-in for tokenizer::ChatTemplate while the server branch's implementation is not
// on main: ChatML only. Compiled into the Python module only when no src/tokenizer/*.cpp defines
// ChatTemplate::detect (see python/CMakeLists.txt).
#include "bie/tokenizer/chat_template.h"
#include "bie/tokenizer/tokenizer.h"

namespace bie::tokenizer {

Result<ChatTemplate> ChatTemplate::detect(std::string_view /*template_source*/,
                                          const Tokenizer& tok) {
  EncodeOptions eo;
  eo.add_special = false;
  eo.parse_special = true;
  const std::vector<TokenId> ids = tok.encode("<|im_start|>", eo);
  if (ids.size() != 1) return Error{"the model has no chat template BIE knows"};
  ChatTemplate t;
  t.name_ = "chatml";
  t.end_of_turn_ = "<|im_end|>";
  return t;
}

Result<std::string> ChatTemplate::render(std::span<const ChatMessage> messages,
                                         bool add_generation_prompt) const {
  if (messages.empty()) return Error{"no messages"};
  std::string out;
  for (const ChatMessage& m : messages) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant")
      return Error{"unknown role '" + m.role + "' (use system, user or assistant)"};
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace bie::tokenizer
