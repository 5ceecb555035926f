#include "engine/speculative_policy.h"

#include <algorithm>
#include <vector>

namespace bie {

void SpeculativePolicy::draft(Scheduler& sched, RequestMap& reqs, EngineMetrics& m) {
  std::vector<Sequence*> decoding;
  for (const kv::SeqId id : sched.running()) {
    Sequence* s = sched.find(id);
    if (s != nullptr && s->decoding()) decoding.push_back(s);
  }
  if (decoding.empty()) return;
  const int64_t per_seq = kMaxVerifyTokens / static_cast<int64_t>(decoding.size()) - 1;
  if (per_seq < 1) return;
  const auto t0 = Clock::now();
  const auto base = static_cast<int64_t>(decoding.size());
  for (Sequence* s : decoding) {
    Request& r = *reqs.at(s->id);
    r.lookup_drafted = false;
    // Never draft past the request's last token or the context.
    const int64_t room =
        std::min<int64_t>(r.max_tokens - s->n_generated(),
                          max_model_len_ - static_cast<int64_t>(s->tokens.size())) -
        1;
    const int64_t cap = std::min<int64_t>({per_seq, r.gamma, room});
    if (cap < 1) continue;
    // The first few speculative steps of a request draft in full to measure the acceptance, unless
    // drafting has a measured cost (a draft model): then the cost model decides from the start
    // (with the prior acceptance) and re-probes now and then.
    const bool exploring = cfg_.always || (r.spec_steps < kExploreSteps &&
                                           drafter_.seconds_per_token() <= 0);
    const DraftChoice pick = best_draft(r.accept_rate, base, cap, step_ms_,
                                        drafter_.seconds_per_token());
    // Free drafts in hand go first where they are worth more than the drafter's best choice and
    // than no drafts at all.
    if (lookup_ != nullptr && propose_lookup(*s, r, base, cap, std::max(pick.value, 1.02))) {
      if (r.grammar) r.grammar->trim_drafts(s->draft);
      continue;
    }
    // Drafts that cannot pay even when all are accepted (a draft model about as slow as the
    // target) are not tried at all.
    if (!cfg_.always && best_draft_len(1.0, base, cap) == 0) continue;
    int n = exploring ? static_cast<int>(cap) : pick.len;
    // A request that stopped drafting tries again now and then: its text may turn repetitive.
    if (n == 0 && ++r.undrafted >= kReprobeSteps) n = static_cast<int>(cap);
    if (n < 1) continue;
    r.undrafted = 0;
    drafter_.propose(s->id, s->tokens, n, s->draft);
    if (r.grammar) r.grammar->trim_drafts(s->draft);  // never verify what the grammar rejects
  }
  m.drafter_seconds += seconds(t0, Clock::now());
}

bool SpeculativePolicy::propose_lookup(Sequence& s, Request& r, int64_t base, int64_t cap,
                                       double rival) {
  lookup_->propose(s.id, s.tokens, static_cast<int>(cap), s.draft);
  if (s.draft.empty()) return false;
  const double rate = r.lookup_steps < kExploreSteps ? std::max(r.lookup_rate, 0.5) : r.lookup_rate;
  if (!cfg_.always &&
      free_draft_value(rate, base, static_cast<int64_t>(s.draft.size()), step_ms_) <= rival) {
    s.draft.clear();
    return false;
  }
  r.lookup_drafted = true;
  return true;
}

int SpeculativePolicy::best_draft_len(double accept_rate, int64_t base, int64_t cap) const {
  return bie::best_draft_len(accept_rate, base, cap, step_ms_, drafter_.seconds_per_token());
}

void SpeculativePolicy::record_step(bool decode_only, int64_t n_tokens, double ms) {
  // Cost of decode-only steps by token count, for best_draft_len.
  if (decode_only && n_tokens <= kMaxVerifyTokens) {
    double& e = step_ms_[static_cast<size_t>(n_tokens)];
    e = e > 0 ? 0.8 * e + 0.2 * ms : ms;
  }
}

void SpeculativePolicy::record_verify(Request& r, int64_t n_draft, int64_t accepted,
                                      EngineMetrics& m) const {
  r.draft_tokens += n_draft;
  r.accepted_tokens += accepted;
  const double share = static_cast<double>(accepted) / static_cast<double>(n_draft);
  if (r.lookup_drafted) {
    ++r.lookup_steps;
    r.lookup_rate = 0.7 * r.lookup_rate + 0.3 * share;
  } else {
    ++r.spec_steps;
    r.accept_rate = 0.7 * r.accept_rate + 0.3 * share;
  }
  ++m.spec_steps;
  m.draft_tokens += n_draft;
  m.accepted_tokens += accepted;
  if (cfg_.adaptive) {
    r.gamma = accepted == n_draft ? std::min(r.gamma + 1, cfg_.draft_tokens)
                                  : std::max<int32_t>(1, static_cast<int32_t>(accepted) + 1);
  }
}

}  // namespace bie
