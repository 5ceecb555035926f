// The model runner: executes the KV data work the scheduler's block decisions imply, turns one
// step's scheduled sequences into the model's batch (a SequenceKv view per sequence, its tokens:
// a prompt chunk, a decode token, or a decode token and its drafts to verify) and runs the
// forward pass. Holds no state between steps but the synthetic K/V source of
// EngineRequest::synthetic_kv_prefix. Not thread-safe (engine thread).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "bie/backend/backend.h"
#include "bie/common/result.h"
#include "bie/engine/engine.h"
#include "bie/engine/scheduler.h"
#include "bie/engine/synthetic_kv.h"
#include "bie/model/model.h"

namespace bie {

struct RunOutput {
  // The pass's logits (the model's memory, valid until the next pass): one row per sequence
  // that samples, 1 + n_draft rows for one that verifies drafts, in the scheduled order.
  std::span<float> logits;
  bool decode_only = false;  // every scheduled sequence was decoding
  double forward_ms = 0;     // the forward pass's wall time
};

// Whether sc's chunk runs prompt positions whose logits its request has still to be given
// (Sequence::prompt_logits_from): the pass then returns a row for every token of the chunk.
[[nodiscard]] inline bool wants_prompt_rows(const ScheduledSeq& sc) {
  const Sequence& s = *sc.seq;
  return sc.n_draft == 0 && s.prompt_logits_from >= 0 && s.prompt_logits_from < s.n_prompt &&
         s.computed + sc.n_tokens > s.prompt_logits_from;
}
// The logits rows a pass returns for sc, in the scheduled order: one per token of a chunk that
// wants its prompt rows, else 1 + n_draft when it samples (the last row is the one it samples
// from), else none.
[[nodiscard]] inline int64_t logits_rows(const ScheduledSeq& sc) {
  if (wants_prompt_rows(sc)) return sc.n_tokens;
  return sc.sample ? 1 + sc.n_draft : 0;
}

// Where a scheduled sequence's attention entropy is measured this pass
// (BatchSequence::attn_entropy, [n_layer * n_head]); empty: not measured.
using EntropyProbe = std::function<std::span<attention::HeadEntropy>(const ScheduledSeq&)>;

class ModelRunner {
 public:
  ModelRunner(Model& model, Backend& backend, int64_t max_model_len)
      : model_(model), backend_(backend), max_model_len_(max_model_len) {}

  // Executes the KV data work of the step's block decisions (out.kv_work: copy-on-write copies,
  // window exits) on each store, in decision order. Call it after every schedule(), before run()
  // and also when nothing was scheduled.
  [[nodiscard]] static Status prepare_kv(const SchedulerOutput& out);
  // Puts decode chunks first in out.scheduled (their rows form one run of matrix-vector
  // kernels), then builds the batch and runs it; counts the step in m. `probe` (if set) names
  // the sequences whose last token's attention entropy the pass measures.
  // note: call only with a non-empty out.scheduled, after prepare_kv(out).
  [[nodiscard]] Result<RunOutput> run(SchedulerOutput& out, EngineMetrics& m,
                                      const EntropyProbe& probe = {});

 private:
  Model& model_;
  Backend& backend_;
  int64_t max_model_len_ = 0;
  std::unique_ptr<SyntheticKv> synthetic_;  // made on first use
};

}  // namespace bie
