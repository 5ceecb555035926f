// Request-shape limits and response keys of bie-serve, on tiny inputs with exact expectations.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/server_metrics.h"

namespace bie::server {
namespace {

std::string nested(int depth) {
  return std::string(static_cast<size_t>(depth), '[') + "1" +
         std::string(static_cast<size_t>(depth), ']');
}

TEST(JsonShape, DepthIsCappedBeforeAnythingIsBuilt) {
  ParseLimits l;
  l.max_json_depth = 4;
  EXPECT_FALSE(check_json_shape(nested(4), l));
  auto e = check_json_shape(nested(5), l);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 400);
  EXPECT_EQ(e->code, "json_too_deep");
  // The default cap holds a 100k-deep body off in linear time.
  e = check_json_shape("{\"prompt\": " + nested(100000) + "}", ParseLimits{});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, "json_too_deep");
}

TEST(JsonShape, ValueCountIsCapped) {
  ParseLimits l;
  l.max_json_values = 4;                         // the array itself counts as one
  EXPECT_FALSE(check_json_shape("[1,2,3]", l));  // 4 values
  auto e = check_json_shape("[1,2,3,4]", l);     // 5
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, "json_too_large");
}

TEST(JsonShape, OverflowNulAndGarbageAre400) {
  for (const std::string& body :
       {std::string("{\"temperature\": 1e400}"), std::string("{\"a\": 1}\0junk", 13),
        std::string("{\"a\": 1} x"), std::string("{\"a\": ")}) {
    auto e = check_json_shape(body, ParseLimits{});
    ASSERT_TRUE(e) << body;
    EXPECT_EQ(e->status, 400);
    EXPECT_EQ(e->code, "invalid_json");
  }
  auto parsed = parse_request("{\"prompt\": \"x\", \"temperature\": 1e400}", Endpoint::kCompletions,
                              ParseLimits{});
  ASSERT_TRUE(std::holds_alternative<ApiError>(parsed));
  EXPECT_EQ(std::get<ApiError>(parsed).status, 400);
}

TEST(PromptShapes, OnlyOpenAiShapesAreRead) {
  const auto tokens = [](const std::string& p) {
    auto r = parse_request("{\"prompt\": " + p + "}", Endpoint::kCompletions, ParseLimits{});
    if (auto* e = std::get_if<ApiError>(&r)) return std::string("error:") + e->message;
    const ParsedRequest& q = std::get<ParsedRequest>(r);
    if (!q.prompt_is_tokens) return "text:" + q.prompt_text;
    std::string s = "ids:";
    for (int32_t t : q.prompt_tokens) s += std::to_string(t) + ",";
    return s;
  };
  EXPECT_EQ(tokens("\"hi\""), "text:hi");
  EXPECT_EQ(tokens("[\"hi\"]"), "text:hi");
  EXPECT_EQ(tokens("[1,2]"), "ids:1,2,");
  EXPECT_EQ(tokens("[[1,2]]"), "ids:1,2,");
  for (const char* bad :
       {"[[[1]]]", "[[1],[2]]", "[\"a\",\"b\"]", "[1,\"a\"]", "{}", "[[1,[2]]]"}) {
    EXPECT_EQ(tokens(bad).rfind("error:", 0), 0u) << bad;
  }
}

TEST(LogprobKeys, PartialCharactersAndEmptyPiecesNeverCollide) {
  nlohmann::json top = nlohmann::json::object();
  EXPECT_EQ(logprob_key("Paris", 7, top), "Paris");
  top["Paris"] = -0.1;
  EXPECT_EQ(logprob_key("\xe3\x81", 11, top), "bytes:\\xe3\\x81");
  top["bytes:\\xe3\\x81"] = -1.0;
  EXPECT_EQ(logprob_key("\xe3\x82", 12, top), "bytes:\\xe3\\x82");
  EXPECT_EQ(logprob_key("", 3, top), "token_id:3");
  EXPECT_EQ(logprob_key("Paris", 9, top), "token_id:9");
}

TEST(MetricLabels, RoutesFromAFixedSetAndValuesEscaped) {
  EXPECT_EQ(route_label("/v1/completions"), "/v1/completions");
  EXPECT_EQ(route_label("/health"), "/health");
  EXPECT_EQ(route_label("/x\"} 1\nbie_model_loaded{model=\"evil\"} 0\n#"), "other");
  EXPECT_EQ(route_label("/v1/completions/"), "other");
  EXPECT_EQ(escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

}  // namespace
}  // namespace bie::server

namespace bie::server {
namespace {

std::variant<ParsedRequest, ApiError> chat(const std::string& extra) {
  return parse_request(R"({"messages": [{"role": "user", "content": "hi"}])" + extra + "}",
                       Endpoint::kChat, ParseLimits{});
}

std::string param_of(const std::variant<ParsedRequest, ApiError>& r) {
  if (const auto* e = std::get_if<ApiError>(&r)) return e->param.empty() ? "?" : e->param;
  return "";
}

TEST(ToolsRequest, ValidToolsAndChoices) {
  const std::string tools =
      R"(, "tools": [{"type": "function", "function": {"name": "get_weather",
          "description": "d", "parameters": {"type": "object", "properties": {}}}}])";
  auto r =
      chat(tools + R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                "parallel_tool_calls": false)");
  ASSERT_TRUE(std::holds_alternative<ParsedRequest>(r)) << param_of(r);
  const ParsedRequest& p = std::get<ParsedRequest>(r);
  EXPECT_EQ(p.tools.size(), 1u);
  EXPECT_EQ(p.tool_choice, ParsedRequest::ToolChoice::kFunction);
  EXPECT_EQ(p.tool_choice_name, "get_weather");
  EXPECT_FALSE(p.parallel_tool_calls);
  EXPECT_EQ(param_of(chat(tools + R"(, "tool_choice": "required")")), "");
  EXPECT_EQ(param_of(chat(tools + R"(, "tool_choice": "none")")), "");
}

TEST(ToolsRequest, BadToolsNameTheField) {
  EXPECT_EQ(param_of(chat(R"(, "tools": {})")), "tools");
  EXPECT_EQ(param_of(chat(R"(, "tools": [{"type": "retrieval"}])")), "tools[0].type");
  EXPECT_EQ(param_of(chat(R"(, "tools": [{"type": "function", "function": {"name": "a b"}}])")),
            "tools[0].function.name");
  EXPECT_EQ(
      param_of(chat(
          R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters": []}}])")),
      "tools[0].function.parameters");
  EXPECT_EQ(param_of(chat(R"(, "tools": [{"type": "function", "function": {"name": "f",
                "parameters": {"type": "string"}}}])")),
            "tools[0].function.parameters");
  EXPECT_EQ(param_of(chat(R"(, "tool_choice": "required")")), "tool_choice");
  EXPECT_EQ(param_of(chat(R"(, "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"type": "function", "function": {"name": "g"}})")),
            "tool_choice");
  EXPECT_EQ(param_of(chat(R"(, "tool_choice": "sometimes")")), "tool_choice");
  EXPECT_EQ(param_of(chat(R"(, "parallel_tool_calls": 1)")), "parallel_tool_calls");
}

TEST(ResponseFormat, Shapes) {
  auto r = chat(R"(, "response_format": {"type": "json_schema", "json_schema": {"name": "x",
                "schema": {"type": "object"}, "strict": true}})");
  ASSERT_TRUE(std::holds_alternative<ParsedRequest>(r));
  EXPECT_EQ(std::get<ParsedRequest>(r).response_format, "json_schema");
  EXPECT_EQ(std::get<ParsedRequest>(r).response_schema,
            nlohmann::ordered_json({{"type", "object"}}));
  EXPECT_EQ(param_of(chat(R"(, "response_format": {"type": "json_object"})")), "");
  EXPECT_EQ(param_of(chat(R"(, "response_format": {"type": "yaml"})")), "response_format.type");
  EXPECT_EQ(param_of(chat(R"(, "response_format": {"type": "json_schema"})")),
            "response_format.json_schema");
  EXPECT_EQ(param_of(chat(R"(, "response_format": "json")")), "response_format");
}

TEST(LogitBias, ParsedAndValidated) {
  auto r = chat(R"(, "logit_bias": {"50256": -100, "7": 2.5})");
  ASSERT_TRUE(std::holds_alternative<ParsedRequest>(r)) << param_of(r);
  const auto& lb = std::get<ParsedRequest>(r).engine.sampling.logit_bias;
  ASSERT_EQ(lb.size(), 2u);
  EXPECT_EQ(lb[0], (std::pair<int32_t, float>{50256, -100.0f}));
  EXPECT_EQ(lb[1], (std::pair<int32_t, float>{7, 2.5f}));
  EXPECT_EQ(param_of(chat(R"(, "logit_bias": {})")), "");
  EXPECT_EQ(param_of(chat(R"(, "logit_bias": {"5": 101})")), "logit_bias");
  EXPECT_EQ(param_of(chat(R"(, "logit_bias": {"5": -100.5})")), "logit_bias");
  EXPECT_EQ(param_of(chat(R"(, "logit_bias": {"-1": 1})")), "logit_bias");
  EXPECT_EQ(param_of(chat(R"(, "logit_bias": {"abc": 1})")), "logit_bias");
  EXPECT_EQ(param_of(chat(R"(, "logit_bias": {"99999999999": 1})")), "logit_bias");
  EXPECT_EQ(param_of(chat(R"(, "logit_bias": {"5": "1"})")), "logit_bias.5");
  EXPECT_EQ(param_of(chat(R"(, "logit_bias": [1])")), "logit_bias");
}

// The client's key order survives parsing: properties are generated (and tools rendered) in
// the order the schema's author wrote them, not alphabetically.
TEST(ResponseFormat, KeepsTheClientsKeyOrder) {
  auto r = chat(R"(, "response_format": {"type": "json_schema", "json_schema": {"schema":
                {"type": "object", "properties": {"zeta": {}, "alpha": {}, "mid": {}}}}},
                "tools": [{"type": "function", "function": {"name": "f", "parameters":
                {"type": "object", "properties": {"b": {}, "a": {}}}}}])");
  ASSERT_TRUE(std::holds_alternative<ParsedRequest>(r)) << param_of(r);
  const ParsedRequest& p = std::get<ParsedRequest>(r);
  EXPECT_EQ(p.response_schema["properties"].dump(), R"({"zeta":{},"alpha":{},"mid":{}})");
  EXPECT_EQ(p.tools[0]["function"]["parameters"]["properties"].dump(), R"({"b":{},"a":{}})");
}

}  // namespace
}  // namespace bie::server
