// The speculative policy: how many drafts each decoding sequence proposes in a step (the cost
// model of best_draft_len over measured step times, the first exploring steps, re-probes), and
// the acceptance tracking that steers it (accept rate, adaptive γ). Owns the step-time table;
// the drafter is the engine's. Not thread-safe (engine thread).
#pragma once

#include <array>
#include <cstdint>

#include "bie/engine/drafter.h"
#include "bie/engine/engine.h"
#include "bie/engine/scheduler.h"
#include "engine/request.h"

namespace bie {

constexpr int32_t kMaxDraftTokens = 15;
// Verify tokens one step may carry across all speculating sequences: one pass of the 4-token
// matrix-vector kernels (docs/serving.md §5: each further pass costs about what drafts save).
constexpr int64_t kMaxVerifyTokens = 4;
// Decode steps after which a request that stopped drafting proposes again once.
constexpr int32_t kReprobeSteps = 16;
// Speculative steps a request always drafts in before its acceptance rate steers it.
constexpr int32_t kExploreSteps = 4;

struct SpeculativeConfig {
  int32_t draft_tokens = 0;  // --speculative-draft-tokens: the most drafts per step (γ)
  bool adaptive = false;     // shrink γ after rejections, grow it after acceptances
  bool always = false;       // draft every step (up to the verify cap), no cost model

  [[nodiscard]] static SpeculativeConfig from(const EngineConfig& cfg) {
    return {cfg.speculative_draft_tokens, cfg.speculative_adaptive, cfg.speculative_always};
  }
};

class SpeculativePolicy {
 public:
  // lookup: a free drafter (prompt lookup) consulted before a costly one (a draft model), or
  // null. Its proposal is verified where it is worth more than what the drafter would cost.
  SpeculativePolicy(const SpeculativeConfig& cfg, Drafter& drafter, int64_t max_model_len,
                    Drafter* lookup = nullptr)
      : cfg_(cfg), drafter_(drafter), lookup_(lookup), max_model_len_(max_model_len) {}

  // Proposes drafts (into Sequence::draft) for running sequences that are decoding.
  void draft(Scheduler& sched, RequestMap& reqs, EngineMetrics& m);
  // A forward pass of n_tokens took ms: decode-only passes feed the cost model.
  void record_step(bool decode_only, int64_t n_tokens, double ms);
  // r verified n_draft drafts and accepted the first `accepted`: its acceptance rate, γ and the
  // counters.
  void record_verify(Request& r, int64_t n_draft, int64_t accepted, EngineMetrics& m) const;

 private:
  // Drafts worth proposing for a request in a step with `base` decode tokens: the g that
  // maximises expected tokens per unit of step cost.
  [[nodiscard]] int best_draft_len(double accept_rate, int64_t base, int64_t cap) const;

  // Proposes lookup_'s drafts for s when they are worth more than the drafter's expected value
  // `rival` (tokens per unit of step cost); true when it did.
  bool propose_lookup(Sequence& s, Request& r, int64_t base, int64_t cap, double rival);

  SpeculativeConfig cfg_;
  Drafter& drafter_;
  Drafter* lookup_ = nullptr;
  int64_t max_model_len_ = 0;
  // Measured cost of decode-only forward passes by token count (EMA, ms; 0: not seen yet).
  std::array<double, kMaxVerifyTokens + 1> step_ms_{};
};

}  // namespace bie
