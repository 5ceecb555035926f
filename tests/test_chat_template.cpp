// ChatTemplate: the model's Jinja template rendered through bie::jinja with transformers'
// context. tests/golden/chat/templates.json (scripts/make_chat_goldens.py, jinja2) holds
// ChatML/Gemma/Llama 3 renderings; the wide corpus is test_template_parity.cpp's.
#include <gtest/gtest.h>

#include <initializer_list>
#include <nlohmann/json.hpp>

#include "bie/gguf/gguf_file.h"
#include "bie/tokenizer/chat_template.h"
#include "bie/tokenizer/tokenizer.h"
#include "support/paths.h"

namespace bie::tokenizer {
namespace {

using ojson = nlohmann::ordered_json;

// A vocabulary with the given special tokens; `bos`/`eos` pick those tokens by text.
Tokenizer vocab_of(std::initializer_list<const char*> specials, const std::string& bos,
                   const std::string& eos = "") {
  VocabData d;
  d.kind = VocabKind::kBpe;
  d.pre_name = "gpt-2";
  d.pre = PreType::kGpt2;
  d.tokens = {"a", "b"};
  for (const char* t : specials) d.tokens.emplace_back(t);
  d.types.assign(d.tokens.size(), TokenType::kControl);
  d.types[0] = d.types[1] = TokenType::kNormal;
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    if (d.tokens[i] == bos) d.ids.bos = static_cast<TokenId>(i);
    if (d.tokens[i] == eos) d.ids.eos = static_cast<TokenId>(i);
  }
  auto v = Vocab::from_data(std::move(d));
  EXPECT_TRUE(v.ok());
  auto t = Tokenizer::from_vocab(std::move(v.value()));
  EXPECT_TRUE(t.ok());
  return std::move(t.value());
}

// Every family's special tokens.
Tokenizer all_tokens(const std::string& bos, const std::string& eos = "") {
  return vocab_of({"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<bos>", "<eos>",
                   "<start_of_turn>", "<end_of_turn>", "<|begin_of_text|>", "<|end_of_text|>",
                   "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"},
                  bos, eos);
}

TEST(ChatTemplate, MatchesReferenceRendering) {
  const std::string text =
      test::read_file(test::source_dir() + "/tests/golden/chat/templates.json");
  ASSERT_FALSE(text.empty());
  const auto golden = nlohmann::json::parse(text);
  int checked = 0;
  for (const auto& c : golden["cases"]) {
    const Tokenizer tok = all_tokens(c["bos"].get<std::string>(), c["eos"].get<std::string>());
    auto tmpl = ChatTemplate::detect(c["template"].get<std::string>(), tok);
    ASSERT_TRUE(tmpl.ok()) << tmpl.error();
    EXPECT_EQ(tmpl->name(), c["family"].get<std::string>());
    EXPECT_EQ(tmpl->origin(), "gguf");
    std::vector<ChatMessage> msgs;
    for (const auto& m : c["messages"]) {
      msgs.emplace_back(m["role"].get<std::string>(), m["content"].get<std::string>());
    }
    auto out = tmpl->render(msgs, c["add_generation_prompt"].get<bool>());
    ASSERT_TRUE(out.ok()) << out.error();
    EXPECT_EQ(*out, c["text"].get<std::string>()) << c["family"] << " " << c["messages"].dump();
    ++checked;
  }
  EXPECT_EQ(checked, 30);
}

TEST(ChatTemplate, EndOfTurnComesFromTheTemplateAndVocabulary) {
  const Tokenizer tok = all_tokens("<bos>", "<eos>");
  EXPECT_EQ(ChatTemplate::detect("{{'<|im_start|>'}}{{'<|im_end|>'}}", tok)->end_of_turn(),
            "<|im_end|>");
  EXPECT_EQ(ChatTemplate::detect("{{'<start_of_turn>'}}<end_of_turn>", tok)->end_of_turn(),
            "<end_of_turn>");
  EXPECT_EQ(ChatTemplate::detect("<|start_header_id|>x<|eot_id|>", tok)->end_of_turn(),
            "<|eot_id|>");
  // A marker the vocabulary lacks is not a stop string; EOS is the fallback.
  EXPECT_EQ(ChatTemplate::detect("[INST]{{ m }}[/INST]<|end|>", tok)->end_of_turn(), "<eos>");
}

TEST(ChatTemplate, MissingTemplateFallsBackOnVocabulary) {
  // ChatML wins when the vocabulary has both families' tokens.
  const Tokenizer tok = all_tokens("<bos>");
  auto t = ChatTemplate::detect("", tok);
  ASSERT_TRUE(t.ok()) << t.error();
  EXPECT_EQ(t->origin(), "builtin:chatml");
  EXPECT_EQ(t->name(), "chatml");
  auto out = t->render(std::vector<ChatMessage>{{"user", "hi"}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");

  // Gemma 3 270M's case: Gemma turn tokens and no template -> Gemma 3's template, with BOS.
  const Tokenizer gemma =
      vocab_of({"<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"}, "<bos>", "<eos>");
  auto g = ChatTemplate::detect("", gemma);
  ASSERT_TRUE(g.ok()) << g.error();
  EXPECT_EQ(g->origin(), "builtin:gemma");
  // The built-in is the corpus's Gemma 3 template, so the parity test covers it.
  EXPECT_EQ(g->source(),
            test::read_file(test::source_dir() + "/tests/golden/templates/gemma-3-it.jinja"));
  EXPECT_EQ(g->end_of_turn(), "<end_of_turn>");
  auto gout = g->render(std::vector<ChatMessage>{{"system", "Be brief."}, {"user", " Hi "}});
  ASSERT_TRUE(gout.ok()) << gout.error();
  EXPECT_EQ(*gout,
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n");

  const Tokenizer plain = vocab_of({"<s>"}, "<s>");
  auto none = ChatTemplate::detect("", plain);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().find("--chat-template"), std::string::npos);
}

TEST(ChatTemplate, ATemplateThatDoesNotParseIsAClearError) {
  const Tokenizer tok = all_tokens("<bos>");
  auto t =
      ChatTemplate::detect("{% for m in messages %}\n{{ m.content | nosuch }}{% endfor %}", tok);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.error().find("line 2, column 16: no filter named 'nosuch'"), std::string::npos)
      << t.error();
  EXPECT_NE(t.error().find("--chat-template"), std::string::npos);
  EXPECT_FALSE(ChatTemplate::from_source("{% extends 'x' %}", tok).ok());
}

TEST(ChatTemplate, RejectsWhatTheTemplateRejects) {
  const Tokenizer tok = all_tokens("<bos>");
  auto chatml = ChatTemplate::detect("", tok);
  ASSERT_TRUE(chatml.ok());
  EXPECT_FALSE(chatml->render(std::vector<ChatMessage>{}).ok());
  auto gemma = ChatTemplate::detect(
      "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
      "{{ raise_exception('Conversation roles must alternate') }}{% endif %}{% endfor %}",
      tok);
  ASSERT_TRUE(gemma.ok());
  auto r = gemma->render(std::vector<ChatMessage>{{"user", "x"}, {"user", "y"}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("Conversation roles must alternate"), std::string::npos) << r.error();
  EXPECT_TRUE(gemma->render(std::vector<ChatMessage>{{"user", "x"}}).ok());
}

TEST(ChatTemplate, PassesToolsToolCallsAndTokensToTheTemplate) {
  const Tokenizer tok = all_tokens("<|begin_of_text|>", "<|eot_id|>");
  auto t = ChatTemplate::from_source(
      "{{ bos_token }}{% if tools %}T={{ tools|tojson }};{% endif %}"
      "{% for m in messages %}{{ m.role }}:"
      "{% if m.tool_calls %}{{ m.tool_calls[0].function.name }}"
      "({{ m.tool_calls[0].function.arguments|tojson }}){% endif %}"
      "{% if m.tool_call_id is defined %}[{{ m.tool_call_id }}]{% endif %}"
      "{% if m.content is string %}{{ m.content }}{% else %}"
      "{{ m.content|map(attribute='text')|join('+') }}{% endif %}{{ eos_token }}{% endfor %}"
      "{% if add_generation_prompt %}>{% endif %}{{ documents is none }}{{ enable_thinking }}",
      tok);
  ASSERT_TRUE(t.ok()) << t.error();
  EXPECT_EQ(t->origin(), "file");
  std::vector<ChatMessage> msgs(3);
  msgs[0] = ChatMessage("user", "weather?");
  msgs[1].role = "assistant";
  msgs[1].extra = ojson::parse(
      R"({"tool_calls": [{"id": "c1", "type": "function",
          "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]})");
  msgs[2].role = "tool";
  msgs[2].extra = ojson::parse(R"({"tool_call_id": "c1",
      "content": [{"type": "text", "text": "21"}, {"type": "text", "text": "C"}]})");
  ChatRenderOptions o;
  o.tools = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather"}}])");
  o.variables = ojson::parse(R"({"enable_thinking": false, "messages": "cannot replace"})");
  auto out = t->render(msgs, o);
  ASSERT_TRUE(out.ok()) << out.error();
  EXPECT_EQ(*out,
            "<|begin_of_text|>T=[{\"type\": \"function\", \"function\": {\"name\": "
            "\"get_weather\"}}];user:weather?<|eot_id|>assistant:get_weather({\"city\": "
            "\"Paris\"})<|eot_id|>tool:[c1]21+C<|eot_id|>>TrueFalse");
  o.add_generation_prompt = false;
  o.tools = nullptr;
  auto plain = t->render(std::span<const ChatMessage>(msgs.data(), 1), o);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(*plain, "<|begin_of_text|>user:weather?<|eot_id|>TrueFalse");
}

TEST(ChatTemplate, ToolCallArgumentsStringsBecomeObjects) {
  // Qwen2.5's way of writing a past call: `tool_call.arguments | tojson`.
  const Tokenizer tok = all_tokens("<bos>");
  auto t = ChatTemplate::from_source(
      "{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.arguments|tojson }};"
      "{% endfor %}{% endfor %}",
      tok);
  ASSERT_TRUE(t.ok()) << t.error();
  const ojson msgs = ojson::parse(R"([{"role": "assistant", "content": null, "tool_calls": [
      {"type": "function", "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": [2]}"}},
      {"type": "function", "function": {"name": "g", "arguments": "not json"}},
      {"type": "function", "function": {"name": "h", "arguments": {"already": true}}}]}])");
  ChatRenderOptions o;
  auto out = t->render_json(msgs, o);
  ASSERT_TRUE(out.ok()) << out.error();
  EXPECT_EQ(*out, "{\"b\": 1, \"a\": [2]};\"not json\";{\"already\": true};");
  o.tool_arguments_as_objects = false;
  out = t->render_json(msgs, o);
  ASSERT_TRUE(out.ok()) << out.error();
  EXPECT_EQ(*out, "\"{\\\"b\\\": 1, \\\"a\\\": [2]}\";\"not json\";{\"already\": true};");
}

TEST(ChatTemplate, SmolLM2ModelTemplate) {
  // The real GGUF's template and vocabulary (fetched by `make models`; a missing model fails).
  auto file = gguf::GgufFile::open(test::smollm2_path());
  ASSERT_TRUE(file.ok()) << file.error();
  auto tok = Tokenizer::from_gguf(**file);
  ASSERT_TRUE(tok.ok()) << tok.error();
  const auto src = (*file)->get_string("tokenizer.chat_template");
  ASSERT_TRUE(src.has_value());
  auto t = ChatTemplate::detect(*src, *tok);
  ASSERT_TRUE(t.ok()) << t.error();
  EXPECT_EQ(t->name(), "chatml");
  EXPECT_EQ(t->end_of_turn(), "<|im_end|>");
  auto out = t->render(std::vector<ChatMessage>{{"user", "Hi"}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

}  // namespace
}  // namespace bie::tokenizer
