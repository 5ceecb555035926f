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
