// The grammar a request's output must follow: its response_format (json_object, json_schema) or,
// when tool_choice forces a call, that call in the model's own tool-call syntax with its
// arguments validating against the tool's parameters schema. A schema the grammar compiler cannot
// enforce is a 400 naming the keyword and where it is; never an unconstrained generation. Pure
// functions; thread-safe.
#pragma once

#include <memory>
#include <string>
#include <variant>

#include "bie/grammar/grammar.h"
#include "server/api_error.h"
#include "server/openai_request.h"
#include "server/tool_calls.h"

namespace bie::server {

struct OutputGrammar {
  std::shared_ptr<const grammar::Grammar> grammar;  // null: unconstrained
  std::string prefix;  // bytes of the grammar the prompt already ends with (EngineRequest)
};

// `forced_prefix`: the text the prompt ends with when a call is forced (server.cpp's
// forced_call_prefix), empty otherwise.
[[nodiscard]] std::variant<OutputGrammar, ApiError> output_grammar(
    const ParsedRequest& p, ToolCallSyntax syntax, const std::string& forced_prefix);

}  // namespace bie::server
