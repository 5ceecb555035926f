// Runs a command line through the shell and captures its exit code, stdout and stderr.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

namespace bie::test {

struct CmdResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Lines in a command's output (one-line error messages are checked with it).
inline int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

inline std::string bie_bin() {
  return BIE_BIN_PATH;
}

inline CmdResult run_cmd(const std::string& cmd) {
  const std::string err_path =
      std::filesystem::temp_directory_path() / ("bie_cmd_err_" + std::to_string(::getpid()));
  CmdResult r;
  FILE* p = ::popen((cmd + " 2>" + err_path).c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (FILE* e = std::fopen(err_path.c_str(), "rb")) {
    while ((n = std::fread(buf.data(), 1, buf.size(), e)) > 0) r.err.append(buf.data(), n);
    std::fclose(e);
  }
  std::filesystem::remove(err_path);
  return r;
}

}  // namespace bie::test
