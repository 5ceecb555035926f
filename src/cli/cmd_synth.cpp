// bie synth: write a synthetic model of a preset's real geometry (random weights, a real
// tokenizer padded to the preset's vocabulary) for memory and speed measurements of models that
// are too large to fetch; never for quality.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "bie/engine/model_path.h"
#include "bie/engine/synth_model.h"
#include "bie/planner/plan_report.h"
#include "bie/planner/presets.h"
#include "cli/commands.h"

namespace bie::cli {

namespace {

struct SynthArgs {
  std::string preset;
  std::string weights = "Q4_K";
  std::string out;  // default: $BIE_HOME/synth/<preset>-<weights>.gguf
  std::string tokenizer = "default";
  uint64_t seed = 1;
};

int synth(const SynthArgs& a) {
  const auto fail = [](int code, const std::string& msg) {
    std::fprintf(stderr, "bie synth: %s\n", msg.c_str());
    return code;
  };
  auto g = planner::preset_geometry(a.preset);
  if (!g) return fail(kExitBadInput, g.error());
  SynthOptions o;
  o.geometry = *g;
  o.label = a.preset;
  o.weights = a.weights;
  o.seed = a.seed;
  if (a.preset.starts_with("llama-3")) o.rope_freq_base = 500000.0f;  // Llama 3's rope_theta
  if (a.tokenizer != "none") {
    auto tok = resolve_model_path(a.tokenizer);
    if (!tok) return fail(kExitFailure, "tokenizer source: " + tok.error());
    o.tokenizer_from = *tok;
  }
  std::string out = a.out;
  if (out.empty()) out = fmt::format("{}/synth/{}-{}.gguf", bie_home(), a.preset, a.weights);
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(out).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);

  fmt::print(stderr,
             "bie synth: SYNTHETIC model — {} geometry, random {} weights. For memory and speed "
             "measurements only, never for quality.\n",
             g->name, a.weights);
  int last = -1;
  o.progress = [&](uint64_t done, uint64_t total) {
    const int pct = total ? static_cast<int>(100 * done / total) : 100;
    if (pct / 5 != last / 5) {
      fmt::print(stderr, "bie synth: {:3d}% of {}\n", pct,
                 planner::format_bytes(static_cast<double>(total)));
      last = pct;
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  auto r = write_synthetic_model(out, o);
  if (!r) return fail(kExitFailure, r.error());
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("wrote {} (SYNTHETIC: random weights, bie.synthetic = true)\n", out);
  fmt::print("  geometry  {} ({})\n", g->name, g->source);
  fmt::print("  tensors   {} ({} of tensor data, file {})\n", r->n_tensors,
             planner::format_bytes(static_cast<double>(r->weight_bytes)),
             planner::format_bytes(static_cast<double>(r->file_bytes)));
  if (r->tokenizer_tokens > 0) {
    fmt::print("  tokenizer {} tokens from {}, padded with {} unused placeholders to {}\n",
               r->tokenizer_tokens, o.tokenizer_from, r->placeholder_tokens, g->n_vocab);
  } else {
    fmt::print("  tokenizer none (the model can be benchmarked, not prompted with text)\n");
  }
  fmt::print("  time      {:.1f} s\n", sec);
  return kExitOk;
}

}  // namespace

void add_synth_command(CLI::App& root, int* rc) {
  auto a = std::make_shared<SynthArgs>();
  CLI::App* cmd = root.add_subcommand(
      "synth",
      "Write a SYNTHETIC model of a preset's real geometry (random weights; memory and speed "
      "only, never quality)");
  cmd->add_option("--preset", a->preset, "model preset (see bie plan --list-presets)")->required();
  cmd->add_option("--weights", a->weights, "matrix weight type: Q4_K or Q8_0")
      ->capture_default_str();
  cmd->add_option("-o,--out", a->out, "output GGUF (default: $BIE_HOME/synth/PRESET-WEIGHTS.gguf)");
  cmd->add_option("--tokenizer-from", a->tokenizer,
                  "GGUF whose tokenizer is copied ('default': SmolLM2; 'none': no tokenizer)")
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "random seed")->capture_default_str();
  cmd->callback([a, rc] { *rc = synth(*a); });
}

}  // namespace bie::cli
