// Tool calls in a model's output: each model family writes them in its own syntax, and the
// OpenAI API wants them as message.tool_calls with `arguments` a JSON *string*. This parses the
// three syntaxes the shipped and popular templates use, and follows a stream so that text before
// a call streams as content and a call is sent whole once it is complete. Pure functions and a
// per-request value type; thread-safe as values are.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace bie::server {

enum class ToolCallSyntax {
  kNone,
  kHermes,   // <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Qwen2.5, Hermes, SmolLM3)
  kLlama3,   // a bare {"name": ..., "parameters": {...}} object (or <|python_tag|>), Llama 3.x
  kMistral,  // [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
};

// The syntax a chat template teaches its model, from markers in the template text.
[[nodiscard]] ToolCallSyntax tool_call_syntax_of(std::string_view chat_template);

struct ToolCall {
  std::string id;  // "call_<request>_<index>"
  std::string name;
  std::string arguments;  // compact JSON text of the arguments object
};

struct ToolCallParse {
  std::string content;          // text outside the calls (trimmed of the whitespace around them)
  std::vector<ToolCall> calls;  // in order
  // A call was started but is not valid JSON / has no name: it stays in `content` and this says
  // why (the response then finishes with "stop", never with a half-made tool call).
  std::optional<std::string> error;
};

// Parses a whole assistant message. `id_prefix` makes the ids ("call_<prefix>_<i>").
[[nodiscard]] ToolCallParse parse_tool_calls(ToolCallSyntax syntax, std::string_view text,
                                             std::string_view id_prefix);

// Streaming: feed() text pieces as they are generated; it returns what can be sent as content
// now, holding back text that may be the start of a call marker. finish() parses what was held.
class ToolCallStream {
 public:
  ToolCallStream(ToolCallSyntax syntax, std::string id_prefix)
      : syntax_(syntax), id_prefix_(std::move(id_prefix)) {}
  [[nodiscard]] std::string feed(std::string_view piece);
  // The rest, parsed: content not yet sent, the calls, or the error (text then in content).
  [[nodiscard]] ToolCallParse finish();
  [[nodiscard]] bool in_call() const { return in_call_; }

 private:
  ToolCallSyntax syntax_;
  std::string id_prefix_;
  std::string held_;      // not yet sent: a possible marker prefix, or everything from a marker on
  bool in_call_ = false;  // a marker was seen: everything from it on is held until finish()
  bool any_sent_ = false;
};

}  // namespace bie::server
