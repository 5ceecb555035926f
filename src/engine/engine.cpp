// The Engine facade: one engine thread running schedule -> run -> process steps (Scheduler,
// ModelRunner, OutputProcessor; SpeculativePolicy drafts first) over continuous batching, and the
// thread-safe submission/cancel/metrics surface around it.
#include "bie/engine/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <future>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "bie/attention/attention_entropy.h"
#include "bie/backend/backend.h"
#include "bie/engine/draft_model.h"
#include "bie/engine/drafter.h"
#include "bie/engine/file_digest.h"
#include "bie/engine/model_path.h"
#include "bie/engine/scheduler.h"
#include "bie/engine/stop_strings.h"
#include "bie/engine/synth_model.h"
#include "bie/kv/sequence_kv.h"
#include "bie/model/model.h"
#include "bie/planner/model_geometry.h"
#include "bie/tokenizer/stream_decoder.h"
#include "bie/tokenizer/tokenizer.h"
#include "engine/kv_regimes.h"
#include "engine/model_runner.h"
#include "engine/output_processor.h"
#include "engine/request.h"
#include "engine/request_grammar.h"
#include "engine/speculative_policy.h"

namespace bie {

double RequestMetrics::decode_tps() const {
  const double t = total_seconds - ttft_seconds;
  return generated_tokens > 1 && t > 0 ? static_cast<double>(generated_tokens - 1) / t : 0.0;
}

namespace {

class EngineImpl final : public Engine, private OutputProcessor::Hooks {
 public:
  EngineImpl() = default;
  ~EngineImpl() override { shutdown(false); }

  Status init(const EngineConfig& cfg, CreateError& kind);

  const ModelInfo& model_info() const override { return info_; }
  const tokenizer::Tokenizer& tokenizer() const override { return *tok_; }
  const KvSetupReport& kv_report() const override { return report_; }
  std::string kv_regime() const override { return regimes_->default_label(); }
  void set_force_f16(bool on) override { regimes_->set_force_f16(on); }
  std::string kv_regime_for(const EngineRequest& req) const override {
    auto r = regimes_->pick(req, static_cast<int64_t>(req.prompt.size()) + capped_max_tokens(req));
    return (*regimes_)[r ? *r : 0].label;
  }
  KvPolicyInfo kv_policy() const override { return regimes_->info(); }

  std::optional<SubmitFailure> submit(RequestId id, EngineRequest req,
                                      RequestCallbacks cb) override;
  void cancel(RequestId id) override;
  EngineMetrics metrics() const override;
  std::vector<PrefixCacheListing> prefix_cache_index() override;
  void shutdown(bool finish_running) override;
  void wait_idle() override;

 private:
  void loop();
  void step();
  // --kv-fallback-entropy: the entropy buffer of a sequence whose pass completes its prompt and
  // that should be measured (empty: none).
  std::span<attention::HeadEntropy> entropy_probe(const ScheduledSeq& sc);
  // After the pass: every measured request below the threshold moves to the fallback regime, to
  // be computed again there; its chunk leaves `out` and its logits row the pass's rows.
  void fall_back_spiky(SchedulerOutput& out, std::span<float> logits);
  void finish(Request& r, const std::string& reason, const std::string& error = {}) {
    out_->finish(r, reason, error);
  }
  // OutputProcessor::Hooks.
  [[nodiscard]] const std::string& regime_label(size_t regime) const override {
    return (*regimes_)[regime].label;
  }
  [[nodiscard]] bool retire(RequestId rid, int32_t choices) override;
  void publish_metrics() override;

  EngineConfig cfg_;
  int64_t max_model_len_ = 0;
  // First member: destroyed last, after the model, the KV stores and the drafter, whose buffers
  // may live on its device.
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<tokenizer::Tokenizer> tok_;
  KvSetupReport report_;
  ModelInfo info_;
  // Tokens req may generate within max_model_len (its max_tokens, or all the room left).
  [[nodiscard]] int64_t capped_max_tokens(const EngineRequest& req) const {
    const int64_t room = max_model_len_ - static_cast<int64_t>(req.prompt.size());
    return req.max_tokens > 0 ? std::min<int64_t>(req.max_tokens, room) : room;
  }
  std::unique_ptr<KvRegimes> regimes_;  // each with its store; all draw on one budget
  std::unique_ptr<Scheduler> sched_;
  std::unique_ptr<Drafter> drafter_;       // null: speculation off
  std::unique_ptr<Drafter> lookup_;        // prompt lookup beside a draft model, or null
  std::unique_ptr<VocabTrie> vocab_trie_;  // structured output's token trie (built on first use)

  // Engine thread only.
  RequestMap reqs_;
  // The step's phases, built when the engine thread starts (from what init set up).
  std::unique_ptr<SpeculativePolicy> spec_;  // null: speculation off
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<OutputProcessor> out_;
  EngineMetrics m_;  // counters; gauges filled in publish_metrics

  // Shared with callers, under mu_.
  mutable std::mutex mu_;
  std::condition_variable cv_;       // wakes the engine thread
  std::condition_variable idle_cv_;  // wait_idle
  std::deque<std::unique_ptr<Request>> incoming_;
  std::vector<kv::SeqId> cancels_;  // sequences of requests to cancel
  std::vector<std::promise<std::vector<PrefixCacheListing>>> index_requests_;
  bool loop_done_ = true;  // no engine thread runs (not started, or its loop returned)
  struct Live {
    kv::SeqId first = 0;  // choice i runs as sequence first + i
    int32_t n = 1;
    int32_t unfinished = 1;
  };
  std::unordered_map<RequestId, Live> live_;  // accepted, some choice not finished
  bool accepting_ = true;
  bool stopping_ = false;
  bool finish_running_ = false;
  bool busy_ = false;
  kv::SeqId next_sid_ = 1;
  int64_t refusals_ = 0;
  EngineMetrics snapshot_;
  std::thread thread_;
};

Status EngineImpl::init(const EngineConfig& cfg, CreateError& kind) {
  cfg_ = cfg;
  kind = CreateError::kInvalidConfig;
  const KvEngineOptions& o = cfg.kv;
  if (o.max_num_seqs < 1) return Error{"--max-num-seqs must be >= 1"};
  if (o.chunked_prefill_size < 1) return Error{"--chunked-prefill-size must be >= 1"};
  const int64_t batched = cfg.max_num_batched_tokens > 0
                              ? cfg.max_num_batched_tokens
                              : std::max(o.chunked_prefill_size, o.max_num_seqs);
  if (batched < o.max_num_seqs) {
    return Error{fmt::format(
        "--max-num-batched-tokens {} is below --max-num-seqs {} (every running sequence needs a "
        "token per step)",
        batched, o.max_num_seqs)};
  }
  if (cfg.max_queue < 0) return Error{"--max-queue must be >= 0"};
  if (cfg.prompt_logits && cfg.enable_prefix_caching) {
    return Error{
        "prompt logits need prefix caching off: a position served from the cache is not computed"};
  }
  if (cfg.speculative_draft_tokens < 0 || cfg.speculative_draft_tokens > kMaxDraftTokens) {
    return Error{fmt::format("--speculative-draft-tokens must be in [0, {}], got {}",
                             kMaxDraftTokens, cfg.speculative_draft_tokens)};
  }
  if (cfg.speculative_ngram_min < 1 || cfg.speculative_ngram_max < cfg.speculative_ngram_min ||
      cfg.speculative_ngram_max > 16) {
    return Error{
        fmt::format("--speculative-ngram sizes must satisfy 1 <= min <= max <= 16, got "
                    "{}..{}",
                    cfg.speculative_ngram_min, cfg.speculative_ngram_max)};
  }
  // The KV layout and the numbers the budget uses, before anything is loaded.
  if (auto layout = planner::resolve_kv_layout(o.kv); !layout) return Error{layout.error()};
  if (o.max_model_len < 0) return Error{"--max-model-len must be >= 1"};
  if (!o.kv_cache_memory && !(o.gpu_memory_utilization > 0 && o.gpu_memory_utilization <= 1)) {
    return Error{fmt::format("--gpu-memory-utilization must be in (0, 1], got {}",
                             o.gpu_memory_utilization)};
  }
  // The backend (an unknown device is a config error, before anything is loaded).
  const int threads = cfg.threads > 0
                          ? cfg.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  auto backend = create_backend(BackendConfig{cfg.device, threads});
  if (!backend) return Error{backend.error()};
  backend_ = std::move(backend).value();
  kind = CreateError::kModel;
  auto path = resolve_model_path(cfg.model);
  if (!path) return Error{path.error()};
  LoadOptions lo;
  lo.max_batch_tokens = static_cast<int32_t>(batched);
  // Logits rows of one step: a row per running sequence, one per verified draft token too; with
  // prompt logits a row per token.
  const int64_t out_rows =
      cfg.prompt_logits
          ? batched
          : std::min<int64_t>(batched,
                              o.max_num_seqs * (1 + int64_t{cfg.speculative_draft_tokens}));
  lo.max_output_rows = static_cast<int32_t>(out_rows);
  auto model = load_model(*path, lo);
  if (!model) return Error{model.error()};
  model_ = std::move(model).value();
  const planner::ModelGeometry* g = &model_->geometry();
  kind = CreateError::kInvalidConfig;  // the layout against this model's geometry
  if (auto layout = kv_layout_for_model(*g, o.kv); !layout) return Error{layout.error()};
  kind = CreateError::kModel;
  auto tok = tokenizer::Tokenizer::from_gguf(model_->file());
  if (!tok) return Error{tok.error()};
  tok_ = std::make_unique<tokenizer::Tokenizer>(std::move(tok).value());
  vocab_trie_ = std::make_unique<VocabTrie>(*tok_);
  KvEngineOptions plan_opts = o;
  if (!cfg.speculative_model.empty()) {
    if (cfg.speculative_draft_tokens < 1) {
      return Error{"--speculative-model needs --speculative-draft-tokens >= 1"};
    }
    kind = CreateError::kModel;
    auto dpath = resolve_model_path(cfg.speculative_model);
    if (!dpath) return Error{"--speculative-model: " + dpath.error()};
    // Its cache holds one sequence of the context the target serves (sequences share it).
    const int64_t draft_ctx =
        effective_max_model_len(o.max_model_len, model_->geometry().n_ctx_train);
    if (cfg.speculative_draft_vocab < 0) {
      return Error{fmt::format("--speculative-draft-vocab must be >= 0, got {}",
                               cfg.speculative_draft_vocab)};
    }
    auto d = DraftModelDrafter::create(*dpath, tok_->vocab(), draft_ctx,
                                       static_cast<int32_t>(o.chunked_prefill_size), *backend_,
                                       cfg.speculative_draft_vocab);
    if (!d) return Error{d.error()};
    plan_opts.draft_bytes = (*d)->bytes().total();
    drafter_ = std::move(d).value();
  }
  kind = CreateError::kInvalidConfig;
  KvRegimesConfig rc;
  rc.base = o.kv;
  rc.extra = cfg.kv_regimes;
  rc.layouts = cfg.kv_regime_layouts;
  rc.policy = cfg.kv_policy;
  if (cfg.kv_fallback_entropy != 0) {
    if (!(cfg.kv_fallback_entropy > 0 && cfg.kv_fallback_entropy <= 1)) {
      return Error{
          fmt::format("--kv-fallback-entropy must be in (0, 1], got {}", cfg.kv_fallback_entropy)};
    }
    if (plan_opts.device) {
      return Error{fmt::format(
          "--kv-fallback-entropy measures attention over KV blocks in host memory; it does not "
          "run on {} yet (drop it, or run with --device cpu)",
          backend_->name())};
    }
    rc.fallback = cfg.kv_fallback_regime;
  }
  rc.enable_prefix_caching = cfg.enable_prefix_caching;
  rc.kill_switch = cfg.f16_kill_switch;
  rc.events = cfg.kv_events;
  kind = CreateError::kOutOfBudget;          // what plan_kv_setup can still refuse
  plan_opts.chunked_prefill_size = batched;  // the workspace holds one step's tokens
  plan_opts.require_all_seqs = false;
  const uint64_t weights = apply_backend_memory(plan_opts, *g, *model_, *backend_, out_rows);
  if (!backend_->reserves_on_demand()) {
    // Each regime's pools are allocated up front on the device: one share of the KV memory each.
    kind = CreateError::kInvalidConfig;
    auto n = KvRegimes::device_regime_count(rc, *g);
    if (!n) return Error{n.error()};
    plan_opts.kv_regime_shares = *n;
    const int64_t n_ctx_train = model_->geometry().n_ctx_train;
    rc.plan_device_pools = [g = *g, weights, n_ctx_train,
                            plan_opts](const planner::KvLayoutFlags& f) -> Result<KvSetupReport> {
      KvEngineOptions o = plan_opts;
      o.kv = f;
      return plan_kv_setup(g, weights, n_ctx_train, o);
    };
    kind = CreateError::kOutOfBudget;
  }
  auto rep = plan_kv_setup(*g, weights, model_->geometry().n_ctx_train, plan_opts);
  if (!rep) return Error{rep.error()};
  report_ = std::move(rep).value();
  max_model_len_ = report_.max_model_len;
  kind = CreateError::kModel;
  auto sha = file_sha256(*path);
  if (!sha) return Error{sha.error()};
  kind = CreateError::kInvalidConfig;
  auto regimes =
      KvRegimes::create(rc, *g, kv::kv_geometry(model_->geometry()), *sha, *backend_, report_);
  if (!regimes) return Error{regimes.error()};
  regimes_ = std::move(regimes).value();
  // The weights and the workspace are held from start-up, as the report says: on a device (a
  // weight type without a device kernel is refused here too), and on the CPU, whose backend
  // repacks the weights for its kernels here rather than in the first request.
  kind = CreateError::kModel;
  if (Status st = model_->bind(*backend_); !st) return st;
  for (size_t i = 0; i < regimes_->size(); ++i) {
    const KvRegime& r = (*regimes_)[i];
    // A per-channel body block is written as one tile by one pass (Scheduler::chunk_for): a
    // step budget below the block size could never run a prompt chunk that reaches past it.
    const planner::KvLayout& l = r.store->layout();
    if (l.has_per_channel() && batched < l.block_size) {
      return Error{fmt::format(
          "KV regime {} writes {}-token tiles in one pass: --max-num-batched-tokens {} must be at "
          "least the block size {}",
          r.label.empty() ? r.name : r.label, l.block_size, batched, l.block_size)};
    }
  }

  kind = CreateError::kInvalidConfig;
  if (cfg.speculative_draft_tokens > 0) {
    const planner::KvLayout& l = report_.layout;
    if (l.mixed() && l.window_tokens < cfg.speculative_draft_tokens + 1) {
      return Error{fmt::format(
          "speculative decoding rolls back only FP16 window tokens: --kv-window {} must be at "
          "least --speculative-draft-tokens + 1 = {}",
          l.window_tokens, cfg.speculative_draft_tokens + 1)};
    }
    if (!drafter_) {
      drafter_ =
          std::make_unique<NgramDrafter>(cfg.speculative_ngram_max, cfg.speculative_ngram_min);
    } else if (cfg.speculative_lookup) {
      lookup_ =
          std::make_unique<NgramDrafter>(cfg.speculative_ngram_max, cfg.speculative_ngram_min);
    }
  }
  SchedulerConfig schc;
  schc.max_num_seqs = o.max_num_seqs;
  schc.max_num_batched_tokens = batched;
  schc.chunked_prefill_size = o.chunked_prefill_size;
  schc.max_model_len = max_model_len_;
  sched_ = std::make_unique<Scheduler>(schc, regimes_->stores());

  info_.path = *path;
  info_.id = std::filesystem::path(*path).stem().string();
  info_.sha256 = *sha;
  info_.arch = model_->geometry().arch;
  if (!cfg_.chat_template.empty()) {
    info_.chat_template = cfg_.chat_template;
  } else if (auto t = model_->file().get_string("tokenizer.chat_template")) {
    info_.chat_template = *t;
  }
  info_.max_model_len = max_model_len_;
  info_.n_vocab = model_->geometry().n_vocab;
  info_.synthetic = model_->file().get_bool(kSyntheticKey).value_or(false);

  publish_metrics();
  loop_done_ = false;
  thread_ = std::thread([this] { loop(); });
  return {};
}

std::optional<SubmitFailure> EngineImpl::submit(RequestId id, EngineRequest req,
                                                RequestCallbacks cb) {
  const auto refuse = [&](SubmitError k, std::string msg) {
    std::lock_guard lk(mu_);
    ++refusals_;
    return std::optional<SubmitFailure>(SubmitFailure{k, std::move(msg)});
  };
  if (req.prompt.empty()) return refuse(SubmitError::kInvalid, "the prompt is empty");
  for (const int32_t t : req.prompt) {
    if (t < 0 || t >= info_.n_vocab) {
      return refuse(SubmitError::kInvalid,
                    fmt::format("token id {} is outside the vocabulary [0, {})", t, info_.n_vocab));
    }
  }
  if (Status s = req.sampling.validate(); !s) return refuse(SubmitError::kInvalid, s.error());
  for (const auto& [t, bias] : req.sampling.logit_bias) {
    if (t >= info_.n_vocab) {
      return refuse(SubmitError::kInvalid, fmt::format("logit_bias: token id {} is outside the "
                                                       "vocabulary [0, {})",
                                                       t, info_.n_vocab));
    }
  }
  if (req.n < 1 || req.n > cfg_.kv.max_num_seqs) {
    return refuse(
        SubmitError::kInvalid,
        fmt::format("n must be in [1, {}] (--max-num-seqs), got {}", cfg_.kv.max_num_seqs, req.n));
  }
  if (req.logprobs > 20) {
    return refuse(SubmitError::kInvalid,
                  fmt::format("logprobs must be at most 20, got {}", req.logprobs));
  }
  const auto n_prompt = static_cast<int64_t>(req.prompt.size());
  if (req.synthetic_kv_prefix < 0 || req.synthetic_kv_prefix >= n_prompt) {
    return refuse(SubmitError::kInvalid,
                  fmt::format("synthetic_kv_prefix must be in [0, {}) (the prompt's last token is "
                              "computed), got {}",
                              n_prompt, req.synthetic_kv_prefix));
  }
  if (req.on_prompt_logits) {
    if (!cfg_.prompt_logits) {
      return refuse(SubmitError::kInvalid,
                    "prompt logits need an engine made with EngineConfig::prompt_logits");
    }
    if (req.synthetic_kv_prefix > 0) {
      return refuse(SubmitError::kInvalid, "prompt logits and a synthetic K/V prefix exclude "
                                           "each other (synthetic positions are not computed)");
    }
    if (req.prompt_logits_from < 0 || req.prompt_logits_from >= n_prompt) {
      return refuse(SubmitError::kInvalid,
                    fmt::format("prompt_logits_from must be in [0, {}), got {}", n_prompt,
                                req.prompt_logits_from));
    }
  }
  if (n_prompt >= max_model_len_) {
    return refuse(SubmitError::kTooLong,
                  fmt::format("the prompt has {} tokens; --max-model-len is {}, which leaves no "
                              "room for a generated token",
                              n_prompt, max_model_len_));
  }
  auto r = std::make_unique<Request>();
  r->rid = id;
  r->submitted = Clock::now();
  r->max_tokens = capped_max_tokens(req);
  auto regime = regimes_->pick(req, n_prompt + r->max_tokens);
  if (!regime) return refuse(SubmitError::kInvalid, regime.error());
  r->regime = *regime;
  const KvRegime& rg = (*regimes_)[r->regime];
  if (n_prompt >= rg.tokens_fit) {
    return refuse(SubmitError::kTooLong,
                  fmt::format("the prompt has {} tokens; the KV budget holds {} tokens of one "
                              "sequence in {}",
                              n_prompt, rg.tokens_fit, rg.label));
  }
  r->max_tokens = std::min(r->max_tokens, rg.tokens_fit - n_prompt);
  r->sampler = std::make_unique<Sampler>(req.sampling, info_.n_vocab);
  r->decoder = std::make_unique<tokenizer::StreamDecoder>(*tok_);
  r->stops = std::make_unique<StopStrings>(req.stop);
  if (req.grammar) {
    auto g = RequestGrammar::create(req.grammar, vocab_trie_->get(), req.grammar_prefix);
    if (!g) return refuse(SubmitError::kInvalid, "structured output: " + g.error());
    r->grammar = std::move(g).value();
  }
  r->gamma = cfg_.speculative_draft_tokens;
  r->forks_pending = req.n - 1;
  r->req = std::move(req);
  r->cb = std::move(cb);
  {
    std::lock_guard lk(mu_);
    if (!accepting_) {
      ++refusals_;
      return SubmitFailure{SubmitError::kShuttingDown, "the server is shutting down"};
    }
    // Accepted and unfinished requests beyond the running slots are the queue.
    const auto held = static_cast<int64_t>(live_.size());
    if (held >= cfg_.max_queue + cfg_.kv.max_num_seqs) {
      ++refusals_;
      return SubmitFailure{
          SubmitError::kQueueFull,
          fmt::format("the queue is full ({} requests held, --max-queue {}); retry later", held,
                      cfg_.max_queue)};
    }
    if (live_.count(id) != 0) {
      ++refusals_;
      return SubmitFailure{SubmitError::kInvalid, fmt::format("request id {} is in use", id)};
    }
    r->sid = next_sid_;
    next_sid_ += r->req.n;
    live_.emplace(id, Live{r->sid, r->req.n, r->req.n});
    incoming_.push_back(std::move(r));
  }
  cv_.notify_one();
  return std::nullopt;
}

void EngineImpl::cancel(RequestId id) {
  {
    std::lock_guard lk(mu_);
    const auto it = live_.find(id);
    if (it == live_.end()) return;
    for (int32_t i = 0; i < it->second.n; ++i) cancels_.push_back(it->second.first + i);
  }
  cv_.notify_one();
}

EngineMetrics EngineImpl::metrics() const {
  std::lock_guard lk(mu_);
  EngineMetrics m = snapshot_;
  m.requests_in_flight = static_cast<int64_t>(live_.size());
  m.admission_refusals = refusals_;
  m.force_f16 = regimes_->force_f16();
  return m;
}

std::vector<PrefixCacheListing> EngineImpl::prefix_cache_index() {
  std::future<std::vector<PrefixCacheListing>> f;
  {
    std::lock_guard lk(mu_);
    if (loop_done_) return regimes_->prefix_cache_listing();  // no engine thread touches the stores
    index_requests_.emplace_back();
    f = index_requests_.back().get_future();
  }
  cv_.notify_one();
  return f.get();
}

void EngineImpl::shutdown(bool finish_running) {
  {
    std::lock_guard lk(mu_);
    accepting_ = false;
    if (!stopping_) finish_running_ = finish_running;
    if (!finish_running) finish_running_ = false;
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void EngineImpl::wait_idle() {
  std::unique_lock lk(mu_);
  idle_cv_.wait(
      lk, [&] { return (incoming_.empty() && !busy_ && live_.empty()) || !thread_.joinable(); });
}

void EngineImpl::loop() {
  if (drafter_) {
    spec_ = std::make_unique<SpeculativePolicy>(SpeculativeConfig::from(cfg_), *drafter_,
                                                max_model_len_, lookup_.get());
  }
  runner_ = std::make_unique<ModelRunner>(*model_, *backend_, max_model_len_);
  OutputProcessor::Deps deps;
  deps.sched = sched_.get();
  deps.tok = tok_.get();
  deps.reqs = &reqs_;
  deps.metrics = &m_;
  deps.hooks = this;
  deps.drafter = drafter_.get();
  deps.spec = spec_.get();
  deps.n_vocab = info_.n_vocab;
  deps.max_model_len = max_model_len_;
  out_ = std::make_unique<OutputProcessor>(deps);
  for (;;) {
    std::deque<std::unique_ptr<Request>> incoming;
    std::vector<kv::SeqId> cancels;
    std::vector<std::promise<std::vector<PrefixCacheListing>>> index_requests;
    bool stopping = false, finish_running = false;
    {
      std::unique_lock lk(mu_);
      busy_ = !sched_->idle();
      if (!busy_) idle_cv_.notify_all();
      cv_.wait(lk, [&] {
        return stopping_ || !incoming_.empty() || !cancels_.empty() || !index_requests_.empty() ||
               !sched_->idle();
      });
      incoming.swap(incoming_);
      cancels.swap(cancels_);
      index_requests.swap(index_requests_);
      stopping = stopping_;
      finish_running = finish_running_;
      busy_ = true;
    }
    for (auto& r : incoming) {
      const kv::SeqId sid = r->sid;
      sched_->add(sid, r->req.prompt, (*regimes_)[r->regime].store.get());
      sched_->find(sid)->forks = r->forks_pending;
      sched_->find(sid)->synthetic_prefix = r->req.synthetic_kv_prefix;
      if (r->req.on_prompt_logits) sched_->find(sid)->prompt_logits_from = r->req.prompt_logits_from;
      m_.prompt_tokens += static_cast<int64_t>(r->req.prompt.size());
      reqs_.emplace(sid, std::move(r));
    }
    for (const kv::SeqId sid : cancels) {
      if (const auto it = reqs_.find(sid); it != reqs_.end()) finish(*it->second, "cancelled");
    }
    for (auto& p : index_requests) p.set_value(regimes_->prefix_cache_listing());
    if (stopping) {
      // Waiting requests never start; running ones finish when asked to, else stop now.
      std::vector<Request*> drop;
      for (auto& [sid, r] : reqs_) {
        const Sequence* s = sched_->find(sid);
        if (!finish_running || s == nullptr || s->status != SeqStatus::kRunning)
          drop.push_back(r.get());
      }
      for (Request* r : drop) finish(*r, "cancelled");
      if (sched_->idle()) break;
    }
    if (!sched_->idle()) step();
    publish_metrics();
  }
  publish_metrics();
  std::lock_guard lk(mu_);
  busy_ = false;
  loop_done_ = true;
  for (auto& p : index_requests_) p.set_value(regimes_->prefix_cache_listing());
  index_requests_.clear();
  idle_cv_.notify_all();
}

void EngineImpl::step() {
  if (spec_) spec_->draft(*sched_, reqs_, m_);
  SchedulerOutput out = sched_->schedule();
  if (Status st = ModelRunner::prepare_kv(out); !st) {
    // The blocks the step decided on hold no data: every request in it, and those that held the
    // blocks copied or moved, can no longer be trusted.
    std::vector<Request*> all;
    for (auto& [sid, r] : reqs_) all.push_back(r.get());
    for (Request* r : all) finish(*r, "error", "KV cache: " + st.error());
    return;
  }
  if (out.scheduled.empty()) {
    // Nothing could run: with nothing running, the queue's head can never fit the pools.
    if (sched_->num_running() == 0 && sched_->num_waiting() > 0) {
      const kv::SeqId head = sched_->waiting().front();
      finish(*reqs_.at(head), "error",
             "the request does not fit the KV cache even alone (raise the KV memory)");
    }
    return;
  }
  const auto now = Clock::now();
  for (const ScheduledSeq& sc : out.scheduled) {
    Request& r = *reqs_.at(sc.seq->id);
    if (!r.scheduled_once) {
      r.scheduled_once = true;
      r.first_scheduled = now;
    }
  }
  EntropyProbe probe;
  if (regimes_->fallback()) probe = [this](const ScheduledSeq& sc) { return entropy_probe(sc); };
  auto ran = runner_->run(out, m_, probe);
  if (!ran) {
    for (const ScheduledSeq& sc : out.scheduled) {
      finish(*reqs_.at(sc.seq->id), "error", ran.error());
    }
    return;
  }
  if (spec_) spec_->record_step(ran->decode_only, out.n_tokens(), ran->forward_ms);
  if (cfg_.check_integrity) {
    if (Status st = sched_->check_integrity(); !st) {
      std::vector<Request*> all;
      for (auto& [sid, r] : reqs_) all.push_back(r.get());
      for (Request* r : all) finish(*r, "error", "integrity check failed: " + st.error());
      return;
    }
  }
  if (regimes_->fallback()) fall_back_spiky(out, ran->logits);
  out_->process(out.scheduled, ran->logits);
}

std::span<attention::HeadEntropy> EngineImpl::entropy_probe(const ScheduledSeq& sc) {
  const Sequence& s = *sc.seq;
  Request& r = *reqs_.at(s.id);
  // Requests in the default regime that did not name one, measured once, whose prompt the
  // fallback regime can hold (a move caps what it may generate at what the fallback holds, as
  // submit() does for every regime).
  const bool wanted = r.regime == 0 && r.req.kv_cache_dtype.empty() && r.attn_entropy < 0 &&
                      s.n_prompt < (*regimes_)[*regimes_->fallback()].tokens_fit;
  if (!wanted || !sc.sample || sc.n_draft > 0 || s.computed + sc.n_tokens != s.n_prompt) return {};
  const planner::ModelGeometry& hp = model_->geometry();
  r.entropy.assign(static_cast<size_t>(hp.n_layer) * static_cast<size_t>(hp.n_head), {});
  r.probe_now = true;
  return r.entropy;
}

void EngineImpl::fall_back_spiky(SchedulerOutput& out, std::span<float> logits) {
  const size_t fb = *regimes_->fallback();
  const auto n_vocab = static_cast<size_t>(info_.n_vocab);
  std::vector<ScheduledSeq> kept;
  size_t row = 0, kept_row = 0;
  for (const ScheduledSeq& sc : out.scheduled) {
    const auto rows = static_cast<size_t>(logits_rows(sc));
    const size_t at = row;
    row += rows;
    Request& r = *reqs_.at(sc.seq->id);
    if (r.probe_now) {
      r.probe_now = false;
      r.attn_entropy = attention::entropy_proxy(r.entropy);
      ++m_.kv_entropy_probes;
      if (r.attn_entropy < cfg_.kv_fallback_entropy) {
        Status st = sched_->commit(sc, sc.n_tokens);
        if (st) st = sched_->restart_in(sc.seq->id, (*regimes_)[fb].store.get());
        if (!st) {
          finish(r, "error", "KV fallback: " + st.error());
          continue;
        }
        r.regime = fb;
        r.kv_fallback = true;
        r.max_tokens = std::min(r.max_tokens, (*regimes_)[fb].tokens_fit - sc.seq->n_prompt);
        ++m_.kv_fallbacks;
        continue;
      }
    }
    if (rows > 0 && kept_row != at) {
      std::copy_n(logits.data() + at * n_vocab, rows * n_vocab, logits.data() + kept_row * n_vocab);
    }
    kept_row += rows;
    kept.push_back(sc);
  }
  out.scheduled = std::move(kept);
}

bool EngineImpl::retire(RequestId rid, int32_t choices) {
  std::lock_guard lk(mu_);
  const auto it = live_.find(rid);
  if (it == live_.end()) return false;
  it->second.unfinished -= choices;
  if (it->second.unfinished > 0) return false;
  live_.erase(it);
  return true;
}

void EngineImpl::publish_metrics() {
  EngineMetrics m = m_;
  regimes_->fill_metrics(m);
  const DeviceMemoryUse dev = backend_->device_memory_use();
  m.device_bytes = dev.bytes;
  m.device_peak_bytes = dev.peak_bytes;
  m.requests_running = sched_->num_running();
  m.preemptions = sched_->preemptions();
  std::lock_guard lk(mu_);
  // Waiting = not yet running: still in the hand-over queue or in the scheduler's queue.
  m.requests_waiting = static_cast<int64_t>(incoming_.size()) + sched_->num_waiting();
  snapshot_ = m;
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::create(const EngineConfig& cfg, CreateError* kind) {
  auto e = std::make_unique<EngineImpl>();
  CreateError k = CreateError::kInvalidConfig;
  if (Status s = e->init(cfg, k); !s) {
    if (kind != nullptr) *kind = k;
    return Error{s.error()};
  }
  return std::unique_ptr<Engine>(std::move(e));
}

}  // namespace bie
