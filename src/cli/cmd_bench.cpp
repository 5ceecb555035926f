// bie bench: llama-bench-style throughput — prompt processing (pp N) and decode (tg N) tokens/s
// at context depths (-d: the cache holds that many tokens first), for one or more KV regimes
// (--kv-cache-dtype f16,int8,...), median over repetitions, plus KV bytes and peak resident
// memory. Regimes run interleaved within each repetition so machine noise hits them equally.
// Every test is a request to the Engine the server drives (its scheduler, prefix cache and KV
// regimes): the depth is reached by a request whose prompt is that many random tokens, computed
// (--fill prefill, the default) or written as synthetic K/V (--fill synthetic,
// EngineRequest::synthetic_kv_prefix: no forward passes, so an 8B model reaches 64k in seconds;
// for memory and speed only), and the test's request then finds it in the prefix cache. pp N:
// N tokens after the depth over their prefill time (first token minus queueing); tg N: the
// N - 1 decode steps after the depth's prompt (whose pass gives the first token) over their time.
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "bie/engine/engine.h"
#include "bie/engine/kv_setup.h"
#include "bie/planner/kv_bytes.h"
#include "bie/planner/kv_layout_flags.h"
#include "bie/planner/model_geometry.h"
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
  int32_t draft_vocab = 0;
  bool no_lookup = false;
  bool speculative_always = false;
};

// One row of the results: a regime of the bench's engine (a --kv-cache-dtype format, or the
// --kv-layer-map map).
struct Row {
  std::string name;   // as given in the --kv-cache-dtype list, or "layer-map"
  std::string label;  // planner::kv_layout_label: what requests name it by
  planner::KvLayout layout;
  int64_t tokens_fit = 0;
};

// One (regime, depth, test) cell of the results.
struct Cell {
  size_t row = 0;
  int32_t depth = 0;
  std::string test;  // "pp512", "tg128"
  int32_t n = 0;
  bool decode = false;
  uint64_t kv_bytes_at_depth = 0;  // blocks a sequence of `depth` tokens holds
  double fill_seconds = 0;         // the last fill to `depth` that computed it (0: from cache)
  int64_t cached_tokens = 0;       // of the timed request's prompt, from the prefix cache
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

// A request's finish, and the KV the engine's sequences held after the pass that completed its
// prompt (the snapshot the engine published after that step, read at the second token).
struct Ran {
  FinishEvent fin;
  uint64_t held_after_prompt = 0;
};

Ran run_request(Engine& eng, RequestId id, EngineRequest req) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  int tokens = 0;
  Ran r;
  RequestCallbacks cb;
  cb.on_token = [&](const TokenEvent&) {  // the engine thread
    if (tokens++ == 1) r.held_after_prompt = eng.metrics().kv_held_bytes;
    return true;
  };
  cb.on_finish = [&](const FinishEvent& f) {
    std::lock_guard lk(mu);
    r.fin = f;
    done = true;
    cv.notify_all();
  };
  if (auto refused = eng.submit(id, std::move(req), cb)) {
    r.fin.finish_reason = "error";
    r.fin.error = refused->message;
    return r;
  }
  std::unique_lock lk(mu);
  cv.wait(lk, [&] { return done; });
  return r;
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
    so.draft_vocab = a.draft_vocab;
    so.lookup = !a.no_lookup;
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
  if (a.n_decode == 1) {
    return fail(kExitBadInput,
                "-n must be 0 or at least 2 (the first token comes with the prompt's pass; tg N "
                "times the N - 1 decode steps after it)");
  }
  // Requests: a decode test's prompt is the depth's tokens (one at depth 0) and it generates N;
  // a prompt test's is depth + N tokens and it generates one; a fill's is the depth, generating 2.
  const int32_t need = std::max({max_pp > 0 ? max_pp + 1 : 0, a.n_decode, max_depth > 0 ? 2 : 0});
  if (base->max_model_len == 0) base->max_model_len = max_depth + std::max(max_pp, a.n_decode) + 1;
  if (max_depth + need > base->max_model_len) {
    return fail(kExitBadInput, fmt::format("depth {} + test {} tokens exceed --max-model-len {}",
                                           max_depth, need, base->max_model_len));
  }

  // The engine the server drives, one request at a time: its scheduler's chunks, prefix cache
  // (each depth's fill is computed once and then served from it) and KV regime rules. The
  // --kv-cache-dtype list's first format is its default regime and the others further regimes
  // requests name; with --kv-layer-map the map is the default and every listed format a
  // further regime.
  const bool with_map = !base->kv.layer_map.empty();
  // The KV flags of row i: the list's formats in order, then the map.
  const auto row_flags = [&](size_t i) {
    planner::KvLayoutFlags f = base->kv;
    if (i < names.size()) {
      f.dtype = names[i];
      f.layer_map.clear();
    } else {
      f.dtype = "f16";  // the map's own formats replace it
    }
    return f;
  };
  for (size_t i = 0; i < names.size(); ++i) {  // named as the user wrote the list
    if (auto l = planner::resolve_kv_layout(row_flags(i)); !l) {
      return fail(kExitBadInput, fmt::format("regime {}: {}", names[i], l.error()));
    }
  }
  EngineConfig ec;
  ec.model = a.model;
  ec.device = *dev;
  ec.threads = std::max(0, a.threads);
  ec.kv = *base;
  ec.f16_kill_switch = false;
  ec.enable_prefix_caching = true;
  if (with_map) {
    ec.kv.kv.dtype = "f16";  // the map's own formats replace it
    ec.kv_regimes = names;
  } else {
    ec.kv.kv.dtype = names[0];
    ec.kv_regimes.assign(names.begin() + 1, names.end());
  }
  CreateError kind = CreateError::kInvalidConfig;
  auto engine = Engine::create(ec, &kind);
  if (!engine) {
    return fail(kind == CreateError::kModel ? kExitFailure : kExitBadInput, engine.error());
  }
  Engine& eng = **engine;
  const ModelInfo& info = eng.model_info();
  if (info.synthetic) {
    fmt::print(stderr,
               "bench: {} is a SYNTHETIC model (random weights): speed and memory only, never "
               "quality\n",
               info.path);
  }
  auto geom = planner::geometry_from_gguf_path(info.path);
  if (!geom) return fail(kExitFailure, geom.error());
  // Each row's layout and the engine regime holding it (found by label: two names of one layout,
  // as int4_asym and int4_channel, are one regime measured as two rows).
  const KvPolicyInfo policy = eng.kv_policy();
  std::vector<Row> rows;
  for (size_t i = 0; i < names.size() + (with_map ? 1 : 0); ++i) {
    auto layout = kv_layout_for_model(*geom, row_flags(i));
    if (!layout) return fail(kExitBadInput, layout.error());
    Row row{i < names.size() ? names[i] : "layer-map", planner::kv_layout_label(*layout), *layout,
            0};
    const auto it = std::find_if(policy.regimes.begin(), policy.regimes.end(),
                                 [&](const KvRegimeInfo& r) { return r.label == row.label; });
    if (it == policy.regimes.end()) {
      return fail(kExitFailure,
                  fmt::format("regime {} ({}) is not among the engine's", row.name, row.label));
    }
    row.tokens_fit = it->tokens_fit;
    rows.push_back(std::move(row));
  }
  const std::string text = format_kv_report(eng.kv_report());  // the one start-up report
  std::fwrite(text.data(), 1, text.size(), stderr);

  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> tok(0, info.n_vocab - 1);
  const auto random_tokens = [&](int32_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = tok(rng);
    return t;
  };
  // Every depth's fill is a prefix of one token sequence: a deeper fill reuses a shallower one.
  const std::vector<int32_t> fill = random_tokens(max_depth);
  RequestId next_id = 1;
  const auto request = [&](const Row& row, std::vector<int32_t> prompt, int32_t max_tokens,
                           int64_t synthetic) {
    EngineRequest r;
    r.prompt = std::move(prompt);
    r.kv_cache_dtype = row.label;
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    r.synthetic_kv_prefix = synthetic;
    return run_request(eng, next_id++, std::move(r));
  };

  std::vector<Cell> cells;
  for (int32_t d : a.depths) {
    for (size_t ri = 0; ri < rows.size(); ++ri) {
      if (a.n_decode > 0) {
        cells.push_back({ri, d, fmt::format("tg{}", a.n_decode), a.n_decode, true, 0, 0.0, 0, {}});
      }
      for (int32_t n : prompt_lengths)
        cells.push_back({ri, d, fmt::format("pp{}", n), n, false, 0, 0.0, 0, {}});
    }
  }
  // One warm-up request per regime so page faults of the mmapped weights are not timed.
  for (const Row& row : rows) {
    const Ran w = request(row, random_tokens(1), 1, 0);
    if (w.fin.finish_reason == "error") return fail(kExitFailure, w.fin.error);
  }
  // Repetition-major, regime innermost: every regime sees the same stretch of machine noise.
  for (int rep = 0; rep < a.reps; ++rep) {
    for (Cell& c : cells) {
      // Progress on stderr: a run at 8k depths across regimes takes minutes.
      const Row& row = rows[c.row];
      fmt::print(stderr, "bench: run {}/{}  {}  depth {}  {}\n", rep + 1, a.reps, row.name, c.depth,
                 c.test);
      const std::vector<int32_t> at_depth(fill.begin(), fill.begin() + c.depth);
      if (c.depth > 0) {
        // The fill: computed (or written, --fill synthetic) the first time, then a prefix-cache
        // hit; its second token reads what a sequence of `depth` tokens holds.
        const Ran f = request(row, at_depth, 2, synthetic_fill ? c.depth - 1 : 0);
        if (f.fin.finish_reason == "error") return fail(kExitFailure, f.fin.error);
        c.kv_bytes_at_depth = f.held_after_prompt;
        const RequestMetrics& fm = f.fin.metrics;
        if (fm.cached_tokens + row.layout.block_size < c.depth) {
          c.fill_seconds = fm.ttft_seconds;
          if (synthetic_fill) {
            fmt::print(stderr, "bench: synthetic fill {}/{} tokens in {:.1f} s\n", c.depth, c.depth,
                       fm.ttft_seconds);
          }
        }
      }
      std::vector<int32_t> prompt = at_depth;
      if (c.decode && c.depth == 0) prompt = random_tokens(1);  // a decode test needs a prompt
      if (!c.decode) {
        const std::vector<int32_t> test = random_tokens(c.n);
        prompt.insert(prompt.end(), test.begin(), test.end());
      }
      // (a decode test's prompt is the depth itself: its last token is computed)
      const int64_t synthetic = synthetic_fill ? std::max(0, c.decode ? c.depth - 1 : c.depth) : 0;
      const Ran t = request(row, std::move(prompt), c.decode ? c.n : 1, synthetic);
      if (t.fin.finish_reason == "error") return fail(kExitFailure, t.fin.error);
      const RequestMetrics& m = t.fin.metrics;
      c.cached_tokens = m.cached_tokens;
      const double prefill = m.ttft_seconds - m.queue_seconds;
      c.tps.push_back(c.decode ? m.decode_tps() : (prefill > 0 ? c.n / prefill : 0.0));
    }
  }
  eng.wait_idle();
  const EngineMetrics em = eng.metrics();
  if (em.kv_held_bytes != 0) {
    return fail(kExitFailure,
                fmt::format("{} bytes of KV blocks still held after the runs", em.kv_held_bytes));
  }
  eng.shutdown(false);
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const double peak_mib = static_cast<double>(ru.ru_maxrss) / 1024.0;
  const int threads =
      ec.threads > 0 ? ec.threads : static_cast<int>(std::thread::hardware_concurrency());
  const KvSetupReport& report = eng.kv_report();
  const auto bytes_per_token = [&](const Row& r) {
    return planner::kv_bytes_per_token(*geom, r.layout);
  };

  if (a.json) {
    nlohmann::json j;
    j["model"] = info.path;
    j["device"] = ec.device;
    j["threads"] = threads;
    j["repetitions"] = a.reps;
    j["chunked_prefill_size"] = base->chunked_prefill_size;
    j["peak_rss_mib"] = peak_mib;
    j["synthetic_model"] = info.synthetic;
    j["fill"] = a.fill;
    j["kv_budget_bytes"] = policy.budget_bytes;
    j["regimes"] = nlohmann::json::array();
    for (const Row& r : rows) {
      j["regimes"].push_back(
          {{"regime", r.name},
           {"layout", r.label},
           {"max_model_len", report.max_model_len},
           {"usable_bytes", report.usable_bytes},
           {"weights_bytes", report.weights_bytes},
           {"workspace_bytes", report.workspace_bytes},
           {"seq_bytes", planner::kv_pool_plan(*geom, r.layout, report.max_model_len, 1,
                                               base->chunked_prefill_size)
                             .total_bytes()},
           {"tokens_fit", r.tokens_fit},
           {"bytes_per_token", bytes_per_token(r)}});
    }
    j["results"] = nlohmann::json::array();
    for (const Cell& c : cells) {
      const Row& r = rows[c.row];
      j["results"].push_back({{"regime", r.name},
                              {"layout", r.label},
                              {"depth", c.depth},
                              {"test", c.test},
                              {"n", c.n},
                              {"median_tps", median(c.tps)},
                              {"runs_tps", c.tps},
                              {"kv_bytes_per_token", bytes_per_token(r)},
                              {"kv_bytes_at_depth", c.kv_bytes_at_depth},
                              {"fill_seconds", c.fill_seconds},
                              {"cached_tokens", c.cached_tokens}});
    }
    fmt::print("{}\n", j.dump(1));
    return kExitOk;
  }
  fmt::print("model   {}{}\nthreads {}  repetitions {}  chunk {}  fill {}\n", info.path,
             info.synthetic ? " (SYNTHETIC: random weights)" : "", threads, a.reps,
             base->chunked_prefill_size, a.fill);
  fmt::print("{:<14} {:>6} {:>7} {:>11} {:>9} {:>9} {:>11} {:>12}\n", "regime", "depth", "test",
             "median t/s", "min", "max", "KV B/token", "KV at depth");
  for (const Cell& c : cells) {
    const Row& r = rows[c.row];
    // Slow models (an 8B on a CPU decodes < 1 tok/s) need more digits than llama-bench's one.
    const double med = median(c.tps);
    const int dec = med < 10 ? 3 : 1;
    fmt::print("{:<14} {:>6} {:>7} {:>11.{}f} {:>9.{}f} {:>9.{}f} {:>11} {:>12}\n", r.name, c.depth,
               c.test, med, dec, *std::min_element(c.tps.begin(), c.tps.end()), dec,
               *std::max_element(c.tps.begin(), c.tps.end()), dec, bytes_per_token(r),
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
  cmd->add_option(
         "-n,--n-gen", a->n_decode,
         "Tokens to generate in the tg test (0: skip; at least 2: the first comes with the "
         "prompt, tg N times the N - 1 decode steps after it)")
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
  cmd->add_option("--speculative-draft-vocab", a->draft_vocab,
                  "A draft model's output layer reads its first N rows (0: all); ids of the text above N are "
                  "scored apart")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_flag("--speculative-no-lookup", a->no_lookup,
                "With a draft model: no prompt-lookup drafts beside it");
  cmd->add_flag("--speculative-always", a->speculative_always,
                "Draft every step (no cost model) for --speculative");
  cmd->callback([a, rc] { *rc = bench(*a); });
}

}  // namespace bie::cli
