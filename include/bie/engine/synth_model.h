// Synthetic models of real geometry (`bie synth`): a llama-family GGUF with the exact tensor names,
// shapes and types a model of the given geometry has, random weights of realistic scale (std ~0.02
// for matrices, 1 for norms) and a real tokenizer copied from another GGUF (its token list padded
// with unused placeholder tokens up to the geometry's vocabulary, so shapes stay exact). The file
// says it is synthetic (general.name, bie.synthetic = true): for memory and speed measurements,
// never quality. Streams the file; pure function apart from the file it writes; thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "bie/common/result.h"
#include "bie/planner/model_geometry.h"

namespace bie {

struct SynthOptions {
  planner::ModelGeometry geometry;  // dense, global-attention llama family (no MoE/MLA/SWA)
  std::string label;                // "llama-3-8b": recorded in the metadata and general.name
  std::string weights = "Q4_K";     // matrix type: Q4_K or Q8_0 (norms are f32)
  std::string tokenizer_from;       // GGUF whose tokenizer.* metadata is copied ("": none)
  float rope_freq_base = 500000.0f;
  float weight_std = 0.02f;
  uint64_t seed = 1;
  // Called after each written chunk with bytes written so far and the file's size.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

struct SynthResult {
  uint64_t file_bytes = 0;
  uint64_t weight_bytes = 0;  // tensor data
  int64_t n_tensors = 0;
  int64_t tokenizer_tokens = 0;  // real tokens copied (0: no tokenizer)
  int64_t placeholder_tokens = 0;
};

// Metadata keys that mark a synthetic file.
inline constexpr const char* kSyntheticKey = "bie.synthetic";

[[nodiscard]] Result<SynthResult> write_synthetic_model(const std::string& path,
                                                        const SynthOptions& opts);

}  // namespace bie
