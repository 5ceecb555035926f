// Sequence: one request's token state as the scheduler sees it — plain data. Tracked only by
// counts (vLLM v1 style): `tokens` is prompt + generated, `computed` the tokens whose K/V are in
// the cache; a prefill chunk, a prefix-cache hit, a decode step and a recompute after preemption
// are all just differences between the two. The engine owns the rest of a request (sampler,
// detokenizer, callbacks) next to it.
#pragma once
#include <cstdint>
#include <vector>

#include "bie/kv/seq_id.h"

namespace bie {

class PagedKvStore;

enum class SeqStatus : uint8_t { kWaiting, kRunning, kFinished };

struct Sequence {
  kv::SeqId id = 0;
  uint64_t arrival = 0;         // FCFS order
  std::vector<int32_t> tokens;  // prompt + generated
  int64_t n_prompt = 0;
  int64_t computed = 0;       // tokens whose K/V are stored (and verified)
  int64_t cached_tokens = 0;  // prompt tokens the prefix cache served at first admission
  int64_t preemptions = 0;
  std::vector<int32_t> draft;     // speculative proposals for after tokens (this step only)
  PagedKvStore* store = nullptr;  // the KV regime's store holding its blocks
  // Choices still to fork from this sequence once its prompt is computed (n > 1); admission
  // counts them as running.
  int32_t forks = 0;
  // Leading prompt tokens whose K/V the model runner writes as synthetic values instead of
  // computing them (EngineRequest::synthetic_kv_prefix; measurements only).
  int64_t synthetic_prefix = 0;
  // The next prompt position whose logits the request is given (EngineRequest::on_prompt_logits;
  // the output processor moves it on, so a recompute after a preemption gives none twice); a
  // pass returns every row of a chunk that reaches it. -1: none, a pass returns the sampling
  // rows only.
  int64_t prompt_logits_from = -1;
  SeqStatus status = SeqStatus::kWaiting;
  [[nodiscard]] int64_t n_generated() const {
    return static_cast<int64_t>(tokens.size()) - n_prompt;
  }
  // Prompt tokens are still to be computed (prefill), or being recomputed after a preemption.
  [[nodiscard]] bool in_prompt() const { return computed < n_prompt; }
  // Every known token is computed but the last sampled one: the next step is a decode step.
  [[nodiscard]] bool decoding() const {
    return computed + 1 == static_cast<int64_t>(tokens.size());
  }
};

}  // namespace bie
