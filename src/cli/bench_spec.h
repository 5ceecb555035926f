// bie bench --speculative: greedy generation through the Engine with and without a drafter, on
// built-in input-grounded tasks (the answer copies text from the prompt) and open chat.
#pragma once

#include <cstdint>
#include <string>

#include "bie/engine/kv_setup.h"

namespace bie::cli {

struct SpecBenchOptions {
  std::string model = "default";
  std::string drafter;  // "ngram", or a draft model GGUF path ("default" allowed)
  int32_t draft_tokens = 3;
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
