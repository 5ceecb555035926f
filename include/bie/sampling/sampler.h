// Sampler: turns a row of logits into a token id. Greedy when temperature <= 0; otherwise the
// llama.cpp default chain: penalties -> top-k -> top-p -> min-p -> temperature -> draw.
// One Sampler per sequence (it owns that sequence's RNG); not thread-safe.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "bie/common/result.h"
#include "bie/sampling/token_constraint.h"

namespace bie {

struct SamplingParams {
  float temperature = 0.8f;         // <= 0: greedy
  int32_t top_k = 40;               // <= 0: off
  float top_p = 0.95f;              // >= 1: off
  float min_p = 0.05f;              // <= 0: off
  float repetition_penalty = 1.0f;  // 1: off (llama.cpp's repeat_penalty)
  float presence_penalty = 0.0f;    // OpenAI-style, subtracted once if the token appeared
  float frequency_penalty = 0.0f;   // subtracted per occurrence
  int32_t penalty_last_n = 64;      // how many recent tokens the penalties look at; -1 = all
  uint64_t seed = 0xB1E5EED;        // same seed, same output
  // OpenAI's logit_bias: added to the token's logit before every other step (the penalties
  // included); each bias in [-100, 100]. Ids must be below the vocabulary size (the engine checks).
  std::vector<std::pair<int32_t, float>> logit_bias;

  // Error naming the first out-of-range field, e.g. "top_p must be in (0, 1], got 1.5".
  [[nodiscard]] Status validate() const;
};

struct TokenProb {
  int32_t id = 0;
  double p = 0.0;
};

// Outcome of verifying one draft token against the target's logits.
struct DraftVerdict {
  bool accepted = false;
  int32_t token = 0;  // the draft token if accepted, else the token drawn in its place
};

class Sampler {
 public:
  Sampler(const SamplingParams& params, int32_t n_vocab);

  // Picks the next token. `logits` (n_vocab) is modified in place (penalties, temperature).
  // `history`: the tokens seen so far in this sequence (prompt + generated), oldest first.
  // `constraint` (structured output): the token drawn is one it allows. Lazy, as llama.cpp: the
  // token is drawn from the unmasked distribution first and kept if allowed; only if rejected
  // is the whole vocabulary masked and the token drawn again. Greedy, that is exactly the
  // masked argmax; with temperature, top-k/top-p/min-p see the unmasked logits on the first
  // draw (as llama.cpp). Returns kNoConstrainedToken when the constraint allows no token. The
  // caller advances the constraint with the returned token (see grammar_constraint.h).
  [[nodiscard]] int32_t sample(float* logits, std::span<const int32_t> history,
                               TokenConstraint* constraint = nullptr);
  static constexpr int32_t kNoConstrainedToken = -1;

  // The distribution sample() draws from after every transform (penalties, top-k, top-p, min-p,
  // temperature): the surviving tokens with their probabilities, best first (greedy: the argmax
  // with probability 1). Valid until the next call. `logits` is modified in place.
  [[nodiscard]] const std::vector<TokenProb>& distribution(float* logits,
                                                           std::span<const int32_t> history);

  // Speculative decoding's verification of draft token `draft`, proposed with probability
  // distribution q (nullptr: a deterministic drafter, q = one-hot at draft): accept with
  // probability min(1, p(draft) / q(draft)); on rejection draw from norm(max(0, p - q)). The
  // emitted token is then distributed exactly as sample() would draw it. Greedy: accepted iff
  // draft is the argmax, else the argmax is returned.
  // `constraint`: p is the masked distribution (the state before `draft`), so a draft the
  // grammar rejects is never accepted. Greedy uses sample()'s lazy path; with temperature the
  // whole vocabulary is masked first. token == kNoConstrainedToken: nothing allowed.
  [[nodiscard]] DraftVerdict verify(float* logits, std::span<const int32_t> history, int32_t draft,
                                    const std::vector<TokenProb>* q = nullptr,
                                    TokenConstraint* constraint = nullptr);

  [[nodiscard]] const SamplingParams& params() const { return params_; }

 private:
  [[nodiscard]] int32_t draw(const std::vector<TokenProb>& dist);
  // distribution() after the penalties have been applied.
  [[nodiscard]] const std::vector<TokenProb>& shaped(const float* logits);
  [[nodiscard]] int32_t pick(const float* logits);
  void apply_penalties(float* logits, std::span<const int32_t> history);

  struct Candidate {
    int32_t id;
    float logit;
  };

  SamplingParams params_;
  int32_t n_vocab_;
  std::mt19937_64 rng_;
  std::vector<Candidate> candidates_;  // reused between calls
  std::vector<TokenProb> dist_;        // reused: distribution()'s result
  std::vector<TokenProb> residual_;    // reused: verify()'s rejection distribution
  std::vector<int32_t> counts_;        // reused: occurrences per token id in the window
};

// Rewrites a row of logits as log-probabilities (log-softmax), in place.
void log_softmax_inplace(float* row, int32_t n_vocab);

// Index of the largest logit (first one on ties, as llama.cpp's greedy sampler).
[[nodiscard]] int32_t argmax(const float* logits, int32_t n);

}  // namespace bie
