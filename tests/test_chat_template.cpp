// ChatTemplate against templates rendered by the reference (Jinja, through llama-cpp-python):
// tests/golden/chat/templates.json, made by scripts/make_chat_goldens.py.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "bie/tokenizer/chat_template.h"
#include "bie/tokenizer/tokenizer.h"
#include "support/paths.h"

namespace bie::tokenizer {
namespace {

// A vocabulary with every family's special tokens; `bos` picks the BOS token by text.
Tokenizer vocab_with(const std::string& bos, bool with_chat_tokens = true) {
  VocabData d;
  d.kind = VocabKind::kBpe;
  d.pre_name = "gpt-2";
  d.pre = PreType::kGpt2;
  d.tokens = {"a", "b"};
  if (with_chat_tokens) {
    for (const char* t :
         {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<bos>", "<eos>", "<start_of_turn>",
          "<end_of_turn>", "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
          "<|end_header_id|>", "<|eot_id|>"}) {
      d.tokens.emplace_back(t);
    }
  } else {
    d.tokens.emplace_back("<s>");
  }
  d.types.assign(d.tokens.size(), TokenType::kControl);
  d.types[0] = d.types[1] = TokenType::kNormal;
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    if (d.tokens[i] == bos) d.ids.bos = static_cast<TokenId>(i);
  }
  auto v = Vocab::from_data(std::move(d));
  EXPECT_TRUE(v.ok());
  auto t = Tokenizer::from_vocab(std::move(v.value()));
  EXPECT_TRUE(t.ok());
  return std::move(t.value());
}

TEST(ChatTemplate, MatchesReferenceRendering) {
  const std::string text =
      test::read_file(test::source_dir() + "/tests/golden/chat/templates.json");
  ASSERT_FALSE(text.empty());
  const auto golden = nlohmann::json::parse(text);
  int checked = 0;
  for (const auto& c : golden["cases"]) {
    const Tokenizer tok = vocab_with(c["bos"].get<std::string>());
    auto tmpl = ChatTemplate::detect(c["template"].get<std::string>(), tok);
    ASSERT_TRUE(tmpl.ok()) << tmpl.error();
    EXPECT_EQ(tmpl->name(), c["family"].get<std::string>());
    std::vector<ChatMessage> msgs;
    for (const auto& m : c["messages"]) {
      msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    auto out = tmpl->render(msgs, c["add_generation_prompt"].get<bool>());
    ASSERT_TRUE(out.ok()) << out.error();
    EXPECT_EQ(*out, c["text"].get<std::string>()) << c["family"] << " " << c["messages"].dump();
    ++checked;
  }
  EXPECT_EQ(checked, 30);
}

TEST(ChatTemplate, EndOfTurnPerFamily) {
  const Tokenizer tok = vocab_with("<bos>");
  EXPECT_EQ(ChatTemplate::detect("{{'<|im_start|>'}}", tok)->end_of_turn(), "<|im_end|>");
  EXPECT_EQ(ChatTemplate::detect("{{'<start_of_turn>'}}", tok)->end_of_turn(), "<end_of_turn>");
  EXPECT_EQ(ChatTemplate::detect("<|start_header_id|>", tok)->end_of_turn(), "<|eot_id|>");
}

TEST(ChatTemplate, MissingTemplateFallsBackOnVocabulary) {
  // Gemma 3 270m's GGUF has no template; its vocabulary has <start_of_turn> (and <|im_start|>
  // is absent there). Here both exist and ChatML wins, as the header says.
  const Tokenizer tok = vocab_with("<bos>");
  auto t = ChatTemplate::detect("", tok);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->name(), "chatml");
  // ChatML without a literal default system turn inserts none.
  auto out = t->render(std::vector<ChatMessage>{{"user", "hi"}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");

  const Tokenizer plain = vocab_with("<s>", /*with_chat_tokens=*/false);
  EXPECT_FALSE(ChatTemplate::detect("", plain).ok());
  EXPECT_FALSE(ChatTemplate::detect("{{ messages }}", plain).ok());
}

TEST(ChatTemplate, RejectsBadConversations) {
  const Tokenizer tok = vocab_with("<bos>");
  auto chatml = ChatTemplate::detect("<|im_start|>", tok);
  ASSERT_TRUE(chatml.ok());
  EXPECT_FALSE(chatml->render(std::vector<ChatMessage>{}).ok());
  auto bad_role = chatml->render(std::vector<ChatMessage>{{"tool", "x"}});
  ASSERT_FALSE(bad_role.ok());
  EXPECT_NE(bad_role.error().find("tool"), std::string::npos);
  auto gemma = ChatTemplate::detect("<start_of_turn>", tok);
  ASSERT_TRUE(gemma.ok());
  EXPECT_FALSE(gemma->render(std::vector<ChatMessage>{{"assistant", "x"}}).ok());
  EXPECT_FALSE(gemma->render(std::vector<ChatMessage>{{"user", "x"}, {"user", "y"}}).ok());
}

TEST(ChatTemplate, SmolLM2ModelTemplate) {
  // The real GGUF's template, when the model is present (fetched by `make models`).
  const std::string tmpl_src =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
      "'<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
      "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
      "'<|im_start|>assistant\\n' }}{% endif %}";
  const Tokenizer tok = vocab_with("<|endoftext|>");
  auto t = ChatTemplate::detect(tmpl_src, tok);
  ASSERT_TRUE(t.ok());
  auto out = t->render(std::vector<ChatMessage>{{"user", "Hi"}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

}  // namespace
}  // namespace bie::tokenizer
