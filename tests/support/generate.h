// Single-sequence generation on one KvCache: prompt prefill in chunks (matrix-matrix), then one
// token per step. A test reference only: every command, the server and the SDK generate through
// the Engine; the golden and cache tests drive a model on one cache directly with this.
// Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "bie/backend/backend.h"
#include "bie/common/result.h"
#include "bie/kv/kv_cache.h"
#include "bie/model/model.h"
#include "bie/sampling/sampler.h"

namespace bie {

struct GenerateRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int32_t max_tokens = 128;
  std::vector<int32_t> stop_tokens;  // end-of-generation ids (EOS, EOT); not emitted
  int32_t prefill_chunk = 512;       // tokens per prefill forward
  // Chunk boundaries fall on multiples of this (the paged cache's block size; 1: anywhere), so a
  // chunk never starts inside a block it pushes out of the FP16 window (see PagedKvCache).
  int32_t prefill_align = 1;
};

// Tokens of the next prefill forward at cache position `pos` with `remaining` prompt tokens left:
// up to `chunk`; a chunk that starts inside an `align`-token block ends at that block's end; a
// chunk that is not the last ends on a block boundary when it can.
[[nodiscard]] int64_t prefill_chunk_len(int64_t pos, int64_t remaining, int64_t chunk,
                                        int64_t align);

// Runs `prompt` through `model` into `kv` in forwards cut by prefill_chunk_len(chunk, align);
// `logits` holds the last token's logits afterwards. Errors on an empty prompt or one that does
// not fit in the cache.
// `path`: the matmul kernels (kPrefill for prompts; kDecode to time decode steps).
[[nodiscard]] Status prefill(Model& model, KvCache& kv, Backend& backend,
                             std::span<const int32_t> prompt, int64_t chunk, int64_t align,
                             std::vector<float>& logits, MatmulPath path = MatmulPath::kPrefill);

// model.forward() with its logits copied into `logits` (for callers that keep them past the
// model's next pass).
[[nodiscard]] Status forward_into(Model& model, std::span<const int32_t> tokens, KvCache& kv,
                                  Backend& backend, std::vector<float>& logits,
                                  ForwardOptions opts = {});

struct GenerationStats {
  int64_t n_prompt = 0;
  int64_t n_generated = 0;
  double prompt_seconds = 0.0;  // prefill, including the first token's logits
  double decode_seconds = 0.0;  // every later forward + sampling
  std::string finish_reason;    // "stop", "length", "context" or "cancelled"

  [[nodiscard]] double prompt_tps() const {
    return prompt_seconds > 0 ? n_prompt / prompt_seconds : 0.0;
  }
  [[nodiscard]] double decode_tps() const {
    // The first token comes out of the prefill; decode speed counts the forwards after it.
    return decode_seconds > 0 && n_generated > 1 ? (n_generated - 1) / decode_seconds : 0.0;
  }
};

// Called with each generated token; return false to stop.
using TokenCallback = std::function<bool(int32_t token)>;

// Runs the prompt through `model` (appending to `kv`, which should be empty or hold a prefix of
// it — no reuse is attempted here) and samples up to max_tokens tokens.
[[nodiscard]] Result<GenerationStats> generate(Model& model, KvCache& kv, Backend& backend,
                                               const GenerateRequest& req,
                                               const TokenCallback& on_token);

// Runs `prompt` and returns the logits after it (n_vocab floats). Helper for golden tests.
[[nodiscard]] Result<std::vector<float>> prompt_logits(Model& model, KvCache& kv, Backend& backend,
                                                       const std::vector<int32_t>& prompt,
                                                       int32_t prefill_chunk = 512,
                                                       int32_t prefill_align = 1);

}  // namespace bie
