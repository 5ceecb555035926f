// Tokenizer throughput on tinyshakespeare (../shared/data): encode with a cold and a warm BPE
// word cache (SmolLM2), SPM encode (Gemma 3), and decode. Reports tokens/s and bytes/s.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <memory>
#include <string>

#include "bie/gguf/gguf_file.h"
#include "bie/tokenizer/tokenizer.h"

namespace {

using bie::tokenizer::Tokenizer;

std::string home_models() {
  const char* h = std::getenv("BIE_HOME");
  if (h) return std::string(h) + "/models/";
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/root") + "/.cache/bie/models/";
}

std::string corpus() {
  static const std::string text = [] {
    std::string s;
    for (const char* p :
         {"../shared/data/tinyshakespeare.txt", "../../shared/data/tinyshakespeare.txt",
          "/work/shared/data/tinyshakespeare.txt"}) {
      if (FILE* f = std::fopen(p, "rb")) {
        char buf[1 << 16];
        size_t n;
        while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
        std::fclose(f);
        break;
      }
    }
    return s;
  }();
  return text;
}

std::unique_ptr<Tokenizer> load(const std::string& file) {
  auto f = bie::gguf::GgufFile::open(home_models() + file);
  if (!f.ok()) return nullptr;
  auto t = Tokenizer::from_gguf(**f);
  if (!t.ok()) return nullptr;
  return std::make_unique<Tokenizer>(std::move(t.value()));
}

void report(benchmark::State& state, size_t n_tokens, size_t n_bytes) {
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(n_tokens),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n_bytes));
}

void BM_EncodeBpeWarm(benchmark::State& state, const char* file) {
  auto tok = load(file);
  const std::string text = corpus();
  if (!tok || text.empty()) return state.SkipWithError("model or corpus missing");
  size_t n = tok->encode(text).size();  // warms the word cache
  for (auto _ : state) {
    auto ids = tok->encode(text);
    benchmark::DoNotOptimize(ids.data());
    n = ids.size();
  }
  report(state, n, text.size());
}

void BM_EncodeCold(benchmark::State& state, const char* file) {
  const std::string text = corpus();
  size_t n = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto tok = load(file);  // fresh tokenizer: empty word cache
    state.ResumeTiming();
    if (!tok || text.empty()) return state.SkipWithError("model or corpus missing");
    auto ids = tok->encode(text);
    benchmark::DoNotOptimize(ids.data());
    n = ids.size();
  }
  report(state, n, text.size());
}

void BM_Decode(benchmark::State& state, const char* file) {
  auto tok = load(file);
  const std::string text = corpus();
  if (!tok || text.empty()) return state.SkipWithError("model or corpus missing");
  const auto ids = tok->encode(text);
  for (auto _ : state) {
    auto s = tok->decode(ids);
    benchmark::DoNotOptimize(s.data());
  }
  report(state, ids.size(), text.size());
}

BENCHMARK_CAPTURE(BM_EncodeBpeWarm, smollm2, "SmolLM2-135M-Instruct.Q4_1.gguf")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeCold, smollm2, "SmolLM2-135M-Instruct.Q4_1.gguf")
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);
BENCHMARK_CAPTURE(BM_EncodeCold, gemma3_spm, "gemma-3-270m-q4_k_m.gguf")
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);
BENCHMARK_CAPTURE(BM_Decode, smollm2, "SmolLM2-135M-Instruct.Q4_1.gguf")
    ->Unit(benchmark::kMillisecond);

}  // namespace
