// JSON Schema -> Grammar: the subset documented in docs/structured-output.md, compiled into a
// byte-level grammar whose every complete match is compact-ish JSON that validates against the
// schema. A keyword it cannot enforce is an error naming it (the server answers 400), never a
// silently looser grammar. Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

#include "bie/common/result.h"
#include "bie/grammar/grammar.h"

namespace bie::grammar {

struct JsonSchemaOptions {
  // Whitespace bytes (space or newline) allowed between two JSON tokens: bounded, so a model
  // cannot spend its whole budget on whitespace.
  int max_whitespace = 2;
  int max_depth = 32;            // nesting of schemas ($ref expansion included)
  int64_t max_repeat = 10'000;   // largest finite maxLength / maxItems / minLength / minItems
  int max_fraction_digits = 15;  // digits after '.' in a number
  // Literal bytes around the JSON value (e.g. a tool call's "<tool_call>\n" ... "\n</tool_call>").
  std::string prefix, suffix;
};

// The grammar for `schema` (response_format json_schema). Errors name the keyword and where it
// is, e.g. "unsupported JSON Schema keyword 'patternProperties' at #/properties/a".
// Object properties are generated in the order they appear in `schema`: parse the request
// with nlohmann::ordered_json to keep the declared order (a model writes better JSON in the
// order the schema author chose); nlohmann::json has sorted them alphabetically already.
[[nodiscard]] Result<Grammar> compile_json_schema(const nlohmann::ordered_json& schema,
                                                  const JsonSchemaOptions& options = {});
[[nodiscard]] Result<Grammar> compile_json_schema(const nlohmann::json& schema,
                                                  const JsonSchemaOptions& options = {});

// Any JSON object (response_format json_object).
[[nodiscard]] Grammar json_object_grammar(const JsonSchemaOptions& options = {});

}  // namespace bie::grammar
