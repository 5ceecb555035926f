#include "engine/model_runner.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <deque>
#include <vector>

#include "bie/engine/synthetic_kv.h"
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
    int64_t computed = s.computed, n_tokens = sc.n_tokens;
    if (sc.n_draft == 0 && computed < s.synthetic_prefix) {
      // Measurements: the chunk's tokens inside the synthetic prefix get synthetic K/V, written
      // as a pass would write them (then its window exits); the rest of the chunk runs.
      const int64_t n_syn = std::min(n_tokens, s.synthetic_prefix - computed);
      SequenceKv view(*s.store, s.id, computed, max_model_len_);
      if (Status st = view.append(n_syn); !st) return Error{st.error()};
      if (!synthetic_)
        synthetic_ = std::make_unique<SyntheticKv>(view.geometry(), SyntheticKvOptions{});
      synthetic_->store(view, computed, n_syn);
      view.finish_pass();
      computed += n_syn;
      n_tokens -= n_syn;
      if (n_tokens == 0) continue;  // never the chunk that samples: the last prompt token runs
    }
    views.emplace_back(*s.store, s.id, computed, max_model_len_, sc.n_draft == 0);
    BatchSequence b;
    if (sc.n_draft > 0) {  // the decode token and its drafts, contiguous
      verify_tokens.emplace_back();
      std::vector<int32_t>& v = verify_tokens.back();
      v.push_back(s.tokens.back());
      v.insert(v.end(), s.draft.begin(), s.draft.begin() + sc.n_draft);
      b.tokens = v;
    } else {
      b.tokens = std::span<const int32_t>(s.tokens).subspan(static_cast<size_t>(computed),
                                                            static_cast<size_t>(n_tokens));
    }
    b.kv = &views.back();
    b.logits = sc.n_draft > 0 || wants_prompt_rows(sc) ? BatchSequence::Logits::kAll
               : sc.sample                                ? BatchSequence::Logits::kLast
                                                          : BatchSequence::Logits::kNone;
    b.decode_from = std::max<int64_t>(0, s.n_prompt - computed);
    if (probe) b.attn_entropy = probe(sc);
    batch.push_back(b);
    if (computed < s.n_prompt)
      m.computed_prompt_tokens += std::min(n_tokens, s.n_prompt - computed);
  }
  ++m.steps;
  m.batched_tokens += out.n_tokens();
  m.batched_seqs += static_cast<int64_t>(out.scheduled.size());
  if (batch.empty()) return ro;  // every chunk was synthetic: no pass, no logits
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
