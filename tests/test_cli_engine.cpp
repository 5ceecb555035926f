// End-to-end checks of the engine flags of `bie run` / `bie bench`: each mistake is one clear
// stderr line and exit code 2; the start-up report appears once; bench at depths emits JSON.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bie/planner/kv_bytes.h"
#include "bie/planner/kv_layout_flags.h"
#include "bie/planner/model_geometry.h"
#include "support/paths.h"
#include "support/run_cmd.h"
#include "support/tiny_llama.h"

namespace bie {
namespace {

using test::count_lines;
using test::run_cmd;

void expect_bad_input(const std::string& args, const std::string& needle) {
  const auto r = run_cmd(test::bie_bin() + " " + args);
  EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << args << "\n" << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\n" << r.err;
}

TEST(CliEngine, KvBudgetTooSmall) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  expect_bad_input("run -m default -p hi --kv-cache-memory 1MiB",
                   "holds 0 of the 1 sequence(s) of --max-model-len 8192");
  expect_bad_input("run -m default -p hi --kv-cache-memory 1MiB", "raise --kv-cache-memory");
  expect_bad_input("bench -m default -p 8 -n 0 -r 1 --kv-cache-memory 4k", "--kv-cache-memory");
}

TEST(CliEngine, WeightsOverBudget) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  expect_bad_input("run -m default -p hi --device-memory 50MiB", "do not fit the memory budget");
  expect_bad_input("run -m default -p hi --gpu-memory-utilization 1.5",
                   "--gpu-memory-utilization must be in (0, 1]");
}

TEST(CliEngine, BadDtype) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  expect_bad_input("run -m default -p hi --kv-cache-dtype int5", "--kv-cache-dtype");
  expect_bad_input("run -m default -p hi --kv-cache-dtype-v int4_channel", "key format");
  expect_bad_input("bench -m default -p 8 -n 0 -r 1 --kv-cache-dtype f16,int5", "regime int5");
}

TEST(CliEngine, BadByteSizes) {
  expect_bad_input("run -m default -p hi --kv-cache-memory 12XB", "not a byte size");
  expect_bad_input("run -m default -p hi --kv-cache-memory -1", "");
  expect_bad_input("run -m default -p hi --device-memory lots", "--device-memory");
}

TEST(CliEngine, RotateNeedsPowerOfTwoHeadDim) {
  test::TinyLlama t;  // n_embd 96 / 2 heads: head_dim 48
  t.n_embd = 96;
  t.n_head = 2;
  t.n_head_kv = 1;
  const std::string path = std::filesystem::temp_directory_path() / "bie_cli_engine_d48.gguf";
  t.gguf().write(path);
  expect_bad_input("run -m " + path + " -p hi --kv-cache-dtype int8 --kv-rotate",
                   "power-of-two key head dimension, this model's is 48");
}

TEST(CliEngine, PromptLongerThanMaxModelLen) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  expect_bad_input("run -m default -p 'one two three four five six seven eight' -c 4",
                   "more than --max-model-len 4");
}

TEST(CliEngine, RunPrintsOneReportAndPeakRss) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  const auto r = run_cmd(test::bie_bin() +
                         " run -m default -p 'The capital of France is' -n 4 --temp 0 -t 2 "
                         "--kv-cache-dtype int4_asym --max-model-len 256");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count_lines(r.err), 4) << r.err;  // three report lines, then the timings
  EXPECT_NE(r.err.find("memory: budget"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("kv: k=int4_channel_t64 v=int4_asym_g64, block 64"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("peak RSS"), std::string::npos) << r.err;
}

// `bie run` drives the Engine: its prompt chunks follow the scheduler's rule, and the text does not
// depend on the chunk size even where blocks leave the FP16 window between chunks (per-channel
// int4 keys; the former generate() path on a PagedKvCache gave different text at -b 64 and -b 512
// for this prompt). -n -1 runs to the end of the context; -n 0 is refused.
TEST(CliEngine, RunTextDoesNotDependOnTheChunkSize) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  const std::string text = test::source_dir() + "/../shared/data/tinyshakespeare.txt";
  BIE_REQUIRE_FILE(text);
  std::ifstream in(text, std::ios::binary);
  std::string prompt(1500, '\0');
  in.read(prompt.data(), static_cast<std::streamsize>(prompt.size()));
  const std::string file = ::testing::TempDir() + "/bie_cli_chunks_prompt.txt";
  std::ofstream(file, std::ios::binary) << prompt;
  const std::string cmd = test::bie_bin() + " run -m default -f " + file +
                          " -n 16 --temp 0 -t 2 --kv-cache-dtype int4_asym --no-display-prompt";
  const auto whole = run_cmd(cmd + " -b 512");
  const auto chunked = run_cmd(cmd + " -b 64");
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  ASSERT_EQ(chunked.exit_code, 0) << chunked.err;
  EXPECT_NE(whole.err.find("prompt: 422 tokens"), std::string::npos) << whole.err;
  EXPECT_EQ(whole.out, chunked.out);

  const auto to_end = run_cmd(test::bie_bin() +
                              " run -m default -p hi -n -1 --ignore-eos --temp 0 -t 2 -c 32");
  ASSERT_EQ(to_end.exit_code, 0) << to_end.err;
  EXPECT_NE(to_end.err.find("decode: 31 tokens"), std::string::npos) << to_end.err;
  EXPECT_NE(to_end.err.find("finish: length"), std::string::npos) << to_end.err;
  expect_bad_input("run -m default -p hi -n 0", "-n must be at least 1");
}

// --kv-layer-map: `bie quality --calibrate` writes a map within its bit budget that measures
// better than the uniform recipe on its windows, `map=FILE` re-measures it to the same KLD,
// `bie run` serves with it, and a map for another model is one clear line.
TEST(CliEngine, CalibratedLayerMapRunsAndAWrongMapIsOneLine) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  const std::string text = test::source_dir() + "/../shared/data/tinyshakespeare.txt";
  BIE_REQUIRE_FILE(text);
  const std::string map = ::testing::TempDir() + "/bie_cli_smollm2.kvmap.json";
  const std::string small =
      " -m default -f " + text +
      " -c 128 --chunks 1 -b 128 -t 2 --paged-block-size 16 --kv-window 16 --kv-sink-tokens 4";
  // Block 16: keys cost 6 bits, so the cheapest map is 5.25 bits per value; budget 6.
  const auto cal =
      run_cmd(test::bie_bin() + " quality" + small + " --calibrate " + map + " --calibrate-bits 6");
  ASSERT_EQ(cal.exit_code, 0) << cal.err;
  std::ifstream in(map);
  const nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_EQ(j["layers"].size(), 30u);  // SmolLM2's layers
  EXPECT_LE(j["bits_per_value"].get<double>(), 6.0);
  EXPECT_GT(j["bits_per_value"].get<double>(), 5.25);  // the budget was spent
  EXPECT_LT(j["map_kld"].get<double>(), j["uniform_int4_asym_kld"].get<double>()) << cal.out;

  const auto again = run_cmd(test::bie_bin() + " quality" + small + " --prompts 0 --needle-ctx 0 " +
                             "--regimes map=" + map + " --json");
  ASSERT_EQ(again.exit_code, 0) << again.err;
  const nlohmann::json q = nlohmann::json::parse(again.out);
  ASSERT_EQ(q["regimes"].size(), 2u);  // f16, the map
  EXPECT_EQ(q["regimes"][1]["layer_map"].size(), 30u);
  EXPECT_DOUBLE_EQ(q["regimes"][1]["perplexity"][0]["mean_kld"].get<double>(),
                   j["map_kld"].get<double>());

  const auto run = run_cmd(test::bie_bin() +
                           " run -m default -p 'The capital of France is' -n 4 --temp 0 -t 2 "
                           "--max-model-len 256 --paged-block-size 16 --kv-layer-map " +
                           map);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.err.find("kv: layer-map k=int4_channel_t16 x"), std::string::npos) << run.err;
  // bench: the --kv-cache-dtype list as named, then the map as one more row.
  const auto bench = run_cmd(test::bie_bin() +
                             " bench -m default -p 16 -n 4 -r 1 -t 2 --paged-block-size 16 "
                             "--kv-cache-dtype f16,int4_asym --kv-layer-map " +
                             map);
  ASSERT_EQ(bench.exit_code, 0) << bench.err;
  EXPECT_EQ(count_lines(bench.out), 10) << bench.out;  // 4 header lines, 3 regimes x (tg, pp)
  EXPECT_NE(bench.out.find("\nlayer-map "), std::string::npos) << bench.out;
  EXPECT_NE(bench.out.find("\nint4_asym "), std::string::npos) << bench.out;

  const std::string two = ::testing::TempDir() + "/bie_cli_two_layers.kvmap.json";
  std::ofstream(two) << R"({"format": "bie-kv-layer-map", "version": 1, "layers": [
      {"k": "int4_channel", "v": "int4_asym_g64"}, {"k": "int8_channel", "v": "int8"}]})";
  expect_bad_input("run -m default -p hi --kv-layer-map " + two,
                   "the KV layer map has 2 layers, the model 30");
  expect_bad_input("run -m default -p hi --kv-layer-map /nonexistent.json", "cannot open");
}

TEST(CliEngine, BenchAtDepthsEmitsJson) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  const auto r = run_cmd(test::bie_bin() +
                         " bench -m default -p 16 -n 4 -d 0,40 -r 1 -t 2 "
                         "--kv-cache-dtype f16,int4_asym,int4_channel --kv-window 16 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["results"].size(), 12u);  // 3 regimes x 2 depths x (pp16, tg4)
  for (const auto& row : j["results"]) {
    EXPECT_GT(row["median_tps"].get<double>(), 0.0);
    EXPECT_GT(row["kv_bytes_per_token"].get<uint64_t>(), 0u);
    const int depth = row["depth"].get<int>();
    const uint64_t at = row["kv_bytes_at_depth"].get<uint64_t>();
    if (depth == 0) {
      EXPECT_EQ(at, 0u);
    } else {
      EXPECT_GT(at, 0u);
    }
  }
  // f16 stores 2 bytes per value; int4_asym_g64 (4 bits + a scale and zero per 64) less than a
  // third of that.
  EXPECT_LT(j["results"][2]["kv_bytes_per_token"].get<uint64_t>() * 3,
            j["results"][0]["kv_bytes_per_token"].get<uint64_t>());
}

// bie bench --speculative: both drafters, greedy outputs identical, the drafter's statistics
// reported (the draft model is the default model itself, forced to draft every step).
TEST(CliEngine, BenchSpeculativeReportsAcceptance) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  for (const std::string drafter : {"ngram", "default"}) {
    const auto r = run_cmd(test::bie_bin() + " bench -m default --speculative " + drafter +
                           " --speculative-always -n 12 -r 1 -t 2 --max-model-len 1024 --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_TRUE(j["identical_outputs"].get<bool>());
    EXPECT_EQ(j["results"].size(), 5u);
    EXPECT_GT(j["draft_tokens_verified"].get<double>(), 0.0) << drafter;
    EXPECT_GE(j["acceptance_rate"].get<double>(), 0.0);
    EXPECT_TRUE(j["median_speedup"].contains("grounded"));
    if (drafter == "default") {
      EXPECT_GT(j["acceptance_rate"].get<double>(), 0.8);
      EXPECT_NE(r.err.find("+ draft model"), std::string::npos) << r.err;
    }
  }
  expect_bad_input("bench -m default --speculative /nonexistent.gguf -n 4 -r 1",
                   "--speculative-model");
  expect_bad_input("bench -m default --speculative ngram --speculative-draft-tokens 99 -r 1", "");
}

// --fill synthetic reaches the depth without forward passes and holds exactly the blocks a
// prefill to that depth would (the planner's bytes); -p 0 runs decode only.
TEST(CliEngine, BenchSyntheticFillHoldsThePlannersBytes) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  const auto r = run_cmd(test::bie_bin() +
                         " bench -m default --fill synthetic -p 0 -n 2 -d 300 -r 1 -t 2 "
                         "--kv-cache-dtype f16,int4_asym --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("synthetic fill 300/300"), std::string::npos) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["fill"], "synthetic");
  EXPECT_FALSE(j["synthetic_model"].get<bool>());
  ASSERT_EQ(j["results"].size(), 2u);  // 2 regimes x tg2
  ASSERT_EQ(j["regimes"].size(), 2u);
  auto g = planner::geometry_from_gguf_path(test::smollm2_path());
  ASSERT_TRUE(g.ok());
  for (size_t i = 0; i < 2; ++i) {
    const auto& row = j["results"][i];
    EXPECT_EQ(row["test"], "tg2");
    EXPECT_GT(row["median_tps"].get<double>(), 0.0);
    planner::KvLayoutFlags f;
    f.dtype = row["regime"].get<std::string>();
    const planner::KvLayout layout = planner::resolve_kv_layout(f).value();
    EXPECT_EQ(row["kv_bytes_at_depth"].get<uint64_t>(), planner::kv_sequence_bytes(*g, layout, 300))
        << f.dtype;
    EXPECT_EQ(j["regimes"][i]["max_model_len"].get<int64_t>(), 303);
  }
}

TEST(CliEngine, SynthRefusesWhatItCannotWrite) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  auto r = run_cmd(test::bie_bin() + " synth --preset no-such-model");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unknown preset"), std::string::npos) << r.err;
  r = run_cmd(test::bie_bin() + " synth --preset smollm2-135m --out /tmp/bie_never.gguf");
  EXPECT_EQ(r.exit_code, 1);  // 576-wide rows are not whole Q4_K blocks
  EXPECT_NE(r.err.find("whole number"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("SYNTHETIC"), std::string::npos) << r.err;
}

// bie run takes the engine's speculative decoding (n-gram drafter here): the greedy text is the
// same as without it, and the timings line counts the drafts. Ctrl-C cancels the request: the
// text so far and the timings line are printed, exit code 130.
TEST(CliEngine, RunSpeculatesAndStopsOnCtrlC) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  const std::string prompt = "'One two three four five. One two three four five. One two three'";
  const std::string cmd = test::bie_bin() + " run -m default -p " + prompt +
                          " -n 24 --temp 0 -t 2 --no-display-prompt";
  const auto plain = run_cmd(cmd);
  const auto spec = run_cmd(cmd + " --speculative-draft-tokens 3");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(spec.exit_code, 0) << spec.err;
  EXPECT_EQ(plain.out, spec.out);
  const size_t at = spec.err.find("| drafts ");
  ASSERT_NE(at, std::string::npos) << spec.err;
  EXPECT_GT(std::stoi(spec.err.substr(at + 9)), 0) << spec.err;  // the drafter ran
  EXPECT_EQ(plain.err.find("| drafts "), std::string::npos) << plain.err;

  const auto stopped = run_cmd("timeout --preserve-status -s INT 2 " + test::bie_bin() +
                               " run -m default -p hi -n 100000 --ignore-eos -c 8192 --temp 0 -t 2");
  EXPECT_EQ(stopped.exit_code, 130) << stopped.err;
  EXPECT_NE(stopped.err.find("finish: cancelled"), std::string::npos) << stopped.err;
  EXPECT_GT(stopped.out.size(), 2u);
}

// A synthetic model (random weights) is served and run like any other, with one warning line that
// its text is noise: from `bie run` and from bie-serve (both through the Engine's ModelInfo).
TEST(CliEngine, RunAndServeSayASyntheticModelIsNoise) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  const std::string model = ::testing::TempDir() + "/bie_cli_synth_smollm2.gguf";
  const auto synth = run_cmd(test::bie_bin() + " synth --preset smollm2-135m --weights Q8_0 -o " +
                             model);
  ASSERT_EQ(synth.exit_code, 0) << synth.err;
  const auto run = run_cmd(test::bie_bin() + " run -m " + model + " -p hi -n 2 --temp 0 -t 2");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.err.find("is a SYNTHETIC model"), std::string::npos) << run.err;
  const std::string serve =
      std::filesystem::path(test::bie_bin()).parent_path() / "bie-serve";
  const auto srv = run_cmd("timeout -s INT 5 " + serve + " -m " + model + " --port 0 -t 2");
  EXPECT_NE(srv.err.find("ready on"), std::string::npos) << srv.err;
  EXPECT_NE(srv.err.find("is a SYNTHETIC model"), std::string::npos) << srv.err;
}

}  // namespace
}  // namespace bie
