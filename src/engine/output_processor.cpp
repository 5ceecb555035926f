#include "engine/output_processor.h"

#include <algorithm>
#include <cassert>

#include "bie/sampling/sampler.h"

namespace bie {

void OutputProcessor::process(const std::vector<ScheduledSeq>& scheduled, std::span<float> logits) {
  const auto n_vocab = static_cast<size_t>(d_.n_vocab);
  size_t row = 0;
  for (const ScheduledSeq& sc : scheduled) {
    float* rows = logits.data() + row * n_vocab;
    const auto n_rows = static_cast<size_t>(logits_rows(sc));
    row += n_rows;
    if (wants_prompt_rows(sc)) {
      give_prompt_rows(sc, rows);
      rows += (n_rows - 1) * n_vocab;  // the chunk's last row: the one it samples from
    }
    if (!sc.sample) {
      if (Status st = d_.sched->commit(sc, sc.n_tokens); !st) {
        finish(*d_.reqs->at(sc.seq->id), "error", st.error());
      }
      continue;
    }
    sample(sc, rows);
  }
}

void OutputProcessor::give_prompt_rows(const ScheduledSeq& sc, const float* rows) {
  Sequence& s = *sc.seq;
  const Request& r = *d_.reqs->at(s.id);
  const auto n_vocab = static_cast<size_t>(d_.n_vocab);
  // Row i holds the logits at position s.computed + i; prompt positions only, each once.
  const int64_t end = std::min(s.computed + sc.n_tokens, s.n_prompt);
  assert(s.prompt_logits_from >= s.computed);  // every position is computed (no prefix hits)
  for (; s.prompt_logits_from < end; ++s.prompt_logits_from) {
    const int64_t p = s.prompt_logits_from;
    const float* row = rows + static_cast<size_t>(p - s.computed) * n_vocab;
    r.req.on_prompt_logits(p, std::span<const float>(row, n_vocab));
  }
}

void OutputProcessor::sample(const ScheduledSeq& sc, float* logits) {
  Sequence& s = *sc.seq;
  Request& r = *d_.reqs->at(s.id);
  const auto n_vocab = static_cast<size_t>(d_.n_vocab);
  const bool want_raw = r.req.logprobs >= 0;
  TokenConstraint* gc = r.grammar ? r.grammar->constraint() : nullptr;
  if (sc.n_draft == 0) {
    if (r.forks_pending > 0) fork_row_.assign(logits, logits + n_vocab);
    if (want_raw) raw_.assign(logits, logits + n_vocab);
    const int32_t tok = r.sampler->sample(logits, s.tokens, gc);
    if (Status st = d_.sched->commit(sc, sc.n_tokens); !st) {
      finish(r, "error", st.error());
      return;
    }
    if (r.forks_pending > 0) {
      if (!fork_choices(r, fork_row_.data())) return;
      if (want_raw) raw_.assign(fork_row_.begin(), fork_row_.end());
    }
    if (!grammar_accept(r, tok)) return;
    (void)emit(r, s, tok, want_raw ? raw_.data() : nullptr);
    return;
  }
  // Verify drafts in order: row i holds the logits after the decode token and i drafts
  // (s.draft stays as scheduled until commit below). With a grammar, row i is masked with the
  // state after the i accepted drafts: each verified token advances it before the next row.
  int64_t accepted = 0;
  std::vector<int32_t> out_tokens;
  std::vector<std::vector<float>> out_raw;
  std::vector<int32_t> history = s.tokens;
  for (int64_t i = 0; i <= sc.n_draft; ++i) {
    float* row = logits + static_cast<size_t>(i) * n_vocab;
    if (want_raw) out_raw.emplace_back(row, row + n_vocab);
    if (i == sc.n_draft) {  // every draft accepted: the bonus token
      out_tokens.push_back(r.sampler->sample(row, history, gc));
      if (!grammar_accept(r, out_tokens.back())) return;
      break;
    }
    const DraftVerdict v =
        r.sampler->verify(row, history, s.draft[static_cast<size_t>(i)], nullptr, gc);
    if (!grammar_accept(r, v.token)) return;
    out_tokens.push_back(v.token);
    history.push_back(v.token);
    if (!v.accepted) break;
    ++accepted;
  }
  d_.spec->record_verify(r, sc.n_draft, accepted, *d_.metrics);
  if (Status st = d_.sched->commit(sc, sc.n_tokens + accepted); !st) {
    finish(r, "error", st.error());
    return;
  }
  // Accepted drafts first (their K/V was computed in this pass), then the target's own token.
  for (size_t i = 0; i < out_tokens.size(); ++i) {
    if (!emit(r, s, out_tokens[i], want_raw ? out_raw[i].data() : nullptr)) return;
  }
}

bool OutputProcessor::fork_choices(Request& r, const float* row) {
  const auto n_vocab = static_cast<size_t>(d_.n_vocab);
  const bool want_raw = r.req.logprobs >= 0;
  std::vector<float> logits;
  for (int32_t i = 1; i < r.req.n; ++i) {
    const kv::SeqId sid = r.sid + static_cast<kv::SeqId>(i);
    if (Status st = d_.sched->fork(r.sid, sid); !st) {
      finish(r, "error", st.error());  // also finishes the choices not forked yet
      return false;
    }
    --r.forks_pending;
    auto c = std::make_unique<Request>();
    c->rid = r.rid;
    c->sid = sid;
    c->index = i;
    c->req = r.req;
    c->req.on_prompt_logits = nullptr;  // the prompt's rows went to choice 0
    c->req.sampling.seed = r.req.sampling.seed + static_cast<uint64_t>(i);
    c->cb = r.cb;
    c->max_tokens = r.max_tokens;
    c->regime = r.regime;
    c->attn_entropy = r.attn_entropy;
    c->kv_fallback = r.kv_fallback;
    c->submitted = r.submitted;
    c->first_scheduled = r.first_scheduled;
    c->scheduled_once = r.scheduled_once;
    c->gamma = r.gamma;
    c->sampler = std::make_unique<Sampler>(c->req.sampling, d_.n_vocab);
    c->decoder = std::make_unique<tokenizer::StreamDecoder>(*d_.tok);
    c->stops = std::make_unique<StopStrings>(c->req.stop);
    if (r.grammar) c->grammar = r.grammar->fork();  // the state before the first token
    Request& child = *c;
    d_.reqs->emplace(sid, std::move(c));
    Sequence& s = *d_.sched->find(sid);
    s.prompt_logits_from = -1;
    logits.assign(row, row + n_vocab);
    if (want_raw) raw_.assign(row, row + n_vocab);
    const int32_t tok = child.sampler->sample(
        logits.data(), s.tokens, child.grammar ? child.grammar->constraint() : nullptr);
    if (!grammar_accept(child, tok)) continue;
    (void)emit(child, s, tok, want_raw ? raw_.data() : nullptr);
  }
  return true;
}

bool OutputProcessor::grammar_accept(Request& r, int32_t tok) {
  if (!r.grammar) return true;
  if (tok != Sampler::kNoConstrainedToken && r.grammar->accept(tok)) return true;
  finish(r, "error", "structured output: no token of the vocabulary can continue the grammar");
  return false;
}

bool OutputProcessor::emit(Request& r, Sequence& s, int32_t tok, float* raw) {
  TokenEvent ev;
  ev.index = r.index;
  ev.token = tok;
  const int32_t n_vocab = d_.n_vocab;
  if (raw != nullptr) {  // a copy of the row's raw logits: turned into log-probabilities here
    log_softmax_inplace(raw, n_vocab);
    ev.logprob = raw[tok];
    const auto k = static_cast<size_t>(r.req.logprobs);
    if (k > 0) {
      std::vector<int32_t> idx(static_cast<size_t>(n_vocab));
      for (int32_t i = 0; i < n_vocab; ++i) idx[static_cast<size_t>(i)] = i;
      std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(),
                        [&](int32_t a, int32_t b) { return raw[a] > raw[b]; });
      for (size_t i = 0; i < k; ++i) ev.top.push_back({idx[i], raw[idx[i]]});
    }
  }
  if (!r.got_token) {
    r.got_token = true;
    r.first_token = Clock::now();
    ev.kv_regime = d_.hooks->regime_label(r.regime);
  }
  if (d_.tok->is_eog(tok) && !r.req.ignore_eos) {
    finish(r, "stop");
    return false;
  }
  ev.text = r.stops->push(r.decoder->push(tok));
  d_.sched->append_token(s.id, tok);
  ++d_.metrics->generated_tokens;
  const bool keep = !r.cb.on_token || r.cb.on_token(ev);
  if (!keep) {
    finish(r, "cancelled");
  } else if (r.stops->stopped()) {
    finish(r, "stop");
  } else if (s.n_generated() >= r.max_tokens ||
             static_cast<int64_t>(s.tokens.size()) >= d_.max_model_len) {
    finish(r, "length");
  } else {
    return true;
  }
  return false;
}

void OutputProcessor::finish(Request& r, const std::string& reason, const std::string& error) {
  FinishEvent fe;
  fe.index = r.index;
  fe.finish_reason = reason;
  fe.error = error;
  if (reason == "stop" || reason == "length") {
    fe.tail_text = r.stops->push(r.decoder->flush());
    fe.tail_text += r.stops->flush();
  }
  const auto now = Clock::now();
  RequestMetrics& m = fe.metrics;
  m.prompt_tokens = static_cast<int64_t>(r.req.prompt.size());
  if (const Sequence* s = d_.sched->find(r.sid)) {
    m.cached_tokens = std::max<int64_t>(s->cached_tokens, 0);
    m.generated_tokens = s->n_generated();
    m.preemptions = s->preemptions;
  }
  m.queue_seconds =
      r.scheduled_once ? seconds(r.submitted, r.first_scheduled) : seconds(r.submitted, now);
  m.ttft_seconds = r.got_token ? seconds(r.submitted, r.first_token) : 0.0;
  m.total_seconds = seconds(r.submitted, now);
  m.kv_regime = d_.hooks->regime_label(r.regime);
  m.draft_tokens = r.draft_tokens;
  m.accepted_tokens = r.accepted_tokens;
  m.attn_entropy = r.attn_entropy;
  m.kv_fallback = r.kv_fallback;
  if (d_.sched->find(r.sid) != nullptr) (void)d_.sched->finish(r.sid);
  if (d_.drafter != nullptr) d_.drafter->release(r.sid);
  // Choices that never forked (choice 0 ended before its prompt was computed) end with it.
  const int32_t ending = 1 + r.forks_pending;
  const bool last = d_.hooks->retire(r.rid, ending);
  if (last) ++d_.metrics->requests_finished;
  auto cb = std::move(r.cb.on_finish);
  const kv::SeqId sid = r.sid;
  const int32_t first_unforked = r.req.n - r.forks_pending;  // choices fork in index order
  d_.reqs->erase(sid);                                       // r is gone from here on
  d_.hooks->publish_metrics();  // gauges read in on_finish already show this request gone
  if (cb) {
    cb(fe);
    for (int32_t i = first_unforked; i < first_unforked + ending - 1; ++i) {
      FinishEvent other = fe;
      other.index = i;
      other.tail_text.clear();
      other.metrics.generated_tokens = 0;
      cb(other);
    }
  }
}

}  // namespace bie
