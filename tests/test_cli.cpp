// End-to-end checks of the `bie` program: bad inputs exit non-zero with one clear line; the
// default model runs and prints timings.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "support/gguf_builder.h"
#include "support/paths.h"
#include "support/run_cmd.h"
#include "support/tiny_llama.h"

namespace bie {
namespace {

using test::count_lines;
using test::run_cmd;

void expect_one_line_error(const test::CmdResult& r, const std::string& needle) {
  EXPECT_NE(r.exit_code, 0);
  EXPECT_LT(r.exit_code, 128) << "killed by a signal";
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

std::string tmp(const std::string& name) {
  return std::filesystem::temp_directory_path() / name;
}

TEST(Cli, MissingModelFile) {
  auto r = run_cmd(test::bie_bin() + " run -m /nonexistent -p hi");
  expect_one_line_error(r, "model file '/nonexistent' does not exist");
}

TEST(Cli, TruncatedModelFile) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  const std::string full = test::read_file(test::smollm2_path());
  ASSERT_FALSE(full.empty());
  const std::string path = tmp("bie_truncated.gguf");
  std::ofstream(path, std::ios::binary)
      .write(full.data(), static_cast<std::streamsize>(full.size() / 2));
  auto r = run_cmd(test::bie_bin() + " run -m " + path + " -p hi");
  expect_one_line_error(r, "extends past the end of the file");
  auto info = run_cmd(test::bie_bin() + " info " + path);
  expect_one_line_error(info, "truncated");
}

TEST(Cli, UnknownArchitecture) {
  test::GgufBuilder g;
  g.kv_str("general.architecture", "rwkv99");
  const std::string path = tmp("bie_rwkv99.gguf");
  g.write(path);
  auto r = run_cmd(test::bie_bin() + " run -m " + path + " -p hi");
  expect_one_line_error(r, "unsupported architecture 'rwkv99'");
}

TEST(Cli, UnknownTensorType) {
  test::GgufBuilder g;
  g.kv_str("general.architecture", "llama");
  g.tensor("token_embd.weight", {32, 2}, 77, std::vector<uint8_t>(64));
  const std::string path = tmp("bie_type77.gguf");
  g.write(path);
  auto r = run_cmd(test::bie_bin() + " run -m " + path + " -p hi");
  expect_one_line_error(r, "unknown tensor type id 77");
}

TEST(Cli, BadFlagValueIsExitCode2) {
  auto r = run_cmd(test::bie_bin() + " run -m default -p hi --top-p 7");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("top_p"), std::string::npos) << r.err;
}

TEST(Cli, InfoDescribesDefaultModel) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  auto r = run_cmd(test::bie_bin() + " info default");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("architecture    llama"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layers          30"), std::string::npos);
  EXPECT_NE(r.out.find("q4_1"), std::string::npos);
  EXPECT_NE(r.out.find("gpt2 (pre 'smollm')"), std::string::npos);
}

TEST(Cli, RunDefaultModelGreedy) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  auto r = run_cmd(test::bie_bin() + " run -m default -p 'The capital of France is' -n 8 --temp 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("The capital of France is Paris"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("decode:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tok/s"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace bie
