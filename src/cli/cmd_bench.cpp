// bie bench: llama-bench-style throughput — prompt processing (pp N) and decode (tg N) tokens/s,
// median over repetitions, plus peak resident memory.
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "bie/backend/thread_pool.h"
#include "bie/engine/model_path.h"
#include "bie/kv/contiguous_kv_cache.h"
#include "bie/model/model.h"
#include "cli/commands.h"

namespace bie::cli {

namespace {

struct BenchArgs {
  std::string model = "default";
  std::vector<int32_t> prompt_lengths = {128, 512};
  int32_t n_decode = 128;
  int32_t reps = 5;
  int32_t threads = 0;
  int32_t batch = 512;
  bool json = false;
};

struct Row {
  std::string test;
  std::vector<double> tps;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int bench(const BenchArgs& a) {
  LoadOptions lo;
  lo.max_batch_tokens = a.batch;
  auto model = load_named_model(a.model, lo);
  if (!model.ok()) {
    std::fprintf(stderr, "bie bench: %s\n", model.error().c_str());
    return kExitFailure;
  }
  Model& m = **model;
  ThreadPool pool(a.threads > 0 ? a.threads : default_thread_count());
  const int32_t max_pp = a.prompt_lengths.empty()
                             ? 1
                             : *std::max_element(a.prompt_lengths.begin(), a.prompt_lengths.end());
  ContiguousKvCache kv(m.hparams().kv_geometry(), std::max(max_pp, a.n_decode + 1));
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> tok(0, m.hparams().n_vocab - 1);
  std::vector<float> logits;
  using clock = std::chrono::steady_clock;

  std::vector<Row> rows;
  // One warm-up forward so page faults of the mmapped weights are not timed.
  {
    const int32_t t[1] = {tok(rng)};
    if (Status s = m.forward(t, kv, pool, logits); !s) {
      std::fprintf(stderr, "bie bench: %s\n", s.error().c_str());
      return kExitFailure;
    }
    (void)kv.truncate(0);  // the contiguous cache always can
  }
  for (int32_t n : a.prompt_lengths) {
    Row row{fmt::format("pp{}", n), {}};
    std::vector<int32_t> prompt(static_cast<size_t>(n));
    for (int r = 0; r < a.reps; ++r) {
      for (auto& t : prompt) t = tok(rng);
      (void)kv.truncate(0);  // the contiguous cache always can
      const auto t0 = clock::now();
      for (int32_t off = 0; off < n; off += a.batch) {
        const int32_t len = std::min(a.batch, n - off);
        if (Status s = m.forward(std::span<const int32_t>(prompt).subspan(static_cast<size_t>(off),
                                                                          static_cast<size_t>(len)),
                                 kv, pool, logits);
            !s) {
          std::fprintf(stderr, "bie bench: %s\n", s.error().c_str());
          return kExitFailure;
        }
      }
      row.tps.push_back(n / std::chrono::duration<double>(clock::now() - t0).count());
    }
    rows.push_back(std::move(row));
  }
  if (a.n_decode > 0) {
    Row row{fmt::format("tg{}", a.n_decode), {}};
    for (int r = 0; r < a.reps; ++r) {
      (void)kv.truncate(0);  // the contiguous cache always can
      const auto t0 = clock::now();
      for (int32_t i = 0; i < a.n_decode; ++i) {
        const int32_t t[1] = {tok(rng)};
        if (Status s = m.forward(t, kv, pool, logits); !s) {
          std::fprintf(stderr, "bie bench: %s\n", s.error().c_str());
          return kExitFailure;
        }
      }
      row.tps.push_back(a.n_decode / std::chrono::duration<double>(clock::now() - t0).count());
    }
    rows.push_back(std::move(row));
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const double peak_mib = static_cast<double>(ru.ru_maxrss) / 1024.0;

  if (a.json) {
    nlohmann::json j;
    j["model"] = m.file().path();
    j["threads"] = pool.size();
    j["peak_rss_mib"] = peak_mib;
    for (const auto& r : rows) {
      j["results"].push_back(
          {{"test", r.test}, {"median_tps", median(r.tps)}, {"runs_tps", r.tps}});
    }
    fmt::print("{}\n", j.dump(1));
    return kExitOk;
  }
  fmt::print("model   {}\nthreads {}  repetitions {}\n", m.file().path(), pool.size(), a.reps);
  fmt::print("{:<8} {:>12} {:>10} {:>10}\n", "test", "median t/s", "min", "max");
  for (const auto& r : rows) {
    fmt::print("{:<8} {:>12.1f} {:>10.1f} {:>10.1f}\n", r.test, median(r.tps),
               *std::min_element(r.tps.begin(), r.tps.end()),
               *std::max_element(r.tps.begin(), r.tps.end()));
  }
  fmt::print("peak RSS {:.1f} MiB\n", peak_mib);
  return kExitOk;
}

}  // namespace

void add_bench_command(CLI::App& root, int* rc) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = root.add_subcommand("bench", "Measure prompt and decode throughput (tokens/s)");
  cmd->add_option("-m,--model", a->model, "GGUF file, or 'default'")->capture_default_str();
  cmd->add_option("-p,--n-prompt", a->prompt_lengths, "Prompt lengths to time (pp tests)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("-n,--n-gen", a->n_decode, "Tokens to decode (tg test; 0: skip)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 16));
  cmd->add_option("-r,--repetitions", a->reps, "Runs per test (median reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_option("-t,--threads", a->threads, "Threads (0: all cores)")->check(CLI::Range(0, 1024));
  cmd->add_option("-b,--batch-size", a->batch, "Prompt tokens per forward")
      ->capture_default_str()
      ->check(CLI::Range(1, 8192));
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([a, rc] { *rc = bench(*a); });
}

}  // namespace bie::cli
