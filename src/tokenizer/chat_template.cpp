#include "bie/tokenizer/chat_template.h"

#include <string_view>

#include "bie/tokenizer/tokenizer.h"

namespace bie::tokenizer {

namespace {

// Built-in templates for GGUFs that carry none. ChatML as SmolLM2/Qwen-style models write it;
// Gemma 3's instruction template (google/gemma-3-*-it, text and image parts), which is what
// the Gemma 3 270M base GGUF BIE ships lacks.
constexpr std::string_view kChatmlTemplate =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

constexpr std::string_view kGemmaTemplate = R"TPL({{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
)TPL";

bool contains(std::string_view hay, std::string_view needle) {
  return hay.find(needle) != std::string_view::npos;
}

// A label for the turn format, from the markers the template writes.
std::string family_of(std::string_view src) {
  if (contains(src, "<|im_start|>")) return "chatml";
  if (contains(src, "<start_of_turn>")) return "gemma";
  if (contains(src, "<|start_header_id|>")) return "llama3";
  if (contains(src, "<|user|>")) return "phi3";
  if (contains(src, "[INST]")) return "mistral";
  if (contains(src, "<｜User｜>")) return "deepseek";
  return "jinja";
}

// messages with every tool_calls[].function.arguments that is a JSON-object string parsed.
nlohmann::ordered_json with_object_arguments(const nlohmann::ordered_json& messages) {
  nlohmann::ordered_json out = messages;
  for (auto& m : out) {
    if (!m.is_object()) continue;
    auto calls = m.find("tool_calls");
    if (calls == m.end() || !calls->is_array()) continue;
    for (auto& c : *calls) {
      if (!c.is_object()) continue;
      auto fn = c.find("function");
      if (fn == c.end() || !fn->is_object()) continue;
      auto args = fn->find("arguments");
      if (args == fn->end() || !args->is_string()) continue;
      auto parsed = nlohmann::ordered_json::parse(args->get<std::string>(), nullptr,
                                                  /*allow_exceptions=*/false);
      if (parsed.is_object()) *args = std::move(parsed);
    }
  }
  return out;
}

std::optional<std::string> token_text(const Vocab& v, TokenId id) {
  if (!v.valid(id)) return std::nullopt;
  return v.text(id);
}

}  // namespace

nlohmann::ordered_json ChatMessage::to_json() const {
  nlohmann::ordered_json m = nlohmann::ordered_json::object();
  m["role"] = role;
  m["content"] = content;
  if (extra.is_object()) {
    for (auto it = extra.begin(); it != extra.end(); ++it) m[it.key()] = it.value();
  }
  return m;
}

Result<ChatTemplate> ChatTemplate::from_source(std::string_view source, const Tokenizer& tok,
                                               std::string origin) {
  auto parsed = jinja::Template::parse(source);
  if (!parsed.ok()) {
    return Error{"the chat template (" + origin + ") cannot be used: " + parsed.error() +
                 "; pass a template BIE can render with --chat-template FILE"};
  }
  ChatTemplate t;
  t.tmpl_ = std::move(parsed.value());
  t.source_ = std::string(source);
  t.name_ = family_of(source);
  t.origin_ = std::move(origin);
  const Vocab& v = tok.vocab();
  t.bos_text_ = token_text(v, tok.bos());
  t.eos_text_ = token_text(v, tok.eos());
  // The turn terminator: a known one the template writes and the vocabulary has as a token.
  static constexpr std::string_view kEndOfTurn[] = {
      "<|im_end|>",    "<end_of_turn>", "<|eot_id|>", "<|end|>", "<｜end▁of▁sentence｜>",
      "<|endoftext|>", "</s>"};
  for (std::string_view e : kEndOfTurn) {
    if (contains(source, e) && v.find(e) != kNoToken) {
      t.end_of_turn_ = std::string(e);
      break;
    }
  }
  if (t.end_of_turn_.empty() && t.eos_text_) t.end_of_turn_ = *t.eos_text_;
  return t;
}

Result<ChatTemplate> ChatTemplate::detect(std::string_view gguf_source, const Tokenizer& tok) {
  if (!gguf_source.empty()) return from_source(gguf_source, tok, "gguf");
  const Vocab& v = tok.vocab();
  if (v.find("<|im_start|>") != kNoToken && v.find("<|im_end|>") != kNoToken) {
    return from_source(kChatmlTemplate, tok, "builtin:chatml");
  }
  if (v.find("<start_of_turn>") != kNoToken && v.find("<end_of_turn>") != kNoToken) {
    return from_source(kGemmaTemplate, tok, "builtin:gemma");
  }
  return Error{
      "the model has no chat template (tokenizer.chat_template) and its vocabulary has no "
      "ChatML or Gemma turn tokens; pass one with --chat-template FILE, or use "
      "/v1/completions with a prompt you format yourself"};
}

Result<std::string> ChatTemplate::render(std::span<const ChatMessage> messages,
                                         bool add_generation_prompt) const {
  ChatRenderOptions o;
  o.add_generation_prompt = add_generation_prompt;
  return render(messages, o);
}

Result<std::string> ChatTemplate::render(std::span<const ChatMessage> messages,
                                         const ChatRenderOptions& opts) const {
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) arr.push_back(m.to_json());
  return render_json(arr, opts);
}

Result<std::string> ChatTemplate::render_json(const nlohmann::ordered_json& messages,
                                              const ChatRenderOptions& opts) const {
  if (!messages.is_array() || messages.empty()) {
    return Error{"messages must be a non-empty array"};
  }
  // The context transformers' apply_chat_template builds; an absent special token is left
  // undefined, as there.
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  if (opts.variables.is_object()) {
    for (auto it = opts.variables.begin(); it != opts.variables.end(); ++it) {
      ctx[it.key()] = it.value();
    }
  }
  ctx["messages"] = opts.tool_arguments_as_objects ? with_object_arguments(messages) : messages;
  ctx["tools"] = opts.tools;
  ctx["documents"] = opts.documents;
  ctx["add_generation_prompt"] = opts.add_generation_prompt;
  if (bos_text_ && !ctx.contains("bos_token")) ctx["bos_token"] = *bos_text_;
  if (eos_text_ && !ctx.contains("eos_token")) ctx["eos_token"] = *eos_text_;
  jinja::RenderOptions ro;
  ro.now = opts.now;
  auto out = tmpl_.render(ctx, ro);
  if (!out.ok()) return Error{"the chat template failed: " + out.error()};
  return std::move(out.value());
}

}  // namespace bie::tokenizer
