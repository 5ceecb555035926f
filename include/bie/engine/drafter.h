// Drafters for speculative decoding: propose up to γ tokens that the target model then verifies
// in one forward pass (Sampler::verify). NgramDrafter is prompt-lookup decoding: it finds the
// most recent earlier occurrence of the sequence's last n tokens (n from n_max down to n_min) in
// the prompt and generated text and proposes the tokens that followed it. It needs no model and
// proposes nothing when nothing matches, so open-ended text costs almost nothing. Deterministic
// (q = one-hot). One per engine; not thread-safe.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace bie {

class Drafter {
 public:
  virtual ~Drafter() = default;
  // Appends up to max_tokens proposals for what follows `tokens` (all of sequence seq's tokens)
  // to `out` (cleared first).
  virtual void propose(int64_t seq, std::span<const int32_t> tokens, int max_tokens,
                       std::vector<int32_t>& out) = 0;
  // Sequence seq ended: drop whatever the drafter keeps for it.
  virtual void release(int64_t /*seq*/) {}
  // Measured cost of proposing one more token (the engine's cost model weighs it against the
  // target's step time); 0 for drafters that cost next to nothing.
  [[nodiscard]] virtual double seconds_per_token() const { return 0.0; }
};

class NgramDrafter final : public Drafter {
 public:
  // note: 1 <= n_min <= n_max
  NgramDrafter(int n_max, int n_min) : n_max_(n_max), n_min_(n_min) {}
  void propose(int64_t seq, std::span<const int32_t> tokens, int max_tokens,
               std::vector<int32_t>& out) override;

 private:
  int n_max_;
  int n_min_;
};

// The speculation cost model: how many drafts (0..cap) a sequence should propose in a step with
// `base` decode tokens, maximising expected tokens per unit of step time:
//   (1 + a(1 - a^g)/(1 - a)) / (cost(base + g) + g * drafter_cost)
// with a the acceptance rate, cost(n) = step_ms[n] / step_ms[base] (measured decode-only forward
// passes of n tokens; 0 = unseen: interpolated between measured sizes around n, else +44 % per
// extra token, SmolLM2-135M on 2 AVX2 cores) and
// drafter_cost = draft_seconds_per_token / (a base step's seconds). 0 unless the best g gains at
// least 2 % over not drafting.
[[nodiscard]] int best_draft_len(double accept_rate, int64_t base, int64_t cap,
                                 std::span<const double> step_ms, double draft_seconds_per_token);

// The cost model's choice with its worth: `len` drafts (0..cap, as best_draft_len) and the
// expected tokens per unit of base-step cost they give (1 for no drafts).
struct DraftChoice {
  int len = 0;
  double value = 1.0;
};
[[nodiscard]] DraftChoice best_draft(double accept_rate, int64_t base, int64_t cap,
                                     std::span<const double> step_ms,
                                     double draft_seconds_per_token);
// The worth of verifying exactly `len` drafts proposed at no cost (a prompt-lookup proposal in
// hand), on the same scale.
[[nodiscard]] double free_draft_value(double accept_rate, int64_t base, int64_t len,
                                      std::span<const double> step_ms);

}  // namespace bie
