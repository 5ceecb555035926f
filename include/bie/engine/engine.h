// Engine: the facade the server, the CLI and the Python SDK drive. Owns the model, tokenizer,
// paged KV store and the continuous-batching Scheduler, and runs them on one engine thread:
// every step schedules decode tokens of running requests plus prefill chunks of new ones under
// the token budget, runs one batched forward pass, samples, and streams results back through
// each request's callbacks (called on the engine thread; keep them short and never call back
// into the Engine from them except cancel()). submit()/cancel()/metrics()/shutdown() are
// thread-safe.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "bie/common/result.h"
#include "bie/engine/kv_setup.h"
#include "bie/sampling/sampler.h"

namespace bie::tokenizer {
class Tokenizer;
}
namespace bie::kv {
class KvEventSink;
}
namespace bie::grammar {
class Grammar;
}

namespace bie {

struct EngineConfig {
  std::string model = "default";  // path to a GGUF file, or "default"
  // A Jinja chat template replacing the GGUF's tokenizer.chat_template in model_info() (the
  // text of bie-serve's --chat-template FILE); empty: the GGUF's own.
  std::string chat_template;
  KvEngineOptions kv;   // KV regime, budget, max_model_len, max_num_seqs, chunk size
  int32_t threads = 0;  // 0: hardware threads
  // The backend the model runs on (create_backend's names: "cpu"); an unknown name is an
  // invalid-config error listing the available ones.
  std::string device = "cpu";
  // Tokens one step may schedule (decode tokens + prefill chunks). 0: max(chunked_prefill_size,
  // max_num_seqs). Sizes the activation workspace.
  int64_t max_num_batched_tokens = 0;
  bool enable_prefix_caching = true;
  // Keep an f16 regime for the KV kill switch (set_force_f16, POST /admin/kv-policy). The CLI's
  // one-request commands turn it off: set_force_f16 then keeps the default regime.
  bool f16_kill_switch = true;
  int64_t max_queue = 256;  // requests waiting for admission before submit() refuses (429)
  // Verify the scheduler's and the block manager's invariants after every step (tests, debug
  // runs); a violation ends every request with an error naming it.
  bool check_integrity = false;
  // Speculative decoding (prompt-lookup n-gram drafter): up to this many draft tokens per step
  // (the BRIEF's --speculative-draft-tokens; 0: off). The engine drafts only while a step's
  // verify tokens stay within two 4-token matrix-vector passes (see docs/serving.md).
  int32_t speculative_draft_tokens = 0;
  int32_t speculative_ngram_max = 3;  // longest suffix matched (tokens)
  int32_t speculative_ngram_min = 2;  // shortest suffix matched
  bool speculative_adaptive = false;  // shrink γ after rejections, grow it after acceptances
  // Draft every step (up to the verify cap) instead of asking the cost model whether drafts pay:
  // for tests and measurements of the drafters themselves.
  bool speculative_always = false;
  // --speculative-model: a draft model GGUF with the target's vocabulary drafts instead of the
  // n-gram matcher (DraftModelDrafter). Its weights, workspace and FP16 KV cache (one
  // --max-model-len sequence) come out of the memory budget. Needs speculative_draft_tokens > 0.
  std::string speculative_model;
  // The draft model's logits cover token ids [0, speculative_draft_vocab) only (0: all): its
  // output layer, the largest matrix of a small model with a large vocabulary, reads that many
  // rows. Byte-level BPE vocabularies number tokens in merge order, so the low ids are the
  // frequent ones; the target still verifies every draft, so outputs do not change.
  int32_t speculative_draft_vocab = 0;
  // Beside a draft model, prompt lookup (the n-gram drafter, free) proposes first: its drafts are
  // verified where the cost model expects them to give more than the draft model's (each keeps
  // its own acceptance rate per request).
  bool speculative_lookup = true;
  // KV regimes (../shared/BRIEF.md §3). Besides the default (kv.kv) every engine can run requests
  // in f16 (the kill switch's target); kv_regimes names further formats requests may ask for
  // ("int8", "fp8_e4m3", ...), and kv_policy picks a regime by length (parse_kv_policy). Each
  // regime has its own paged store; all of them draw on one memory budget (kv::MemoryBudget).
  std::vector<std::string> kv_regimes;
  std::string kv_policy;
  // --kv-fallback-entropy (docs/kv-quality.md, "Spiky attention"): in (0, 1], a request in the
  // default regime has its attention entropy measured at the prompt's last token (the pass that
  // completes its prompt; attention::attention_entropy, summarised by kv_entropy_proxy); below
  // this it is recomputed in kv_fallback_regime before its first token. 0: off. CPU only.
  double kv_fallback_entropy = 0;
  std::string kv_fallback_regime = "int8";
  // KV events (kv/kv_event_sink.h): every regime's prefix cache reports the full blocks it stores
  // and evicts here, under the medium "<regime name>/<fp16|body>" (a model with sliding-window
  // layers: "<regime>/g<group>/<pool>"). Called on the engine thread; must outlive the engine.
  kv::KvEventSink* kv_events = nullptr;
  // Regimes given as whole layout flags (`bie quality`'s --regimes: K and V apart, a layer map,
  // rotation on or off), beside kv_regimes; a request picks one by its label
  // (planner::kv_layout_label of kv_layout_for_model(geometry, flags)).
  std::vector<planner::KvLayoutFlags> kv_regime_layouts;
  // Requests may ask for the logits of their prompt positions (EngineRequest::on_prompt_logits,
  // teacher-forced scoring): the logits workspace then holds a row per batched token. Needs
  // enable_prefix_caching off (a cached position is never computed, so it has no logits).
  bool prompt_logits = false;
};

// Why a request's submission was refused (maps onto an HTTP status).
enum class SubmitError {
  kInvalid,      // bad parameters (400)
  kTooLong,      // prompt (+ max_tokens) beyond max_model_len or the whole KV budget (400/413)
  kQueueFull,    // waiting queue at max_queue (429)
  kShuttingDown  // engine stopping (503)
};

struct SubmitFailure {
  SubmitError kind = SubmitError::kInvalid;
  std::string message;
};

struct TopLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

// One generated token, as streamed.
struct TokenEvent {
  int32_t index = 0;  // the choice it belongs to (0..n-1)
  int32_t token = 0;
  std::string text;  // the text that became final with this token (UTF-8 complete; may be empty)
  float logprob = 0.0f;         // log-softmax of the raw logits (when logprobs requested)
  std::vector<TopLogprob> top;  // top_logprobs alternatives, best first
  // On a choice's first token: the label of the KV regime it runs in (a spiky-attention fallback
  // has moved it by then); empty on later tokens.
  std::string kv_regime;
};

struct RequestMetrics {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens served from the prefix cache
  int64_t generated_tokens = 0;
  int64_t preemptions = 0;
  double queue_seconds = 0.0;   // submit -> first scheduled
  double ttft_seconds = 0.0;    // submit -> first token
  double total_seconds = 0.0;   // submit -> finish
  std::string kv_regime;        // planner::kv_layout_label of the cache it ran in
  int64_t draft_tokens = 0;     // speculative proposals verified
  int64_t accepted_tokens = 0;  // of which accepted
  // The attention-entropy proxy measured at the prompt's last token (--kv-fallback-entropy), -1
  // when not measured; kv_fallback: it was below the threshold and the request was recomputed in
  // the fallback regime (kv_regime names it).
  double attn_entropy = -1;
  bool kv_fallback = false;
  [[nodiscard]] double acceptance_rate() const {
    return draft_tokens > 0 ? static_cast<double>(accepted_tokens) / draft_tokens : 0.0;
  }
  [[nodiscard]] double decode_tps() const;
};

struct FinishEvent {
  int32_t index = 0;          // the choice that finished (0..n-1)
  std::string finish_reason;  // "stop" (EOS or stop string), "length", "cancelled", "error"
  std::string error;          // set when finish_reason == "error"
  std::string tail_text;      // text held back at the end (flushed decoder), may be empty
  RequestMetrics metrics;
};

struct RequestCallbacks {
  // Return false to cancel the request (e.g. the client went away).
  std::function<bool(const TokenEvent&)> on_token;
  // Called exactly once per choice of an accepted request (n times for n choices), last for
  // that choice.
  std::function<void(const FinishEvent&)> on_finish;
};

struct EngineRequest {
  std::vector<int32_t> prompt;  // token ids (already templated and tokenized)
  SamplingParams sampling;
  int32_t max_tokens = 128;       // <= 0: up to max_model_len
  std::vector<std::string> stop;  // stop strings: generation ends before the first match
  bool ignore_eos = false;
  int32_t logprobs = -1;  // -1: none; 0: the chosen token's logprob; k: plus top-k (k <= 20)
  // The KV regime to run in (a format name among the engine's regimes, e.g. "int8"); empty: the
  // length policy, else the default. The kill switch overrides it.
  std::string kv_cache_dtype;
  // Structured output (docs/structured-output.md): every generated token keeps the output inside
  // this grammar, and EOS comes only where the grammar is complete. Immutable and shared; null:
  // unconstrained. grammar_prefix: bytes the grammar has matched before the first generated
  // token (the prompt already ends with them, e.g. a forced tool call's opening).
  std::shared_ptr<const grammar::Grammar> grammar;
  std::string grammar_prefix;
  // Choices (OpenAI's n): the prompt is computed once, then n - 1 sequences fork from it and
  // share its KV blocks copy-on-write. Choice i samples with seed + i. 1..max_num_seqs.
  int32_t n = 1;
  // Measurements only (`bie bench --fill synthetic`): the K/V of the first synthetic_kv_prefix
  // prompt tokens are written as synthetic values of realistic statistics (synthetic_kv.h)
  // instead of being computed, so a model reaches a depth without its prefill. The prefix cache
  // keeps those blocks under the prompt's token ids like any others: an engine that serves real
  // requests must never set it (the server and the SDK do not). 0 <= it < the prompt's length.
  int64_t synthetic_kv_prefix = 0;
  // Teacher-forced scoring (`bie quality`; an engine made with EngineConfig::prompt_logits):
  // called on the engine thread with the raw logits at every prompt position p >=
  // prompt_logits_from (the row that predicts prompt token p + 1; the last position's row is the
  // one the first generated token is sampled from), once per position and in order, also when a
  // preempted request recomputes its prompt. The span is valid during the call only. Not with
  // synthetic_kv_prefix.
  std::function<void(int64_t pos, std::span<const float> logits)> on_prompt_logits;
  int64_t prompt_logits_from = 0;
};

using RequestId = uint64_t;

// A point-in-time copy of the engine's counters and gauges.
struct EngineMetrics {
  struct Pool {
    std::string format;  // "f16" for the sink/window pool, else the body format's name
    int64_t blocks_total = 0;
    int64_t blocks_used = 0;    // held by sequences
    int64_t blocks_cached = 0;  // free but holding prefix-cache content (LRU)
    int64_t blocks_free = 0;    // total - used (cached count as free)
  };
  std::vector<Pool> pools;
  int64_t requests_running = 0;
  int64_t requests_waiting = 0;
  // Accepted requests with a choice not finished yet (live now, not from the last step's
  // snapshot: a request inside a long first step counts).
  int64_t requests_in_flight = 0;
  int64_t requests_finished = 0;
  int64_t prompt_tokens = 0;           // counter: prompt tokens of admitted requests
  int64_t computed_prompt_tokens = 0;  // prompt tokens actually run (not cache hits)
  int64_t generated_tokens = 0;        // counter
  int64_t prefix_queried_blocks = 0;
  int64_t prefix_hit_blocks = 0;
  int64_t preemptions = 0;
  int64_t admission_refusals = 0;  // submit() refusals (queue full, too long)
  int64_t steps = 0;
  int64_t batched_tokens = 0;     // sum over steps of tokens in the step (mean batch = / steps)
  int64_t batched_seqs = 0;       // sum over steps of sequences in the step
  int64_t spec_steps = 0;         // sequence-steps that verified drafts
  int64_t draft_tokens = 0;       // draft tokens verified
  int64_t accepted_tokens = 0;    // accepted (mean accepted per spec step = / spec_steps)
  double drafter_seconds = 0;     // time spent proposing
  int64_t kv_entropy_probes = 0;  // requests whose attention entropy was measured
  int64_t kv_fallbacks = 0;       // of which recomputed in the fallback regime (spiky)
  bool force_f16 = false;         // the KV kill switch is on
  // KV budget held by running sequences (active blocks' pages, every pool) / the budget: 0..1.
  double kv_usage = 0;
  int32_t kv_block_size = 0;      // tokens per block
  int64_t kv_blocks_default = 0;  // blocks the budget holds in the default regime's body format
  // The KV memory budget every regime's pools draw on, and the pages they have committed from it
  // (kv::MemoryBudget's counter: pages of freed blocks stay committed until reclaimed).
  uint64_t kv_budget_bytes = 0;
  uint64_t kv_committed_bytes = 0;
  // Bytes of the blocks sequences hold now, in every regime (cached blocks not counted).
  uint64_t kv_held_bytes = 0;
  // On a device (Backend::device_memory_use): bytes of its device-local buffers now and at most
  // (weights, workspace, KV pools: what the start-up report plans). 0 on the CPU.
  uint64_t device_bytes = 0;
  uint64_t device_peak_bytes = 0;
};

struct ModelInfo {
  std::string id;  // model name shown by /v1/models (file stem)
  std::string path;
  std::string sha256;  // of the GGUF file
  std::string arch;
  // tokenizer.chat_template from the GGUF (or EngineConfig::chat_template), may be empty
  std::string chat_template;
  int64_t max_model_len = 0;
  int32_t n_vocab = 0;
  bool synthetic = false;  // random weights from `bie synth`: its text is noise
};

// The engine's KV regimes and what picks among them (Engine::kv_policy).
struct KvRegimeInfo {
  std::string name;        // format name requests use ("int8")
  std::string label;       // planner::kv_layout_label, as in responses' bie.kv
  int64_t tokens_fit = 0;  // the longest single sequence the whole KV budget holds in it
};
struct KvPolicyInfo {
  bool force_f16 = false;             // the kill switch
  std::string policy;                 // the length policy (format_kv_policy), may be empty
  std::vector<KvRegimeInfo> regimes;  // regimes[0] is the default
  uint64_t budget_bytes = 0;          // the one budget every regime draws on
};

// What one store of the prefix cache holds (Engine::prefix_cache_index): the chain hashes of its
// blocks, named as KV events name them.
struct PrefixCacheListing {
  std::string medium;  // "<regime>/<pool>", as kv::KvEventSink's medium
  int32_t block_size = 0;
  std::vector<uint64_t> hashes;  // sorted
};

// Why Engine::create failed.
enum class CreateError {
  kInvalidConfig,  // a value out of range or inconsistent with the model / KV layout
  kModel,          // the model file: missing, unreadable, corrupt, unsupported
  kOutOfBudget,    // the memory budget cannot hold the weights, workspace and one sequence
};

class Engine {
 public:
  // Loads the model, sizes the KV pools (prints nothing; report() has the start-up report) and
  // starts the engine thread. On failure *kind (if given) says which kind of failure it was.
  [[nodiscard]] static Result<std::unique_ptr<Engine>> create(const EngineConfig& cfg,
                                                              CreateError* kind = nullptr);
  virtual ~Engine() = default;

  [[nodiscard]] virtual const ModelInfo& model_info() const = 0;
  [[nodiscard]] virtual const tokenizer::Tokenizer& tokenizer() const = 0;
  [[nodiscard]] virtual const KvSetupReport& kv_report() const = 0;
  // Label of the regime a request without preferences gets now (f16 while the kill switch is on).
  [[nodiscard]] virtual std::string kv_regime() const = 0;
  // The kill switch: while on, every new request runs in f16 KV, whatever it or the length policy
  // asks for; running requests keep their regime. Thread-safe.
  virtual void set_force_f16(bool on) = 0;
  // Label of the regime `req` would run in if submitted now (its kv_cache_dtype, the policy at
  // its length, the kill switch); the default's label when it names no regime.
  [[nodiscard]] virtual std::string kv_regime_for(const EngineRequest& req) const = 0;
  [[nodiscard]] virtual KvPolicyInfo kv_policy() const = 0;

  // Queues a request. On success on_finish will be called exactly once per choice (also on
  // shutdown).
  [[nodiscard]] virtual std::optional<SubmitFailure> submit(RequestId id, EngineRequest req,
                                                            RequestCallbacks cb) = 0;
  // Asks the engine to stop a request; its on_finish comes with "cancelled". Unknown ids are
  // ignored.
  virtual void cancel(RequestId id) = 0;
  [[nodiscard]] virtual EngineMetrics metrics() const = 0;
  // Every block in every regime's prefix index, taken between two engine steps (waits for the
  // step in progress). Thread-safe; for debugging and for checking KV events against the truth.
  [[nodiscard]] virtual std::vector<PrefixCacheListing> prefix_cache_index() = 0;
  // Stops accepting; finish_running: let running requests complete (waiting ones are cancelled),
  // else cancel everything. Blocks until the engine thread exits. Idempotent.
  virtual void shutdown(bool finish_running) = 0;
  // Waits until no request is running or waiting (tests).
  virtual void wait_idle() = 0;
};

}  // namespace bie
