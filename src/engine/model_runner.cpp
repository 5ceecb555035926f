#include "engine/model_runner.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <deque>
#include <vector>

#include "bie/kv/sequence_kv.h"

namespace bie {

Status ModelRunner::prepare_kv(const SchedulerOutput& out) {
  for (const StoreWork& w : out.kv_work) {
    if (Status st = w.store->execute(w.work); !st) return st;
  }
  return {};
}

Result<RunOutput> ModelRunner::run(SchedulerOutput& out, EngineMetrics& m,
                                   const EntropyProbe& probe) {
  assert(!out.scheduled.empty());
  // Decode chunks first: their rows form one run of matrix-vector kernels.
  const auto first_prefill =
      std::stable_partition(out.scheduled.begin(), out.scheduled.end(),
                            [](const ScheduledSeq& sc) { return !sc.seq->in_prompt(); });
  RunOutput ro;
  ro.decode_only = first_prefill == out.scheduled.end();
  std::vector<SequenceKv> views;
  std::vector<BatchSequence> batch;
  std::deque<std::vector<int32_t>> verify_tokens;  // stable addresses
  views.reserve(out.scheduled.size());
  batch.reserve(out.scheduled.size());
  for (const ScheduledSeq& sc : out.scheduled) {
    Sequence& s = *sc.seq;
    views.emplace_back(*s.store, s.id, s.computed, max_model_len_, sc.n_draft == 0);
    BatchSequence b;
    if (sc.n_draft > 0) {  // the decode token and its drafts, contiguous
      verify_tokens.emplace_back();
      std::vector<int32_t>& v = verify_tokens.back();
      v.push_back(s.tokens.back());
      v.insert(v.end(), s.draft.begin(), s.draft.begin() + sc.n_draft);
      b.tokens = v;
    } else {
      b.tokens = std::span<const int32_t>(s.tokens).subspan(static_cast<size_t>(s.computed),
                                                            static_cast<size_t>(sc.n_tokens));
    }
    b.kv = &views.back();
    b.logits = sc.n_draft > 0 ? BatchSequence::Logits::kAll
               : sc.sample    ? BatchSequence::Logits::kLast
                              : BatchSequence::Logits::kNone;
    b.decode_from = std::max<int64_t>(0, s.n_prompt - s.computed);
    if (probe) b.attn_entropy = probe(sc);
    batch.push_back(b);
    if (s.in_prompt()) {
      m.computed_prompt_tokens += std::min(sc.n_tokens, s.n_prompt - s.computed);
    }
  }
  ++m.steps;
  m.batched_tokens += out.n_tokens();
  m.batched_seqs += static_cast<int64_t>(out.scheduled.size());
  const auto fwd0 = std::chrono::steady_clock::now();
  auto fwd = model_.forward_batch(batch, backend_);
  if (!fwd) return Error{fwd.error()};
  // Block state changes after the pass, here: window exits and sliding-window drops of every
  // sequence whose pass held no draft tokens (SequenceKv::finish_pass).
  for (SequenceKv& v : views) v.finish_pass();
  ro.forward_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - fwd0).count();
  ro.logits = *fwd;
  return ro;
}

}  // namespace bie
