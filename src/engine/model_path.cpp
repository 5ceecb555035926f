#include "bie/engine/model_path.h"

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>

namespace bie {

std::string bie_home() {
  if (const char* h = std::getenv("BIE_HOME"); h != nullptr && *h != '\0') return h;
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr ? home : ".") + "/.cache/bie";
}

Result<std::string> resolve_model_path(const std::string& arg) {
  struct Named {
    const char* name;
    const char* file;
    const char* fetch;
  };
  static constexpr Named kNamed[] = {
      {"default", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2"},
      {"smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2"},
      {"gemma3", "gemma-3-270m-q4_k_m.gguf", "gemma3"},
      {"qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-1.5b"},
      {"qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b"},
  };
  for (const auto& n : kNamed) {
    if (arg != n.name) continue;
    const std::string path = bie_home() + "/models/" + n.file;
    if (!std::filesystem::exists(path)) {
      return Error{
          fmt::format("model '{}' is not fetched yet (expected {}); run "
                      "`make models` in a checkout, or scripts/fetch_models.sh {}",
                      arg, path, n.fetch)};
    }
    return path;
  }
  std::error_code ec;
  if (!std::filesystem::exists(arg, ec))
    return Error{fmt::format("model file '{}' does not exist", arg)};
  if (std::filesystem::is_directory(arg, ec)) {
    return Error{fmt::format("'{}' is a directory; pass a .gguf file", arg)};
  }
  return arg;
}

Result<std::unique_ptr<Model>> load_named_model(const std::string& arg, LoadOptions opts) {
  auto path = resolve_model_path(arg);
  if (!path.ok()) return Error{path.error()};
  return load_model(*path, opts);
}

}  // namespace bie
