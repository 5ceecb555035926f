// A request while the engine holds it: parameters, callbacks and the per-request streaming and
// speculation state. Plain data shared by the engine's step phases (ModelRunner,
// OutputProcessor, SpeculativePolicy); the engine thread owns every Request.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "bie/attention/attention_entropy.h"
#include "bie/engine/engine.h"
#include "bie/engine/stop_strings.h"
#include "bie/kv/sequence_kv.h"
#include "bie/sampling/sampler.h"
#include "bie/tokenizer/stream_decoder.h"
#include "engine/request_grammar.h"

namespace bie {

using Clock = std::chrono::steady_clock;

inline double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Request {
  RequestId rid = 0;
  kv::SeqId sid = 0;
  int32_t index = 0;  // choice (n > 1: choice i runs as sequence sid of choice 0 + i)
  // Choices not forked yet (choice 0 only): they fork once its prompt is computed.
  int32_t forks_pending = 0;
  EngineRequest req;
  RequestCallbacks cb;
  int64_t max_tokens = 0;  // effective cap on generated tokens
  size_t regime = 0;       // index into the engine's KV regimes
  Clock::time_point submitted, first_scheduled, first_token;
  bool scheduled_once = false;
  bool got_token = false;
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
  int32_t gamma = 0;         // adaptive γ for this request
  double accept_rate = 0.5;  // running share of drafts accepted (prior: even odds)
  int32_t undrafted = 0;     // decode steps since the last draft (re-probe after a while)
  int32_t spec_steps = 0;    // steps that verified drafts
  // Beside a draft model, prompt lookup (free drafts) keeps its own acceptance: which of the two
  // proposed this step's drafts, and its running rate and steps.
  bool lookup_drafted = false;
  double lookup_rate = 0.5;
  int32_t lookup_steps = 0;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<tokenizer::StreamDecoder> decoder;
  std::unique_ptr<StopStrings> stops;
  std::unique_ptr<RequestGrammar> grammar;  // structured output; null: unconstrained
  // --kv-fallback-entropy: the last prompt token's attention entropy per layer and head, filled
  // by the pass that completes the prompt (probe_now until the engine has read it), then
  // summarised into attn_entropy; kv_fallback once moved to the fallback regime.
  std::vector<attention::HeadEntropy> entropy;
  bool probe_now = false;
  double attn_entropy = -1;
  bool kv_fallback = false;
};

// The engine's requests by sequence id (each choice of n > 1 is its own entry).
using RequestMap = std::unordered_map<kv::SeqId, std::unique_ptr<Request>>;

}  // namespace bie
