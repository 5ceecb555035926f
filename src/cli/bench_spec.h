// Shared by the bench commands: median(). bie bench --speculative: greedy generation through the
// Engine with and without a drafter, on built-in input-grounded tasks (the answer copies text from
// the prompt) and open chat.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "bie/engine/kv_setup.h"

namespace bie::cli {

// The median of v (the mean of the middle two for an even count; 0 when empty).
[[nodiscard]] inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct SpecBenchOptions {
  std::string model = "default";
  std::string drafter;  // "ngram", or a draft model GGUF path ("default" allowed)
  int32_t draft_tokens = 3;
  int32_t draft_vocab = 0;  // EngineConfig::speculative_draft_vocab
  bool lookup = true;       // EngineConfig::speculative_lookup
  int32_t n_gen = 128;
  int32_t reps = 3;
  int32_t threads = 0;
  bool always = false;  // draft every step (no cost model)
  bool json = false;
  KvEngineOptions kv;
};

// Prints the table (or JSON) and returns the process exit code.
[[nodiscard]] int run_spec_bench(const SpecBenchOptions& o);

}  // namespace bie::cli
