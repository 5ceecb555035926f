// libFuzzer target for the Jinja engine: any bytes as a template, rendered against a small chat
// context with tight limits. `make fuzz-jinja` builds it with clang and runs it. A parse or
// render error is fine; a crash, a sanitizer report or a hang is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "bie/template/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."},
                 {"role": "user", "content": [{"type": "text", "text": "Hi \u00e9"}]},
                 {"role": "assistant", "content": null,
                  "tool_calls": [{"id": "c1", "type": "function",
                                  "function": {"name": "f", "arguments": {"x": 1.5}}}]},
                 {"role": "tool", "tool_call_id": "c1", "content": "42"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})");
  auto t = bie::jinja::Template::parse(std::string_view(reinterpret_cast<const char*>(data), size));
  if (t.ok()) {
    bie::jinja::RenderOptions o;
    o.now = std::tm{};
    o.limits.max_steps = 20000;
    o.limits.max_output_bytes = 1 << 20;
    (void)t->render(ctx, o);
  }
  return 0;
}
