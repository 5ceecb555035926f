// bie::jinja::Template: a Jinja template engine for chat templates, whose reference is Python's
// jinja2 as Hugging Face transformers configures it (ImmutableSandboxedEnvironment,
// trim_blocks, lstrip_blocks, loopcontrols, its own tojson, raise_exception, strftime_now).
// It implements the subset real chat templates use (see docs/chat-templates.md): statements,
// expressions, filters, tests, macros and str/dict methods, with jinja2's whitespace rules and
// Python's printing of values. Errors (parse or render) are messages with a line and column;
// a hostile template meets depth, step and size limits instead of crashing the process.
// A parsed Template is immutable and may be rendered from many threads at once.
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bie/common/result.h"

namespace bie::jinja {

struct Stmt;

struct TemplateOptions {
  bool trim_blocks = true;             // transformers' setting: the newline after a block tag goes
  bool lstrip_blocks = true;           // transformers' setting: indentation before a block tag goes
  bool keep_trailing_newline = false;  // jinja2's default: one trailing newline is dropped
};

struct RenderLimits {
  int32_t max_call_depth = 100;         // nested macro calls (recursive macros over JSON schemas)
  int64_t max_steps = 20'000'000;       // statements + loop iterations + calls
  size_t max_output_bytes = 64u << 20;  // the rendered text, and any one string built on the way
};

struct RenderOptions {
  std::optional<std::tm> now;  // what strftime_now() formats (unset: the local time now)
  RenderLimits limits;
};

class Template {
 public:
  // Errors: "line L, column C: ..." for syntax errors, unknown filters or tests, and
  // statements outside the supported subset (extends, include, import, ...).
  [[nodiscard]] static Result<Template> parse(std::string_view source,
                                              const TemplateOptions& opts = {});
  // `context` must be an object; its members are the template's variables (JSON values; key
  // order is kept, as Python dicts keep it). The globals range, namespace, dict,
  // raise_exception and strftime_now are always defined.
  [[nodiscard]] Result<std::string> render(const nlohmann::ordered_json& context,
                                           const RenderOptions& opts = {}) const;

 private:
  std::shared_ptr<const std::vector<std::unique_ptr<Stmt>>> body_;
};

}  // namespace bie::jinja
