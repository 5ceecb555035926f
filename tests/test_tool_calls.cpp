// Tool-call syntaxes of model output to OpenAI tool_calls (arguments always a JSON string),
// whole and streamed, and broken calls kept as text with a reason.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/tool_calls.h"

namespace bie::server {
namespace {

TEST(ToolCalls, SyntaxFromTemplate) {
  EXPECT_EQ(tool_call_syntax_of("{% for tool in tools %}<tools>...</tools> <tool_call>"),
            ToolCallSyntax::kHermes);
  EXPECT_EQ(tool_call_syntax_of("[AVAILABLE_TOOLS] ... [TOOL_CALLS]"), ToolCallSyntax::kMistral);
  EXPECT_EQ(tool_call_syntax_of("<|start_header_id|>ipython ... {% if tools %}"),
            ToolCallSyntax::kLlama3);
  EXPECT_EQ(tool_call_syntax_of("<|im_start|>{{ message.content }}"), ToolCallSyntax::kNone);
}

TEST(ToolCalls, HermesOneAndTwoCalls) {
  auto r = parse_tool_calls(ToolCallSyntax::kHermes,
                            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                            "{\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>",
                            "7");
  ASSERT_FALSE(r.error) << *r.error;
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].id, "call_7_0");
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"Paris","unit":"c"})");
  EXPECT_EQ(r.content, "");

  r = parse_tool_calls(
      ToolCallSyntax::kHermes,
      "Let me check.\n<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n"
      "<tool_call>{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>",
      "q");
  ASSERT_FALSE(r.error);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.content, "Let me check.");
  EXPECT_EQ(r.calls[1].id, "call_q_1");
  EXPECT_EQ(r.calls[1].arguments, R"({"x":1})");  // a JSON-string argument, normalised
}

// Arguments keep the model's (the schema's) key order, not alphabetical.
TEST(ToolCalls, ArgumentsKeepTheirKeyOrder) {
  auto r = parse_tool_calls(ToolCallSyntax::kHermes,
                            "<tool_call>\n{\"name\": \"book\", \"arguments\": "
                            "{\"restaurant\": \"X\", \"people\": 4}}\n</tool_call>",
                            "1");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"restaurant":"X","people":4})");
}

TEST(ToolCalls, HermesFencedOrBareObject) {
  for (const std::string& text :
       {std::string(
            "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```"),
        std::string(" {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}")}) {
    auto r = parse_tool_calls(ToolCallSyntax::kHermes, text, "1");
    ASSERT_EQ(r.calls.size(), 1u) << text;
    EXPECT_EQ(r.calls[0].arguments, R"({"city":"Paris"})");
    EXPECT_EQ(r.content, "");
  }
  // Code that is not a call stays text.
  for (const std::string& text :
       {std::string("```json\n{\"a\": 1}\n```"), std::string("```python\nprint(1)\n```"),
        std::string("{\"name\": \"x\"}")}) {
    auto r = parse_tool_calls(ToolCallSyntax::kHermes, text, "1");
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_FALSE(r.error) << text;
    EXPECT_EQ(r.content, text.front() == ' ' ? text.substr(1) : text);
  }
  ToolCallStream s(ToolCallSyntax::kHermes, "2");
  EXPECT_EQ(s.feed("`"), "");
  EXPECT_EQ(s.feed("``json\n{\"name\": \"f\", \"arguments\": {}}\n"), "");
  EXPECT_EQ(s.feed("```"), "");
  const ToolCallParse r = s.finish();
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "f");
  ToolCallStream plain(ToolCallSyntax::kHermes, "2");
  EXPECT_EQ(plain.feed("`x` is a variable"), "`x` is a variable");
}

TEST(ToolCalls, BrokenCallsStayTextWithAReason) {
  for (const std::string& bad :
       {std::string("<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": </tool_call>"),
        std::string("<tool_call>{\"arguments\": {}}</tool_call>"),
        std::string("<tool_call>[1, 2]</tool_call>"),
        std::string("<tool_call>{\"name\": \"a\", \"arguments\": 3}</tool_call>")}) {
    auto r = parse_tool_calls(ToolCallSyntax::kHermes, bad, "1");
    EXPECT_TRUE(r.error) << bad;
    EXPECT_TRUE(r.calls.empty()) << bad;
    EXPECT_EQ(r.content, bad);
  }
  // Cut off before the closing tag but complete JSON: still a call.
  auto r = parse_tool_calls(ToolCallSyntax::kHermes,
                            "<tool_call>{\"name\": \"a\", \"arguments\": {\"k\": [1]}}", "1");
  ASSERT_FALSE(r.error);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"k":[1]})");
}

TEST(ToolCalls, Llama3AndMistral) {
  auto r = parse_tool_calls(ToolCallSyntax::kLlama3,
                            " {\"name\": \"calc\", \"parameters\": {\"expr\": \"2+2\"}}", "x");
  ASSERT_FALSE(r.error);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "calc");
  EXPECT_EQ(r.calls[0].arguments, R"({"expr":"2+2"})");
  r = parse_tool_calls(ToolCallSyntax::kLlama3, "The answer is 4.", "x");
  EXPECT_TRUE(r.calls.empty());
  EXPECT_FALSE(r.error);
  EXPECT_EQ(r.content, "The answer is 4.");

  r = parse_tool_calls(ToolCallSyntax::kMistral,
                       "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"p\": 1}}, "
                       "{\"name\": \"b\", \"arguments\": {}}]",
                       "m");
  ASSERT_FALSE(r.error);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].arguments, R"({"p":1})");
  EXPECT_EQ(r.calls[1].name, "b");
  r = parse_tool_calls(ToolCallSyntax::kMistral, "[TOOL_CALLS][{\"name\": ", "m");
  EXPECT_TRUE(r.error);
}

// Pieces as a tokenizer would cut them, markers split across pieces.
std::string stream_all(ToolCallStream& s, const std::vector<std::string>& pieces) {
  std::string sent;
  for (const std::string& p : pieces) sent += s.feed(p);
  return sent;
}

TEST(ToolCalls, StreamHoldsBackOnlyWhatMayBeAMarker) {
  ToolCallStream s(ToolCallSyntax::kHermes, "9");
  EXPECT_EQ(s.feed("Sure, "), "Sure, ");
  EXPECT_EQ(s.feed("checking <to"), "checking ");  // "<to" may start <tool_call>
  EXPECT_FALSE(s.in_call());
  EXPECT_EQ(s.feed("ol_call>{\"name\": \"w\", "), "");
  EXPECT_TRUE(s.in_call());
  EXPECT_EQ(s.feed("\"arguments\": {\"c\": 1}}</tool_call>"), "");
  const ToolCallParse r = s.finish();
  ASSERT_FALSE(r.error);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].id, "call_9_0");
  EXPECT_EQ(r.calls[0].arguments, R"({"c":1})");

  ToolCallStream plain(ToolCallSyntax::kHermes, "9");
  EXPECT_EQ(stream_all(plain, {"a <b", "> c <", "tool"}), "a <b> c ");
  EXPECT_EQ(plain.finish().content, "<tool");  // never became a marker: sent at the end
}

TEST(ToolCalls, StreamLlama3BareJson) {
  ToolCallStream s(ToolCallSyntax::kLlama3, "1");
  EXPECT_EQ(stream_all(s, {" ", "{\"name\"", ": \"f\", \"parameters\": {}}"}), "");
  const ToolCallParse r = s.finish();
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "f");
  ToolCallStream t(ToolCallSyntax::kLlama3, "1");
  EXPECT_EQ(stream_all(t, {"Hello", " {x}"}), "Hello {x}");
  EXPECT_TRUE(t.finish().calls.empty());
}

}  // namespace
}  // namespace bie::server
