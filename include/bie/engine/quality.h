// KV-cache quality measurement (`bie quality`): for each KV regime, compared with the all-FP16
// paged cache on the same model and text — perplexity over non-overlapping windows, ΔPPL, mean KL
// divergence and top-1 agreement of the next-token distributions, the first divergence of greedy
// continuations, and the log-probability of a planted fact ("needle") at several depths.
// Every regime runs in lock step with the baseline on one Engine, chunk by chunk, so no regime's
// logits are held much beyond one chunk. Pure library code: progress goes to a callback.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bie/common/result.h"
#include "bie/planner/kv_layout_flags.h"
#include "bie/sampling/sampler.h"

namespace bie {

struct QualityRegime {
  std::string spec;              // as the user wrote it, e.g. "int4_asym-rotate"
  planner::KvLayoutFlags flags;  // what it resolves from (the engine's regime is made of them)
  planner::KvLayout layout;
};

// One --regimes entry: a --kv-cache-dtype name ("f16", "int8", "fp8", "int4_asym",
// "int4_channel", "int4_asym_g32", ...), or K and V given apart as "k=NAME:v=NAME" (either may be
// left out; the other comes from "f16"), optionally followed by "+rotate" or "-rotate" (else the
// resolve_kv_layout default: on for int4_asym keys), or "map=FILE" (a --kv-layer-map file; the
// other dtype flags do not apply). `base` supplies the group size, block size,
// sinks and window. Errors name the entry.
[[nodiscard]] Result<QualityRegime> parse_quality_regime(const std::string& spec,
                                                         const planner::KvLayoutFlags& base);

struct QualityConfig {
  // The f16 baseline is always run first, listed or not; an entry spelt "f16" is that baseline.
  std::vector<QualityRegime> regimes;
  std::vector<int32_t> ctx_sizes = {2048};
  int32_t windows = 4;  // perplexity windows per context size (fewer if the text is short)
  int32_t batch = 512;  // tokens per forward (chunked prefill)
  // Greedy continuations: `prompts` prompts of prompt_tokens tokens spread evenly over the text,
  // each continued for continuation_tokens tokens by every regime.
  int32_t prompts = 8;
  int32_t prompt_tokens = 1024;
  int32_t continuation_tokens = 64;
  // Needle: depths in percent of the haystack, total lengths in tokens (empty: no needle test).
  std::vector<int32_t> needle_depths = {10, 50, 90};
  std::vector<int32_t> needle_ctx = {2048};
  uint64_t seed = 1;  // picks the passphrase
};

// Perplexity-window statistics of one regime at one context size. In each window of n tokens the
// logits at positions n/2 .. n-2 score the next token (n/2 - 1 tokens per window), as
// llama-perplexity does; KLD is KL(P_f16 || P_regime) at the same positions, averaged.
struct PplStats {
  int32_t n_ctx = 0;
  int32_t windows = 0;
  int64_t n_scored = 0;
  double nll_sum = 0.0;   // sum of -log p(next token)
  double kld_sum = 0.0;   // sum over scored positions of KL(f16 || regime), nats
  double kld_max = 0.0;   // largest single-position KL
  int64_t top1_same = 0;  // positions whose argmax equals the f16 argmax

  [[nodiscard]] double ppl() const;
  [[nodiscard]] double mean_kld() const { return n_scored ? kld_sum / n_scored : 0.0; }
  [[nodiscard]] double top1() const {
    return n_scored ? static_cast<double>(top1_same) / n_scored : 0.0;
  }
};

struct NeedleStats {
  int32_t n_ctx = 0;
  int32_t depth_pct = 0;
  int32_t needle_pos = 0;       // token index where the fact starts
  double answer_logprob = 0.0;  // sum of log p over the answer tokens, teacher-forced
  bool answer_greedy = false;   // every answer token is the argmax at its position
};

struct RegimeQuality {
  QualityRegime regime;
  std::vector<PplStats> ppl;              // one per ctx size, in QualityConfig order
  std::vector<int32_t> first_divergence;  // per prompt: first index where the greedy continuation
                                          // differs from f16's (continuation_tokens if never)
  std::vector<NeedleStats> needle;        // per (needle ctx, depth), ctx-major
  uint64_t body_bytes_per_token = 0;      // planner::kv_bytes_per_token(k, v): all layers
  std::vector<double> bytes_per_token;    // per ctx size: kv_sequence_bytes(n) / n (FP16 sinks,
                                          // window and block rounding included)

  [[nodiscard]] double median_divergence() const;
};

struct QualityReport {
  std::string passphrase;
  int64_t text_tokens = 0;
  std::vector<RegimeQuality> regimes;  // the f16 baseline first
  // Percent change of regime r's perplexity at ctx index i against the baseline's.
  [[nodiscard]] double delta_ppl_pct(size_t r, size_t i) const;
};

using QualityProgress = std::function<void(const std::string&)>;

// Where a measurement runs: EngineConfig's model, device and threads.
struct QualityTarget {
  std::string model = "default";  // a GGUF path or a shipped model's name
  std::string device = "cpu";
  int32_t threads = 0;  // 0: hardware threads
};

// Runs everything `cfg` asks for on `text`, on one Engine (the server's scheduler, KV regimes
// and model runner) whose KV regimes are the baseline and cfg.regimes: the regimes' requests run
// side by side and their prompt logits (EngineRequest::on_prompt_logits) are compared position
// by position as they arrive. Errors (before any measurement) when the text has fewer tokens
// than one window of the largest context size or than one prompt plus its continuation, or a
// needle context cannot hold the needle and question.
[[nodiscard]] Result<QualityReport> measure_kv_quality(const QualityTarget& target,
                                                       const std::string& text,
                                                       const QualityConfig& cfg,
                                                       const QualityProgress& progress = {});

// log_softmax_inplace (the rows compared below): bie/sampling/sampler.h.

// Statistics of one position from two rows of log-probabilities: KL(base || test) in nats,
// whether the argmaxes agree, and -log p_test(target). Exposed for tests.
struct PositionStats {
  double kld = 0.0;
  bool top1_same = false;
  double nll = 0.0;
};
[[nodiscard]] PositionStats compare_logprobs(const float* base_logp, const float* test_logp,
                                             int32_t n_vocab, int32_t target);

}  // namespace bie
