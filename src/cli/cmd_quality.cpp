// bie quality: KV regimes against the f16 cache on one model and text — perplexity, ΔPPL, KL
// divergence, top-1 agreement, first divergence of greedy continuations, needle log-probability.
// Tables (or --json) on stdout, progress on stderr.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "bie/backend/device.h"
#include "bie/engine/kv_calibrate.h"
#include "bie/engine/model_path.h"
#include "bie/engine/quality.h"
#include "bie/planner/model_geometry.h"
#include "bie/tokenizer/tokenizer.h"
#include "cli/commands.h"

namespace bie::cli {

namespace {

struct QualityArgs {
  std::string model = "default";
  std::string text_file;
  std::vector<std::string> regimes = {"f16", "int8", "fp8", "int4_asym", "int4_asym_g64"};
  std::vector<int32_t> ctx_sizes = {2048};
  int32_t windows = 4;
  int32_t batch = 512;
  int32_t prompts = 8;
  int32_t prompt_tokens = 1024;
  int32_t continuation_tokens = 64;
  std::vector<int32_t> needle_depths = {10, 50, 90};
  std::vector<int32_t> needle_ctx = {2048};
  int64_t seed = 1;
  int32_t threads = 0;
  // cpu by default: most regimes it compares do not run on the GPU yet (docs/gpu.md).
  std::string device = "cpu";
  bool json = false;
  planner::KvLayoutFlags kv;
  std::string calibrate;        // --calibrate FILE: write a per-layer map there
  double calibrate_bits = 4.5;  // its average bits/value budget
};

int fail(int code, const std::string& msg) {
  std::fprintf(stderr, "bie quality: %s\n", msg.c_str());
  return code;
}

nlohmann::json to_json(const QualityReport& rep, const QualityArgs& a, int threads) {
  nlohmann::json j;
  j["model"] = a.model;
  j["text"] = a.text_file;
  j["text_tokens"] = rep.text_tokens;
  j["threads"] = threads;
  j["device"] = a.device;
  j["batch"] = a.batch;
  j["scored"] = "second half of each window: logits at n/2..n-2 score tokens n/2+1..n-1";
  j["passphrase"] = rep.passphrase;
  j["regimes"] = nlohmann::json::array();
  for (size_t r = 0; r < rep.regimes.size(); ++r) {
    const RegimeQuality& q = rep.regimes[r];
    const planner::KvLayout& l = q.regime.layout;
    nlohmann::json jr;
    jr["regime"] = q.regime.spec;
    jr["layout"] = planner::kv_layout_label(l);
    jr["k"] = planner::kv_format_name(l.k);
    jr["v"] = planner::kv_format_name(l.v);
    jr["rotate"] = l.rotate;
    jr["sink_tokens"] = l.mixed() ? l.sink_tokens : 0;
    jr["window_tokens"] = l.mixed() ? l.window_tokens : 0;
    jr["body_bytes_per_token"] = q.body_bytes_per_token;
    if (!l.per_layer.empty()) {
      jr["layer_map"] = nlohmann::json::array();
      for (const planner::KvLayerFormats& lf : l.per_layer) {
        jr["layer_map"].push_back(
            {{"k", planner::kv_format_name(lf.k)}, {"v", planner::kv_format_name(lf.v)}});
      }
    }
    jr["perplexity"] = nlohmann::json::array();
    for (size_t i = 0; i < q.ppl.size(); ++i) {
      const PplStats& p = q.ppl[i];
      jr["perplexity"].push_back({{"n_ctx", p.n_ctx},
                                  {"windows", p.windows},
                                  {"n_scored", p.n_scored},
                                  {"bytes_per_token", q.bytes_per_token[i]},
                                  {"ppl", p.ppl()},
                                  {"delta_ppl_pct", rep.delta_ppl_pct(r, i)},
                                  {"mean_kld", p.mean_kld()},
                                  {"max_kld", p.kld_max},
                                  {"top1", p.top1()}});
    }
    jr["first_divergence"] = q.first_divergence;
    jr["median_first_divergence"] = q.median_divergence();
    jr["needle"] = nlohmann::json::array();
    for (const NeedleStats& n : q.needle) {
      jr["needle"].push_back({{"n_ctx", n.n_ctx},
                              {"depth_pct", n.depth_pct},
                              {"needle_pos", n.needle_pos},
                              {"answer_logprob", n.answer_logprob},
                              {"answer_greedy", n.answer_greedy}});
    }
    j["regimes"].push_back(jr);
  }
  return j;
}

std::string to_text(const QualityReport& rep, const QualityArgs& a) {
  std::string s;
  s += fmt::format(
      "{} tokens of text; perplexity over the second half of each window (n/2-1 tokens scored "
      "per window); KLD = KL(f16 || regime), nats\n\n",
      rep.text_tokens);
  s += fmt::format("{:<18} {:<34} {:>6} {:>8} {:>4} {:>9} {:>8} {:>9} {:>8}\n", "regime", "layout",
                   "ctx", "B/token", "win", "PPL", "ΔPPL%", "mean KLD", "top-1%");
  for (size_t i = 0; i < a.ctx_sizes.size(); ++i) {
    for (size_t r = 0; r < rep.regimes.size(); ++r) {
      const RegimeQuality& q = rep.regimes[r];
      const PplStats& p = q.ppl[i];
      s += fmt::format("{:<18} {:<34} {:>6} {:>8.0f} {:>4} {:>9.4f} {:>+8.3f} {:>9.5f} {:>8.2f}\n",
                       q.regime.spec, planner::kv_layout_label(q.regime.layout), p.n_ctx,
                       q.bytes_per_token[i], p.windows, p.ppl(), rep.delta_ppl_pct(r, i),
                       p.mean_kld(), 100.0 * p.top1());
    }
  }
  if (!rep.regimes[0].first_divergence.empty()) {
    s += fmt::format(
        "\ngreedy continuations: {} prompts of {} tokens, {} tokens each; first token that "
        "differs from f16's ({} = never)\n",
        a.prompts, a.prompt_tokens, a.continuation_tokens, a.continuation_tokens);
    s += fmt::format("{:<18} {:>8}  {}\n", "regime", "median", "per prompt");
    for (const RegimeQuality& q : rep.regimes) {
      s += fmt::format("{:<18} {:>8.1f}  {}\n", q.regime.spec, q.median_divergence(),
                       fmt::join(q.first_divergence, " "));
    }
  }
  if (!rep.regimes[0].needle.empty()) {
    s += fmt::format(
        "\nneedle: \"The secret passphrase is {}.\" at depth% of the haystack; log p(answer) "
        "summed over its tokens (* = greedy would answer it)\n",
        rep.passphrase);
    s += fmt::format("{:<18}", "regime");
    for (const NeedleStats& n : rep.regimes[0].needle) {
      s += fmt::format(" {:>12}", fmt::format("{}@{}%", n.n_ctx, n.depth_pct));
    }
    s += "\n";
    for (const RegimeQuality& q : rep.regimes) {
      s += fmt::format("{:<18}", q.regime.spec);
      for (const NeedleStats& n : q.needle) {
        s += fmt::format(" {:>12}",
                         fmt::format("{:.3f}{}", n.answer_logprob, n.answer_greedy ? "*" : " "));
      }
      s += "\n";
    }
  }
  return s;
}

int run_calibration(const QualityArgs& a, const QualityTarget& target, const std::string& text,
                    const QualityProgress& say) {
  auto path = resolve_model_path(a.model);
  if (!path) return fail(kExitFailure, path.error());
  auto geom = planner::geometry_from_gguf_path(*path);
  if (!geom) return fail(kExitFailure, geom.error());
  KvCalibrateConfig cc;
  cc.base = a.kv;
  cc.max_bits_per_value = a.calibrate_bits;
  cc.ctx_sizes = a.ctx_sizes;
  cc.windows = a.windows;
  cc.batch = a.batch;
  auto c = calibrate_kv_layer_map(target, *geom, text, cc, say);
  if (!c) return fail(kExitBadInput, c.error());
  const std::string json = kv_calibration_json(*c, a.model, a.text_file, cc);
  std::ofstream out(a.calibrate, std::ios::binary);
  if (!out || !(out << json)) {
    return fail(kExitFailure, fmt::format("cannot write the layer map to '{}'", a.calibrate));
  }
  std::string s = fmt::format(
      "per-layer sensitivity (mean-KLD drop from the base K {} / V {} when one layer moves)\n"
      "{:>5} {:>12} {:>16} {:>12}  chosen\n",
      "int4_channel", c->value_base, "layer", "K int8", "V " + c->value_mid, "V int8");
  for (size_t il = 0; il < c->layers.size(); ++il) {
    const KvLayerSensitivity& l = c->layers[il];
    s += fmt::format("{:>5} {:>12.6f} {:>16.6f} {:>12.6f}  k={} v={}\n", il, l.k8_gain, l.v64_gain,
                     l.v8_gain, c->map[il].k, c->map[il].v);
  }
  s += fmt::format(
      "\nbase (every layer K int4_channel / V {}): {:.3f} bits/value, KLD {:.5f}\n"
      "layer map: {:.3f} bits/value (budget {:.3f}), KLD predicted {:.5f}, measured {:.5f}, "
      "ΔPPL {:+.3f} %\n"
      "uniform int4_asym: {:.3f} bits/value, KLD {:.5f}, ΔPPL {:+.3f} %\n"
      "wrote {} (use it with --kv-layer-map)\n",
      c->value_base, c->base_bits, c->base_kld, c->map_bits, a.calibrate_bits, c->predicted_kld,
      c->map_kld, c->map_dppl_pct, c->uniform_bits, c->uniform_kld, c->uniform_dppl_pct,
      a.calibrate);
  std::fwrite(s.data(), 1, s.size(), stdout);
  return kExitOk;
}

int run(const QualityArgs& a) {
  std::ifstream f(a.text_file, std::ios::binary);
  if (!f) return fail(kExitBadInput, fmt::format("cannot read text file '{}'", a.text_file));
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();

  QualityConfig cfg;
  for (const std::string& spec : a.regimes) {
    auto r = parse_quality_regime(spec, a.kv);
    if (!r) return fail(kExitBadInput, r.error());
    cfg.regimes.push_back(*r);
  }
  cfg.ctx_sizes = a.ctx_sizes;
  cfg.windows = a.windows;
  cfg.batch = a.batch;
  cfg.prompts = a.prompts;
  cfg.prompt_tokens = a.prompt_tokens;
  cfg.continuation_tokens = a.continuation_tokens;
  cfg.needle_depths = a.needle_depths;
  cfg.needle_ctx.clear();
  for (int32_t n : a.needle_ctx) {
    if (n > 0) cfg.needle_ctx.push_back(n);  // 0: no needle test
  }
  cfg.seed = static_cast<uint64_t>(a.seed);

  // The measurement runs on an Engine (the server's scheduler and KV regimes) on this device.
  auto device = backend_for_device(a.device);
  if (!device) return fail(kExitBadInput, device.error());
  QualityTarget target;
  target.model = a.model;
  target.device = *device;
  target.threads = std::max(0, a.threads);
  const int threads =
      a.threads > 0 ? a.threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));

  const QualityProgress say = [](const std::string& line) {
    std::fprintf(stderr, "bie quality: %s\n", line.c_str());
  };
  if (!a.calibrate.empty()) return run_calibration(a, target, text, say);
  auto rep = measure_kv_quality(target, text, cfg, say);
  if (!rep) return fail(kExitBadInput, rep.error());
  const std::string out =
      a.json ? to_json(*rep, a, threads).dump(2) + "\n" : to_text(*rep, a);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return kExitOk;
}

}  // namespace

void add_quality_command(CLI::App& root, int* rc) {
  auto a = std::make_shared<QualityArgs>();
  CLI::App* cmd = root.add_subcommand(
      "quality", "Measure KV regimes against the f16 cache: PPL, KLD, top-1, greedy, needle");
  cmd->add_option("-m,--model", a->model, "GGUF file, or 'default' (SmolLM2-135M-Instruct Q4_1)")
      ->capture_default_str();
  cmd->add_option("-f,--file", a->text_file, "Text to measure on")->required();
  cmd->add_option("--regimes", a->regimes,
                  "KV regimes: --kv-cache-dtype names, 'k=NAME:v=NAME', optional +rotate/-rotate, "
                  "or 'map=FILE' (a --kv-layer-map file)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("-c,--ctx-size", a->ctx_sizes, "Perplexity window sizes, e.g. 2048,8192")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(4, 1 << 20));
  cmd->add_option("--chunks", a->windows, "Perplexity windows per context size")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("-b,--batch-size", a->batch, "Tokens per forward pass")
      ->capture_default_str()
      ->check(CLI::Range(1, 8192));
  cmd->add_option("--prompts", a->prompts, "Greedy-continuation prompts (0: none)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 16));
  cmd->add_option("--prompt-tokens", a->prompt_tokens, "Tokens per continuation prompt")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--continuation", a->continuation_tokens, "Greedy tokens per prompt")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--needle-depths", a->needle_depths, "Needle depths in percent")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(0, 100));
  cmd->add_option("--needle-ctx", a->needle_ctx, "Needle test lengths in tokens (0: none)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--seed", a->seed, "Picks the passphrase")->capture_default_str();
  cmd->add_option("--kv-group-size", a->kv.group_size, "int4_asym values per group")
      ->capture_default_str();
  cmd->add_option(
         "--paged-block-size", a->kv.block_size,
         "Tokens per KV block and per-channel key tile (0: 64 for int4_asym, int8, the _channel "
         "formats and layer maps, else 16)")
      ->capture_default_str();
  cmd->add_option("--kv-sink-tokens", a->kv.sink_tokens, "First tokens kept in FP16")
      ->capture_default_str();
  cmd->add_option("--kv-window", a->kv.window_tokens, "Last tokens kept in FP16")
      ->capture_default_str();
  cmd->add_option("-t,--threads", a->threads, "Threads (0: all cores)")->check(CLI::Range(0, 1024));
  cmd->add_option("--device", a->device,
                  "auto|cpu|vulkan[:N]; on a GPU the model and the KV pools run there (f16 KV "
                  "only so far)")
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "Print JSON instead of tables");
  cmd->add_option("--calibrate", a->calibrate,
                  "Measure each layer's K and V sensitivity on the text and write a per-layer "
                  "format map (--kv-layer-map FILE) to this file, within --calibrate-bits");
  cmd->add_option("--calibrate-bits", a->calibrate_bits,
                  "The map's average bits per K/V value, scales included (int4_asym: 4.5)")
      ->capture_default_str()
      ->check(CLI::Range(4.0, 16.0));
  cmd->callback([a, rc] { *rc = run(*a); });
}

}  // namespace bie::cli
