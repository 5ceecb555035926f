// TEMPORARY stand-in for bie::Engine::create while the real facade (scheduler) is not on main:
// one engine thread that runs requests one after another with bie::generate on a contiguous
// cache. Compiled into the Python module only when no src/engine/*.cpp defines Engine::create
// (see python/CMakeLists.txt), so the SDK can be built and tested before the facade lands.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "bie/backend/thread_pool.h"
#include "bie/engine/engine.h"
#include "bie/engine/generate.h"
#include "bie/engine/model_path.h"
#include "bie/kv/contiguous_kv_cache.h"
#include "bie/tokenizer/stream_decoder.h"
#include "bie/tokenizer/tokenizer.h"

namespace bie {

double RequestMetrics::decode_tps() const {
  const double decode = total_seconds - ttft_seconds;
  return decode > 0 && generated_tokens > 1 ? (generated_tokens - 1) / decode : 0.0;
}

namespace {

using Clock = std::chrono::steady_clock;

class StubEngine final : public Engine {
 public:
  StubEngine(std::unique_ptr<Model> model, tokenizer::Tokenizer tok, KvSetupReport report,
             ModelInfo info, int threads)
      : model_(std::move(model)),
        tok_(std::move(tok)),
        report_(std::move(report)),
        info_(std::move(info)),
        pool_(threads > 0 ? threads : default_thread_count()) {
    thread_ = std::thread([this] { loop(); });
  }
  ~StubEngine() override { shutdown(false); }

  const ModelInfo& model_info() const override { return info_; }
  const tokenizer::Tokenizer& tokenizer() const override { return tok_; }
  const KvSetupReport& kv_report() const override { return report_; }
  std::string kv_regime() const override { return report_.layout_label; }

  std::optional<SubmitFailure> submit(RequestId id, EngineRequest req,
                                      RequestCallbacks cb) override {
    if (Status s = req.sampling.validate(); !s)
      return SubmitFailure{SubmitError::kInvalid, s.error()};
    if (req.prompt.empty()) return SubmitFailure{SubmitError::kInvalid, "empty prompt"};
    const int64_t need = static_cast<int64_t>(req.prompt.size()) + std::max(req.max_tokens, 0);
    if (need > report_.max_model_len)
      return SubmitFailure{SubmitError::kTooLong, "prompt + max_tokens (" + std::to_string(need) +
                                                      " tokens) exceeds max_model_len " +
                                                      std::to_string(report_.max_model_len)};
    std::lock_guard lk(mu_);
    if (stopping_) return SubmitFailure{SubmitError::kShuttingDown, "engine is shutting down"};
    queue_.push_back(Item{id, std::move(req), std::move(cb), Clock::now()});
    cv_.notify_all();
    return std::nullopt;
  }
  void cancel(RequestId id) override {
    std::lock_guard lk(mu_);
    cancelled_.push_back(id);
  }
  EngineMetrics metrics() const override { return {}; }
  void shutdown(bool finish_running) override {
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
      cancel_all_ = !finish_running;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }
  void wait_idle() override {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return queue_.empty() && !busy_; });
  }

 private:
  struct Item {
    RequestId id;
    EngineRequest req;
    RequestCallbacks cb;
    Clock::time_point t0;
  };
  bool is_cancelled(RequestId id) {
    std::lock_guard lk(mu_);
    if (cancel_all_) return true;
    for (RequestId c : cancelled_)
      if (c == id) return true;
    return false;
  }
  void loop() {
    for (;;) {
      Item it;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        it = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      run_one(it);
      std::lock_guard lk(mu_);
      busy_ = false;
      cv_.notify_all();
    }
  }
  void run_one(Item& it) {
    FinishEvent fin;
    fin.metrics.prompt_tokens = static_cast<int64_t>(it.req.prompt.size());
    fin.metrics.kv_regime = report_.layout_label;
    if (is_cancelled(it.id)) {
      fin.finish_reason = "cancelled";
      it.cb.on_finish(fin);
      return;
    }
    const int32_t max_tokens =
        it.req.max_tokens > 0 ? it.req.max_tokens
                              : static_cast<int32_t>(report_.max_model_len - it.req.prompt.size());
    ContiguousKvCache kv(model_->hparams().kv_geometry(),
                         static_cast<int64_t>(it.req.prompt.size()) + max_tokens);
    GenerateRequest g;
    g.prompt = it.req.prompt;
    g.sampling = it.req.sampling;
    g.max_tokens = max_tokens;
    g.prefill_chunk = static_cast<int32_t>(report_.chunked_prefill_size);
    if (!it.req.ignore_eos) g.stop_tokens = tok_.vocab().eog_ids();
    tokenizer::StreamDecoder dec(tok_);
    std::string text;
    bool stopped = false, cancelled = false;
    auto stats = generate(*model_, kv, pool_, g, [&](int32_t id) {
      if (fin.metrics.generated_tokens == 0)
        fin.metrics.ttft_seconds = std::chrono::duration<double>(Clock::now() - it.t0).count();
      ++fin.metrics.generated_tokens;
      TokenEvent ev;
      ev.token = id;
      ev.text = dec.push(id);
      text += ev.text;
      for (const std::string& s : it.req.stop) {
        const size_t at = s.empty() ? std::string::npos : text.find(s);
        if (at != std::string::npos) {
          ev.text.resize(ev.text.size() - std::min(ev.text.size(), text.size() - at));
          stopped = true;
        }
      }
      if (!it.cb.on_token(ev) || is_cancelled(it.id)) cancelled = !stopped;
      return !stopped && !cancelled;
    });
    fin.metrics.total_seconds = std::chrono::duration<double>(Clock::now() - it.t0).count();
    if (!stopped && !cancelled) fin.tail_text = dec.flush();
    if (!stats.ok()) {
      fin.finish_reason = "error";
      fin.error = stats.error();
    } else {
      fin.finish_reason = stopped ? "stop" : cancelled ? "cancelled" : stats->finish_reason;
    }
    it.cb.on_finish(fin);
  }

  std::unique_ptr<Model> model_;
  tokenizer::Tokenizer tok_;
  KvSetupReport report_;
  ModelInfo info_;
  ThreadPool pool_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  std::vector<RequestId> cancelled_;
  bool stopping_ = false, cancel_all_ = false, busy_ = false;
  std::thread thread_;
};

}  // namespace

Result<std::unique_ptr<Engine>> Engine::create(const EngineConfig& cfg) {
  auto path = resolve_model_path(cfg.model);
  if (!path) return Error{path.error()};
  LoadOptions lo;
  lo.max_batch_tokens = static_cast<int32_t>(cfg.kv.chunked_prefill_size);
  auto model = load_model(*path, lo);
  if (!model) return Error{model.error()};
  auto kv = setup_kv_cache(**model, cfg.kv);
  if (!kv) return Error{kv.error()};
  auto tok = tokenizer::Tokenizer::from_gguf((*model)->file());
  if (!tok) return Error{tok.error()};
  ModelInfo info;
  info.path = *path;
  info.id = path->substr(path->find_last_of('/') + 1);
  info.arch = (*model)->hparams().arch;
  info.n_vocab = (*model)->hparams().n_vocab;
  info.max_model_len = kv->report.max_model_len;
  if (auto t = (*model)->file().get_string("tokenizer.chat_template")) info.chat_template = *t;
  std::unique_ptr<Engine> e = std::make_unique<StubEngine>(
      std::move(*model), std::move(*tok), kv->report, std::move(info), cfg.threads);
  return e;
}

}  // namespace bie
