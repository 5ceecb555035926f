// `bie plan` end to end through the real binary: the issue's two example commands, --json,
// --svg, and bad input (one error line, exit code 2).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bie/backend/device.h"
#include "bie/engine/kv_setup.h"
#include "bie/planner/planner.h"
#include "bie/planner/presets.h"
#include "support/gguf_builder.h"
#include "support/paths.h"

namespace bie::cli {
namespace {

namespace fs = std::filesystem;

std::string bie_binary() {
  if (const char* b = std::getenv("BIE_BIN")) return b;
  return (fs::read_symlink("/proc/self/exe").parent_path() / "bie").string();
}

struct CliResult {
  int rc = -1;
  std::string out, err;
};

CliResult run_bie(const std::string& args) {
  const fs::path dir = fs::temp_directory_path() / ("bie_cli_plan_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string cmd =
      bie_binary() + " " + args + " >" + (dir / "out").string() + " 2>" + (dir / "err").string();
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = test::read_file((dir / "out").string());
  r.err = test::read_file((dir / "err").string());
  fs::remove_all(dir);
  return r;
}

const std::string kSeed =
    "plan --device rtx-4060ti-8gb --preset llama-3-8b --weights AWQ --max-model-len 65536";

TEST(CliPlan, SeedInt4Fits) {
  const CliResult r = run_bie(kSeed + " --kv-cache-dtype int4_asym");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("FITS:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("headroom"), std::string::npos);
  EXPECT_EQ(r.out.find("DOES NOT FIT"), std::string::npos);
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST(CliPlan, SeedF16SaysWhereItStops) {
  const CliResult r = run_bie(kSeed + " --kv-cache-dtype f16");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("DOES NOT FIT"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("stops fitting at 20,161 tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("over PCIe"), std::string::npos);
}

TEST(CliPlan, JsonMatchesLibrary) {
  const CliResult r =
      run_bie(kSeed + " --kv-cache-dtype-k int8 --kv-cache-dtype-v int4_asym --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["options"][0]["k"], "int8");
  EXPECT_EQ(j["options"][0]["v"], "int4_asym_g64");
  planner::KvLayout l;
  l.k = planner::parse_kv_format("int8").value();
  l.v = planner::parse_kv_format("int4_asym").value();
  const auto g = planner::preset_geometry("llama-3-8b").value();
  EXPECT_EQ(j["options"][0]["kv_bytes"].get<uint64_t>(),
            planner::kv_pool_plan(g, l, 65536, 1).total_bytes());
  EXPECT_EQ(j["options"][0]["bytes_per_token"].get<uint64_t>(), 32u * 8 * (130 + 72));
}

TEST(CliPlan, SvgChart) {
  const fs::path svg =
      fs::temp_directory_path() / ("bie_plan_" + std::to_string(::getpid()) + ".svg");
  const CliResult r = run_bie(kSeed + " --kv-cache-dtype int4_asym --json --svg " + svg.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string s = test::read_file(svg.string());
  fs::remove(svg);
  ASSERT_EQ(s.rfind("<svg", 0), 0u);
  EXPECT_NE(s.find("</svg>"), std::string::npos);
  const auto j = nlohmann::json::parse(r.out);
  for (const auto& o : j["options"]) {
    EXPECT_NE(s.find("data-format=\"" + o["label"].get<std::string>() + "\""), std::string::npos)
        << o["label"];
  }
}

TEST(CliPlan, RealSmolLM2) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  if (!fs::exists(test::smollm2_path())) GTEST_FAIL() << "model missing: " << test::smollm2_path();
  const CliResult r = run_bie("plan --model " + test::smollm2_path() +
                              " --vram 1 --bandwidth 50 --json --no-compare");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["request"]["max_model_len"], 8192);
  EXPECT_EQ(j["options"][0]["kv_bytes"],
            188743680);  // 23040 B/token x 8192: the engine's f16 cache
  EXPECT_EQ(j["weights"]["bytes"], 96576768);
  EXPECT_TRUE(j["weights"]["exact"].get<bool>());
}

// `bie plan --device vulkan:0` (lavapipe in CI) states the budget the engine's start-up report
// states on that device: the data section as the weights, the exact device workspace, usable =
// 0.90 x the device-local heaps, the KV budget stopping at four bindings per pool (the engine's
// allocations equal its report: tests/test_vulkan_engine.cpp).
TEST(CliPlan, VulkanDeviceStatesTheEnginesDeviceBudget) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  const CliResult r = run_bie(
      "plan --device vulkan:0 --model " + test::smollm2_path() +
      " --max-model-len 512 --max-num-seqs 4 --chunked-prefill-size 32 --json --no-compare");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["device"]["name"], "vulkan:0");

  auto devices = list_vulkan_devices();
  ASSERT_TRUE(devices.ok() && !devices->empty()) << devices.error();
  auto g = planner::geometry_from_gguf_path(test::smollm2_path());
  ASSERT_TRUE(g.ok()) << g.error();
  KvEngineOptions o;
  o.kv.dtype = "f16";
  o.max_model_len = 512;
  o.max_num_seqs = 4;
  o.chunked_prefill_size = 32;
  o.require_all_seqs = false;
  o.device = DeviceMemoryInfo{"vulkan:0", (*devices)[0].device_local_total(),
                              (*devices)[0].device_local_available()};
  o.workspace_bytes = planner::device_workspace_bytes(*g, 32, 4);
  o.max_pool_bytes = (*devices)[0].max_binding_bytes() * kMaxKvPoolParts;
  auto rep = plan_kv_setup(*g, *g->data_bytes, g->n_ctx_train, o);
  ASSERT_TRUE(rep.ok()) << rep.error();
  const auto& b = j["budget"];
  EXPECT_EQ(b["weights_bytes"].get<uint64_t>(), rep->weights_bytes);
  EXPECT_EQ(b["activation_bytes"].get<uint64_t>(), rep->workspace_bytes);
  EXPECT_EQ(b["workspace_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(b["usable_bytes"].get<uint64_t>(), rep->usable_bytes);
  EXPECT_EQ(b["kv_budget_bytes"].get<uint64_t>(), rep->kv_budget_bytes);
}

std::string write_temp(const std::string& name, const std::string& text);

TEST(CliPlan, CpuDeviceMeasuresBandwidth) {
  const CliResult r =
      run_bie("plan --preset smollm2-135m --weights Q4_1 --device cpu --json --no-compare");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["device"]["name"], "cpu");
  EXPECT_GT(j["device"]["bandwidth_gbs"].get<double>(), 0.1);
  EXPECT_GT(j["options"][0]["speed"][0]["tok_s"].get<double>(), 0.0);
}

TEST(CliPlan, ConfigJsonFile) {
  const std::string cfg = write_temp(
      "ok_config.json",
      R"({"model_type":"llama","hidden_size":4096,"intermediate_size":14336,"num_hidden_layers":32,
          "num_attention_heads":32,"num_key_value_heads":8,"vocab_size":128256,
          "max_position_embeddings":8192})");
  const CliResult r = run_bie("plan --config " + cfg +
                              " --weights Q4_K_M --device rtx-4090 --max-num-seqs 4 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["options"][0]["bytes_per_token"], 131072);
  EXPECT_EQ(j["options"][0]["kv_bytes"], 4ull << 30);  // 4 x 8192 tokens x 128 KiB
  EXPECT_TRUE(j["fits"].get<bool>());
}

TEST(CliPlan, Lists) {
  const CliResult r = run_bie("plan --list-devices --list-presets --list-weights");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("rtx-4060ti-8gb"), std::string::npos);
  EXPECT_NE(r.out.find("deepseek-v3"), std::string::npos);
  EXPECT_NE(r.out.find("Q4_K_M"), std::string::npos);
}

class CliPlanBadInput : public ::testing::TestWithParam<std::string> {};

TEST_P(CliPlanBadInput, OneLineAndExitCode2) {
  const CliResult r = run_bie(GetParam());
  EXPECT_EQ(r.rc, 2) << GetParam() << "\n" << r.out << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "more than one line: " << r.err;
  EXPECT_EQ(r.err.rfind("bie plan: error: ", 0), 0u) << r.err;
}

// Written when the test binary starts (every ctest process does), so one fixed path per file,
// replaced atomically (a process reading it never sees another's half-written copy) instead of a
// new file per process left behind in the temp directory.
std::string write_temp(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / ("bie_cli_plan_" + name);
  const fs::path tmp = fs::temp_directory_path() / (std::to_string(::getpid()) + "_" + name);
  std::ofstream(tmp, std::ios::binary) << text;
  fs::rename(tmp, p);
  return p.string();
}

std::string truncated_gguf() {
  test::GgufBuilder b;
  b.kv_str("general.architecture", "llama");
  b.kv_u32("llama.block_count", 2);
  b.tensor_f32("token_embd.weight", {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  const auto bytes = b.build();
  return write_temp(
      "truncated.gguf",
      std::string(bytes.begin(), bytes.begin() + static_cast<long>(bytes.size()) / 2));
}

const std::string kDev = " --device rtx-4090 ";
INSTANTIATE_TEST_SUITE_P(
    Cases, CliPlanBadInput,
    ::testing::Values(
        "plan --model " + truncated_gguf() + kDev, "plan --model /nonexistent/x.gguf" + kDev,
        "plan --preset llama-3-8b --weights AWQ --device rtx-9090",
        "plan --preset llama-9-9000b --weights AWQ" + kDev,
        "plan --config " +
            write_temp("missing.json", R"({"hidden_size":4096,"num_attention_heads":32})") +
            " --weights AWQ" + kDev,
        "plan --config " + write_temp("notjson.json", "{oops") + " --weights AWQ" + kDev,
        "plan --preset llama-3-8b --weights AWQ --max-model-len -5" + kDev,
        "plan --preset llama-3-8b --weights AWQ --max-model-len 99999999999" + kDev,
        "plan --preset llama-3-8b --weights AWQ --max-num-seqs 0" + kDev,
        "plan --preset llama-3-8b --weights AWQ --vram -8 --bandwidth 100",
        "plan --preset llama-3-8b --weights AWQ --vram 1e12 --bandwidth 100",
        "plan --preset llama-3-8b --weights AWQ --gpu-memory-utilization 1.5" + kDev,
        "plan --preset llama-3-8b --weights AWQ --paged-block-size 5000" + kDev,
        "plan --preset llama-3-8b --weights AWQ --kv-cache-dtype int3" + kDev,
        "plan --preset llama-3-8b --weights AWQ --kv-cache-dtype int4_asym --kv-group-size 48" +
            kDev,
        "plan --preset llama-3-8b --weights Q9_X" + kDev, "plan --preset llama-3-8b" + kDev,
        "plan --preset llama-3-8b --weights AWQ", "plan --weights AWQ" + kDev,
        "plan --preset llama-3-8b --model x.gguf --weights AWQ" + kDev,
        "plan --preset llama-3-8b --weights AWQ --pcie-bandwidth 0" + kDev,
        "plan --preset llama-3-8b --weights AWQ --kv-sink-tokens -1" + kDev,
        "plan --preset llama-3-8b --weights AWQ --speculative-draft-tokens 500" + kDev,
        "plan --preset llama-3-8b --weights AWQ --svg /nonexistent/dir/x.svg" + kDev));

}  // namespace
}  // namespace bie::cli
