// bie bench: llama-bench-style throughput — prompt processing (pp N) and decode (tg N) tokens/s
// at context depths (-d: the cache holds that many tokens first), for one or more KV regimes
// (--kv-cache-dtype f16,int8,...), median over repetitions, plus KV bytes and peak resident
// memory. Regimes run interleaved within each repetition so machine noise hits them equally.
// The depth is reached by a real prefill of random tokens (--fill prefill, the default) or by
// writing synthetic K/V straight into the cache (--fill synthetic: no forward passes, so an 8B
// model reaches 64k in seconds; for memory and speed only).
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "bie/backend/backend.h"
#include "bie/backend/thread_pool.h"
#include "bie/engine/generate.h"
#include "bie/engine/kv_setup.h"
#include "bie/engine/model_path.h"
#include "bie/engine/synth_model.h"
#include "bie/engine/synthetic_kv.h"
#include "bie/model/model.h"
#include "bie/planner/plan_report.h"
#include "cli/bench_spec.h"
#include "cli/commands.h"
#include "cli/kv_options.h"

namespace bie::cli {

namespace {

struct BenchArgs {
  std::string model = "default";
  std::vector<int32_t> prompt_lengths = {128, 512};
  int32_t n_decode = 128;
  std::vector<int32_t> depths = {0};
  int32_t reps = 5;
  int32_t threads = 0;
  std::string fill = "prefill";  // how the depth is reached: prefill | synthetic
  bool json = false;
  KvCliFlags kv;
  std::string speculative;  // "ngram" or a draft model: the speculative benchmark instead
  int32_t draft_tokens = 3;
  bool speculative_always = false;
};

// One regime's cache and what the report says about it.
struct Regime {
  std::string name;  // as given in the --kv-cache-dtype list
  KvSetup setup;
};

// One (regime, depth, test) cell of the results.
struct Cell {
  size_t regime = 0;
  int32_t depth = 0;
  std::string test;  // "pp512", "tg128"
  int32_t n = 0;
  bool decode = false;
  uint64_t kv_bytes_at_depth = 0;  // blocks held after filling `depth` tokens
  double fill_seconds = 0;         // the last fill to `depth` (0 when it was reused)
  std::vector<double> tps;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

int bench(const BenchArgs& a) {
  const auto fail = [](int code, const std::string& msg) {
    std::fprintf(stderr, "bie bench: %s\n", msg.c_str());
    return code;
  };
  auto dev = model_device(a.kv);
  if (!dev.ok()) return fail(kExitBadInput, dev.error());
  auto base = to_engine_options(a.kv);
  if (!base) return fail(kExitBadInput, base.error());
  if (!a.speculative.empty()) {
    SpecBenchOptions so;
    so.model = a.model;
    so.drafter = a.speculative;
    so.draft_tokens = a.draft_tokens;
    so.n_gen = a.n_decode;
    so.reps = a.reps;
    so.threads = a.threads;
    so.always = a.speculative_always;
    so.json = a.json;
    so.kv = *base;
    return run_spec_bench(so);
  }
  if (a.fill != "prefill" && a.fill != "synthetic") {
    return fail(kExitBadInput, "--fill must be prefill or synthetic");
  }
  const bool synthetic_fill = a.fill == "synthetic";
  std::vector<int32_t> prompt_lengths;  // -p 0: no prompt tests
  for (int32_t n : a.prompt_lengths)
    if (n > 0) prompt_lengths.push_back(n);
  const std::vector<std::string> names = split_list(a.kv.opts.kv.dtype);
  if (names.empty()) return fail(kExitBadInput, "--kv-cache-dtype: give at least one format");
  const int32_t max_depth = *std::max_element(a.depths.begin(), a.depths.end());
  const int32_t max_pp =
      prompt_lengths.empty() ? 0 : *std::max_element(prompt_lengths.begin(), prompt_lengths.end());
  if (base->max_model_len == 0) base->max_model_len = max_depth + std::max(max_pp, a.n_decode) + 1;
  if (max_depth + std::max(max_pp, a.n_decode) > base->max_model_len) {
    return fail(kExitBadInput,
                fmt::format("depth {} + test {} tokens exceed --max-model-len {}", max_depth,
                            std::max(max_pp, a.n_decode), base->max_model_len));
  }

  // Made before the model and the caches, so it outlives the buffers they hold on it.
  auto backend = create_backend(BackendConfig{*dev, std::max(0, a.threads)});
  if (!backend) return fail(kExitFailure, backend.error());
  Backend& be = **backend;
  LoadOptions lo;
  lo.max_batch_tokens = static_cast<int32_t>(base->chunked_prefill_size);
  auto model = load_named_model(a.model, lo);
  if (!model.ok()) return fail(kExitFailure, model.error());
  Model& m = **model;
  const bool synthetic_model = m.file().get_bool(kSyntheticKey).value_or(false);
  if (synthetic_model) {
    fmt::print(stderr,
               "bench: {} is a SYNTHETIC model (random weights): speed and memory only, never "
               "quality\n",
               m.file().path());
  }

  std::vector<Regime> regimes;
  // The --kv-cache-dtype list as named, then (with --kv-layer-map) the map as one more regime,
  // so a map is measured side by side with the uniform formats.
  std::vector<std::string> runs = names;
  if (!base->kv.layer_map.empty()) runs.push_back("layer-map");
  for (const std::string& name : runs) {
    KvEngineOptions o = *base;
    o.kv.dtype = name == "layer-map" ? "f16" : name;  // a map's own formats replace the dtype
    if (name != "layer-map") o.kv.layer_map.clear();
    auto s = setup_kv_cache(m, o, &be);
    if (!s) return fail(kExitBadInput, fmt::format("regime {}: {}", name, s.error()));
    regimes.push_back({name, std::move(s).value()});
  }
  for (const Regime& r : regimes) {  // start-up reports once every regime is known to fit
    const std::string text = format_kv_report(r.setup.report);
    std::fwrite(text.data(), 1, text.size(), stderr);
  }

  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> tok(0, m.hparams().n_vocab - 1);
  const auto random_tokens = [&](int32_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = tok(rng);
    return t;
  };
  std::vector<float> logits;
  using clock = std::chrono::steady_clock;

  std::vector<Cell> cells;
  for (int32_t d : a.depths) {
    for (size_t ri = 0; ri < regimes.size(); ++ri) {
      // Decode first: its tokens stay in the FP16 window, so the cache can be cut back to the
      // depth afterwards instead of being filled again (a prompt test usually cannot).
      if (a.n_decode > 0) {
        cells.push_back({ri, d, fmt::format("tg{}", a.n_decode), a.n_decode, true, 0, 0.0, {}});
      }
      for (int32_t n : prompt_lengths)
        cells.push_back({ri, d, fmt::format("pp{}", n), n, false, 0, 0.0, {}});
    }
  }
  // One warm-up forward so page faults of the mmapped weights are not timed.
  for (Regime& r : regimes) {
    if (Status s = prefill(m, *r.setup.cache, be, random_tokens(1), 1, 1, logits); !s)
      return fail(kExitFailure, s.error());
    if (Status s = r.setup.cache->truncate(0); !s) return fail(kExitFailure, s.error());
  }
  // Repetition-major, regime innermost: every regime sees the same stretch of machine noise.
  for (int rep = 0; rep < a.reps; ++rep) {
    for (Cell& c : cells) {
      // Progress on stderr: a run at 8k depths across regimes takes minutes.
      fmt::print(stderr, "bench: run {}/{}  {}  depth {}  {}\n", rep + 1, a.reps,
                 regimes[c.regime].name, c.depth, c.test);
      PagedKvCache& kv = *regimes[c.regime].setup.cache;
      const planner::KvLayout& layout = regimes[c.regime].setup.report.layout;
      const int64_t align = layout.block_size;
      const int64_t chunk = layout.prefill_chunk(base->chunked_prefill_size);  // as the engine
      // Reuse the previous cell's fill when it was the same depth and can be cut back to it.
      const bool reuse = kv.n_tokens() >= c.depth && c.depth > 0 && kv.truncate(c.depth).ok();
      if (!reuse) {
        if (Status s = kv.truncate(0); !s) return fail(kExitFailure, s.error());
        const auto tf = clock::now();
        if (synthetic_fill) {
          SyntheticKvOptions so;
          so.chunk = base->chunked_prefill_size;
          int last = -1;
          so.progress = [&](int64_t done, int64_t total) {
            const int pct = static_cast<int>(100 * done / total);
            if (pct / 10 != last / 10) {
              fmt::print(stderr, "bench: synthetic fill {}/{} tokens\n", done, total);
              last = pct;
            }
          };
          if (Status s = fill_kv_synthetic(kv, c.depth, so); !s)
            return fail(kExitFailure, s.error());
        } else {
          const std::vector<int32_t> fill = random_tokens(c.depth);
          if (!fill.empty()) {
            if (Status s = prefill(m, kv, be, fill, chunk, align, logits); !s)
              return fail(kExitFailure, s.error());
          }
        }
        c.fill_seconds = std::chrono::duration<double>(clock::now() - tf).count();
      }
      c.kv_bytes_at_depth = kv_held_bytes(kv);
      const std::vector<int32_t> test = random_tokens(c.n);
      const auto t0 = clock::now();
      const Status s = prefill(m, kv, be, test, c.decode ? 1 : chunk, align,
                               logits, c.decode ? MatmulPath::kDecode : MatmulPath::kPrefill);
      const double sec = std::chrono::duration<double>(clock::now() - t0).count();
      if (!s) return fail(kExitFailure, s.error());
      c.tps.push_back(c.n / sec);
    }
  }
  for (Regime& r : regimes) {
    if (Status s = r.setup.cache->check_integrity(); !s) return fail(kExitFailure, s.error());
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const double peak_mib = static_cast<double>(ru.ru_maxrss) / 1024.0;

  if (a.json) {
    nlohmann::json j;
    j["model"] = m.file().path();
    j["threads"] = be.host_threads().size();
    j["repetitions"] = a.reps;
    j["chunked_prefill_size"] = base->chunked_prefill_size;
    j["peak_rss_mib"] = peak_mib;
    j["synthetic_model"] = synthetic_model;
    j["fill"] = a.fill;
    j["regimes"] = nlohmann::json::array();
    for (const Regime& rg : regimes) {
      const KvSetupReport& r = rg.setup.report;
      j["regimes"].push_back({{"regime", rg.name},
                              {"layout", r.layout_label},
                              {"max_model_len", r.max_model_len},
                              {"usable_bytes", r.usable_bytes},
                              {"weights_bytes", r.weights_bytes},
                              {"workspace_bytes", r.workspace_bytes},
                              {"kv_budget_bytes", r.kv_budget_bytes},
                              {"kv_pool_bytes", r.kv_pool_bytes()},
                              {"seq_bytes", r.seq_bytes},
                              {"tokens_fit", r.tokens_fit},
                              {"bytes_per_token", r.bytes_per_token}});
    }
    j["results"] = nlohmann::json::array();
    for (const Cell& c : cells) {
      const KvSetupReport& r = regimes[c.regime].setup.report;
      j["results"].push_back({{"regime", regimes[c.regime].name},
                              {"layout", r.layout_label},
                              {"depth", c.depth},
                              {"test", c.test},
                              {"n", c.n},
                              {"median_tps", median(c.tps)},
                              {"runs_tps", c.tps},
                              {"kv_bytes_per_token", r.bytes_per_token},
                              {"kv_bytes_at_depth", c.kv_bytes_at_depth},
                              {"fill_seconds", c.fill_seconds}});
    }
    fmt::print("{}\n", j.dump(1));
    return kExitOk;
  }
  fmt::print("model   {}{}\nthreads {}  repetitions {}  chunk {}  fill {}\n", m.file().path(),
             synthetic_model ? " (SYNTHETIC: random weights)" : "", be.host_threads().size(),
             a.reps, base->chunked_prefill_size, a.fill);
  fmt::print("{:<14} {:>6} {:>7} {:>11} {:>9} {:>9} {:>11} {:>12}\n", "regime", "depth", "test",
             "median t/s", "min", "max", "KV B/token", "KV at depth");
  for (const Cell& c : cells) {
    const KvSetupReport& r = regimes[c.regime].setup.report;
    // Slow models (an 8B on a CPU decodes < 1 tok/s) need more digits than llama-bench's one.
    const double med = median(c.tps);
    const int dec = med < 10 ? 3 : 1;
    fmt::print("{:<14} {:>6} {:>7} {:>11.{}f} {:>9.{}f} {:>9.{}f} {:>11} {:>12}\n",
               regimes[c.regime].name, c.depth, c.test, med, dec,
               *std::min_element(c.tps.begin(), c.tps.end()), dec,
               *std::max_element(c.tps.begin(), c.tps.end()), dec, r.bytes_per_token,
               planner::format_bytes(static_cast<double>(c.kv_bytes_at_depth)));
  }
  fmt::print("peak RSS {:.1f} MiB\n", peak_mib);
  return kExitOk;
}

}  // namespace

void add_bench_command(CLI::App& root, int* rc) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = root.add_subcommand("bench", "Measure prompt and decode throughput (tokens/s)");
  cmd->add_option("-m,--model", a->model, "GGUF file, or 'default'")->capture_default_str();
  cmd->add_option("-p,--n-prompt", a->prompt_lengths, "Prompt lengths to time (pp tests; 0: none)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("-n,--n-gen", a->n_decode, "Tokens to decode (tg test; 0: skip)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("-d,--depth", a->depths,
                  "Context depths: tokens in the cache before each test (comma list)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 22));
  cmd->add_option("-r,--repetitions", a->reps, "Runs per test (median reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--fill", a->fill,
                  "How the depth is reached: prefill (forward passes over random tokens) or "
                  "synthetic (K/V of realistic statistics written straight into the cache)")
      ->capture_default_str()
      ->check(CLI::IsMember({"prefill", "synthetic"}));
  cmd->add_option("-t,--threads", a->threads, "Threads (0: all cores)")->check(CLI::Range(0, 1024));
  add_kv_engine_flags(cmd, a->kv,
                      "KV format, or a comma list of regimes to compare (f16,int8,int4_asym,...)");
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->add_option("--speculative", a->speculative,
                  "Instead of pp/tg: greedy generation with and without speculation on built-in "
                  "grounded and chat tasks; 'ngram' or a draft model GGUF");
  cmd->add_option("--speculative-draft-tokens", a->draft_tokens,
                  "Draft tokens per step for --speculative")
      ->check(CLI::Range(1, 15))
      ->capture_default_str();
  cmd->add_flag("--speculative-always", a->speculative_always,
                "Draft every step (no cost model) for --speculative");
  cmd->callback([a, rc] { *rc = bench(*a); });
}

}  // namespace bie::cli
