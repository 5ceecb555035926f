#include "server/structured_output.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "bie/grammar/json_schema.h"

namespace bie::server {

namespace {

using ojson = nlohmann::ordered_json;

// A schema's compile error as a 400 on `param`.
ApiError schema_error(const std::string& what, const std::string& param, const std::string& error) {
  return bad_request(
      fmt::format("{} is not a JSON schema this server can enforce: {}", what, error), param,
      "invalid_schema");
}

// The JSON object of one call in the model's syntax: {"name": <const>, "arguments": <schema>}
// (Llama 3 names the arguments "parameters").
ojson call_schema(const ojson& tool, ToolCallSyntax syntax) {
  const ojson& fn = tool["function"];
  ojson params = fn.contains("parameters") && fn["parameters"].is_object()
                     ? fn["parameters"]
                     : ojson{{"type", "object"}};
  if (!params.contains("type")) params["type"] = "object";
  const char* key = syntax == ToolCallSyntax::kLlama3 ? "parameters" : "arguments";
  ojson props = ojson::object();
  props["name"] = ojson{{"const", fn["name"]}};
  props[key] = std::move(params);
  return ojson{{"type", "object"},
               {"properties", std::move(props)},
               {"required", ojson::array({"name", key})},
               {"additionalProperties", false}};
}

std::variant<OutputGrammar, ApiError> tool_grammar(const ParsedRequest& p, ToolCallSyntax syntax,
                                                   const std::string& forced_prefix) {
  // Each tool's own parameters first, so an error names the tool and the keyword's place in it.
  ojson calls = ojson::array();
  for (size_t i = 0; i < p.tools.size(); ++i) {
    const ojson& tool = p.tools[i];
    const std::string name = tool["function"]["name"].get<std::string>();
    if (p.tool_choice == ParsedRequest::ToolChoice::kFunction && name != p.tool_choice_name) {
      continue;
    }
    const ojson schema = call_schema(tool, syntax);
    const std::string at = fmt::format("tools[{}].function.parameters", i);
    auto params = grammar::compile_json_schema(schema["properties"].back());
    if (!params) return schema_error(at + " (function '" + name + "')", at, params.error());
    calls.push_back(schema);
  }
  ojson call = calls.size() == 1 ? calls[0] : ojson{{"anyOf", calls}};
  grammar::JsonSchemaOptions o;
  std::string marker;  // a control token of the prefix: in the prompt, never generated
  switch (syntax) {
    case ToolCallSyntax::kHermes:
      o.prefix = "<tool_call>\n";
      o.suffix = "\n</tool_call>";
      break;
    case ToolCallSyntax::kMistral:
      marker = "[TOOL_CALLS]";
      call = ojson{{"type", "array"}, {"items", call}, {"minItems", 1}};
      if (!p.parallel_tool_calls) call["maxItems"] = 1;
      break;
    case ToolCallSyntax::kLlama3:
    case ToolCallSyntax::kNone:
      break;
  }
  auto g = grammar::compile_json_schema(call, o);
  if (!g) return schema_error("the forced tool call", "tools", g.error());
  OutputGrammar out;
  out.grammar = std::make_shared<const grammar::Grammar>(std::move(g).value());
  out.prefix = forced_prefix;
  if (!marker.empty() && out.prefix.rfind(marker, 0) == 0) out.prefix.erase(0, marker.size());
  return out;
}

}  // namespace

std::variant<OutputGrammar, ApiError> output_grammar(const ParsedRequest& p, ToolCallSyntax syntax,
                                                     const std::string& forced_prefix) {
  const bool forced = syntax != ToolCallSyntax::kNone && !p.tools.is_null() &&
                      (p.tool_choice == ParsedRequest::ToolChoice::kRequired ||
                       p.tool_choice == ParsedRequest::ToolChoice::kFunction);
  if (forced) return tool_grammar(p, syntax, forced_prefix);
  OutputGrammar out;
  if (p.response_format == "json_object") {
    out.grammar = std::make_shared<const grammar::Grammar>(grammar::json_object_grammar());
  } else if (p.response_format == "json_schema") {
    auto g = grammar::compile_json_schema(p.response_schema);
    if (!g) {
      return schema_error("response_format.json_schema.schema",
                          "response_format.json_schema.schema", g.error());
    }
    out.grammar = std::make_shared<const grammar::Grammar>(std::move(g).value());
  }
  return out;
}

}  // namespace bie::server
