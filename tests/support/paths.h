// Where tests find the project's files and the fetched models.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace bie::test {

inline std::string source_dir() {
  return BIE_SOURCE_DIR;
}

inline std::string models_dir() {
  if (const char* home = std::getenv("BIE_HOME")) return std::string(home) + "/models";
  const char* h = std::getenv("HOME");
  return std::string(h ? h : "/root") + "/.cache/bie/models";
}

inline std::string smollm2_path() {
  return models_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}
inline std::string gemma3_path() {
  return models_dir() + "/gemma-3-270m-q4_k_m.gguf";
}
inline std::string qwen05_path() {
  return models_dir() + "/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
}
inline std::string qwen15_path() {
  return models_dir() + "/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";
}
// The model file of a golden folder's name (tests/golden/<name>/).
inline std::string golden_model_path(const std::string& name) {
  if (name == "smollm2") return smollm2_path();
  if (name == "gemma3") return gemma3_path();
  if (name == "qwen2.5-coder-0.5b") return qwen05_path();
  if (name == "qwen2.5-coder-1.5b") return qwen15_path();
  return models_dir() + "/unknown-golden-model-" + name;
}

// A test whose model or golden file is missing fails, naming `make models`: a checkout without
// the models must not pass by skipping. BIE_ALLOW_MISSING_MODELS=1 turns the failure into a skip
// (an explicit opt-in for a quick local run; `make test` and .ci/run never set it).
inline bool allow_missing_models() {
  const char* v = std::getenv("BIE_ALLOW_MISSING_MODELS");
  return v != nullptr && std::string(v) == "1";
}

inline std::string missing_file_message(const std::string& path) {
  return path +
         " is missing: run `make models` (scripts/fetch_models.sh; models go to $BIE_HOME/models, "
         "default ~/.cache/bie/models), or set BIE_ALLOW_MISSING_MODELS=1 to skip instead";
}

// In a test body or SetUp: fails (or, opted in, skips) the test when `path` does not exist.
#define BIE_REQUIRE_FILE(path)                                                 \
  do {                                                                         \
    const std::string bie_required_path_ = (path);                             \
    if (!std::filesystem::exists(bie_required_path_)) {                        \
      if (::bie::test::allow_missing_models())                                 \
        GTEST_SKIP() << ::bie::test::missing_file_message(bie_required_path_); \
      else                                                                     \
        GTEST_FAIL() << ::bie::test::missing_file_message(bie_required_path_); \
    }                                                                          \
  } while (0)

inline std::string read_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return {};
  std::string s;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  std::fclose(f);
  return s;
}

}  // namespace bie::test
