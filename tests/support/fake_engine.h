// FakeEngine: an Engine without a model, for testing the HTTP layer. Its tokenizer is byte-level
// (one token per byte, plus ChatML control tokens); each request "generates" its prompt tokens
// back in order (cyclically), one token per step on its own engine thread, with an optional
// delay per step. Submit refusals, EOS and blocks per request are configurable. Thread-safe as
// the Engine contract says.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "bie/engine/engine.h"
#include "bie/tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace bie::test {

// Byte-level GPT-2 style vocabulary: ids 0..255 are the bytes, then the control tokens.
inline tokenizer::Tokenizer byte_tokenizer() {
  using namespace bie::tokenizer;
  VocabData d;
  d.kind = VocabKind::kBpe;
  d.pre_name = "gpt-2";
  d.pre = PreType::kGpt2;
  // GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to 256 + n.
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    std::string s;
    unicode::append_utf8(s, printable ? static_cast<uint32_t>(b) : 256u + n++);
    d.tokens.push_back(s);
  }
  d.types.assign(256, TokenType::kNormal);
  for (const char* t : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    d.tokens.emplace_back(t);
    d.types.push_back(TokenType::kControl);
  }
  d.ids.bos = 256;
  d.ids.eos = 256;
  d.ids.eot = 258;
  auto v = Vocab::from_data(std::move(d));
  auto t = Tokenizer::from_vocab(std::move(v.value()));
  return std::move(t.value());
}

struct FakeEngineConfig {
  std::chrono::milliseconds step_delay{0};
  int64_t max_running = 4;
  int64_t max_queue = 8;
  int64_t max_model_len = 256;
  int64_t blocks_total = 64;
  int64_t block_size = 16;
  int32_t eos_after = -1;     // >= 0: emit EOS (finish "stop") after this many tokens
  std::string chat_template;  // what model_info().chat_template reports
};

class FakeEngine : public Engine {
 public:
  explicit FakeEngine(FakeEngineConfig cfg = {}) : cfg_(std::move(cfg)), tok_(byte_tokenizer()) {
    info_.id = "fake-model";
    info_.path = "/dev/null/fake-model.gguf";
    info_.sha256 = std::string(64, 'a');
    info_.arch = "fake";
    info_.chat_template = cfg_.chat_template;
    info_.max_model_len = cfg_.max_model_len;
    info_.n_vocab = tok_.n_tokens();
    report_.layout_label = "f16";
    report_.max_model_len = cfg_.max_model_len;
    thread_ = std::thread([this] { loop(); });
  }
  ~FakeEngine() override { shutdown(false); }

  const ModelInfo& model_info() const override { return info_; }
  const tokenizer::Tokenizer& tokenizer() const override { return tok_; }
  const KvSetupReport& kv_report() const override { return report_; }
  // Regimes "int4_asym" (default) and "f16" (the kill switch); a request may name either.
  std::string kv_regime() const override { return force_f16_ ? "f16" : "int4_asym"; }
  void set_force_f16(bool on) override { force_f16_ = on; }
  std::string kv_regime_for(const EngineRequest& req) const override {
    return force_f16_ ? "f16" : req.kv_cache_dtype.empty() ? "int4_asym" : req.kv_cache_dtype;
  }
  KvPolicyInfo kv_policy() const override {
    KvPolicyInfo p;
    p.force_f16 = force_f16_;
    p.regimes = {{"int4_asym", "int4_asym", 1000}, {"f16", "f16", 300}};
    p.budget_bytes = 1 << 20;
    return p;
  }

  std::optional<SubmitFailure> submit(RequestId id, EngineRequest req,
                                      RequestCallbacks cb) override {
    std::lock_guard lk(mu_);
    if (stopping_) return SubmitFailure{SubmitError::kShuttingDown, "engine is shutting down"};
    if (!req.kv_cache_dtype.empty() && req.kv_cache_dtype != "f16" &&
        req.kv_cache_dtype != "int4_asym") {
      ++refusals_;
      return SubmitFailure{SubmitError::kInvalid,
                           "kv_cache_dtype '" + req.kv_cache_dtype + "' is not a regime"};
    }
    if (static_cast<int64_t>(req.prompt.size()) > cfg_.max_model_len) {
      ++refusals_;
      return SubmitFailure{SubmitError::kTooLong, "prompt longer than max_model_len"};
    }
    if (static_cast<int64_t>(waiting_.size()) >= cfg_.max_queue) {
      ++refusals_;
      return SubmitFailure{SubmitError::kQueueFull, "queue full"};
    }
    Req r;
    r.id = id;
    r.regime = force_f16_ ? "f16" : req.kv_cache_dtype.empty() ? "int4_asym" : req.kv_cache_dtype;
    r.req = std::move(req);
    r.cb = std::move(cb);
    r.submitted = std::chrono::steady_clock::now();
    prompt_tokens_ += static_cast<int64_t>(r.req.prompt.size());
    waiting_.push_back(std::move(r));
    submitted_ids_.push_back(id);
    cv_.notify_all();
    return std::nullopt;
  }

  void cancel(RequestId id) override {
    std::lock_guard lk(cancel_mu_);  // not mu_: callbacks (called under mu_) may cancel
    cancelled_.push_back(id);
  }

  std::vector<PrefixCacheListing> prefix_cache_index() override { return {}; }
  EngineMetrics metrics() const override {
    std::lock_guard lk(mu_);
    EngineMetrics m;
    EngineMetrics::Pool p;
    p.format = "f16";
    p.blocks_total = cfg_.blocks_total;
    for (const Req& r : running_) p.blocks_used += blocks_of(r);
    p.blocks_free = p.blocks_total - p.blocks_used;
    m.pools.push_back(p);
    m.requests_running = static_cast<int64_t>(running_.size());
    m.force_f16 = force_f16_;
    m.requests_waiting = static_cast<int64_t>(waiting_.size());
    m.requests_finished = finished_;
    m.prompt_tokens = prompt_tokens_;
    m.computed_prompt_tokens = prompt_tokens_;
    m.generated_tokens = generated_;
    m.admission_refusals = refusals_;
    m.prefix_queried_blocks = 10;
    m.prefix_hit_blocks = 4;
    m.steps = steps_;
    m.batched_tokens = batched_;
    m.batched_seqs = batched_;
    return m;
  }

  void shutdown(bool finish_running) override {
    {
      std::lock_guard lk(mu_);
      if (stopping_ && !thread_.joinable()) return;
      stopping_ = true;
      finish_running_ = finish_running;
      cv_.notify_all();
    }
    if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id()) thread_.join();
  }

  void wait_idle() override {
    std::unique_lock lk(mu_);
    idle_cv_.wait(lk, [&] { return running_.empty() && waiting_.empty(); });
  }

  // Test hooks.
  std::vector<RequestId> cancelled_ids() const {
    std::lock_guard lk(cancel_mu_);
    return cancelled_;
  }
  std::vector<RequestId> submitted_ids() const {
    std::lock_guard lk(mu_);
    return submitted_ids_;
  }
  const EngineRequest& last_request() const { return last_request_; }

 private:
  struct Req {
    RequestId id = 0;
    EngineRequest req;
    RequestCallbacks cb;
    int32_t produced = 0;
    std::string text;
    std::chrono::steady_clock::time_point submitted;
    double ttft = 0.0;
    std::string regime;
  };

  int64_t blocks_of(const Req& r) const {
    const int64_t t = static_cast<int64_t>(r.req.prompt.size()) + r.produced;
    return (t + cfg_.block_size - 1) / cfg_.block_size;
  }

  void finish(Req& r, const std::string& reason) {
    FinishEvent f;
    f.finish_reason = reason;
    f.metrics.prompt_tokens = static_cast<int64_t>(r.req.prompt.size());
    f.metrics.cached_tokens = 0;
    f.metrics.generated_tokens = r.produced;
    f.metrics.ttft_seconds = r.ttft;
    f.metrics.total_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - r.submitted).count();
    f.metrics.kv_regime = r.regime;
    r.cb.on_finish(f);
  }

  // One token for r; returns false when r is done.
  bool step_one(Req& r) {
    const int32_t max_tokens = r.req.max_tokens > 0 ? r.req.max_tokens : 16;
    if (r.produced >= max_tokens) {
      finish(r, "length");
      return false;
    }
    if (cfg_.eos_after >= 0 && r.produced >= cfg_.eos_after) {
      finish(r, "stop");
      return false;
    }
    TokenEvent ev;
    ev.token = r.req.prompt.empty() ? 'x' : r.req.prompt[r.produced % r.req.prompt.size()];
    ev.text = std::string(tok_.token_to_piece(ev.token));
    r.text += ev.text;
    if (r.req.logprobs >= 0) {
      ev.logprob = -0.5f;
      for (int k = 0; k < r.req.logprobs; ++k) ev.top.push_back({ev.token + k, -0.5f - k});
    }
    if (r.produced == 0) {
      r.ttft =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - r.submitted).count();
    }
    ++r.produced;
    ++generated_;
    for (const std::string& s : r.req.stop) {
      if (!s.empty() && r.text.find(s) != std::string::npos) {
        finish(r, "stop");
        return false;
      }
    }
    if (!r.cb.on_token(ev)) {
      finish(r, "cancelled");
      return false;
    }
    return true;
  }

  void loop() {
    std::unique_lock lk(mu_);
    for (;;) {
      cv_.wait_for(lk, std::chrono::milliseconds(50),
                   [&] { return stopping_ || !waiting_.empty() || !running_.empty(); });
      std::vector<RequestId> cancelled;
      {
        std::lock_guard ck(cancel_mu_);
        cancelled = cancelled_;
      }
      if (stopping_) {
        for (Req& r : waiting_) finish(r, "cancelled");
        waiting_.clear();
        if (!finish_running_) {
          for (Req& r : running_) finish(r, "cancelled");
          running_.clear();
        }
        if (running_.empty()) {
          idle_cv_.notify_all();
          return;
        }
      }
      while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < cfg_.max_running) {
        last_request_ = waiting_.front().req;
        running_.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
      }
      // Cancellations (ids are never reused, so a stale id matches nothing).
      for (auto it = running_.begin(); it != running_.end();) {
        if (std::find(cancelled.begin(), cancelled.end(), it->id) != cancelled.end()) {
          finish(*it, "cancelled");
          it = running_.erase(it);
        } else {
          ++it;
        }
      }
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        if (std::find(cancelled.begin(), cancelled.end(), it->id) != cancelled.end()) {
          finish(*it, "cancelled");
          it = waiting_.erase(it);
        } else {
          ++it;
        }
      }
      if (!running_.empty()) {
        ++steps_;
        batched_ += static_cast<int64_t>(running_.size());
        lk.unlock();
        if (cfg_.step_delay.count() > 0) std::this_thread::sleep_for(cfg_.step_delay);
        lk.lock();
        for (auto it = running_.begin(); it != running_.end();) {
          if (!step_one(*it)) {
            ++finished_;
            it = running_.erase(it);
          } else {
            ++it;
          }
        }
      }
      if (running_.empty() && waiting_.empty()) idle_cv_.notify_all();
    }
  }

  std::atomic<bool> force_f16_{false};
  FakeEngineConfig cfg_;
  tokenizer::Tokenizer tok_;
  ModelInfo info_;
  KvSetupReport report_;
  mutable std::mutex mu_;
  mutable std::mutex cancel_mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<Req> waiting_;
  std::deque<Req> running_;
  std::vector<RequestId> cancelled_;
  std::vector<RequestId> submitted_ids_;
  EngineRequest last_request_;
  bool stopping_ = false;
  bool finish_running_ = true;
  int64_t finished_ = 0, prompt_tokens_ = 0, generated_ = 0, refusals_ = 0, steps_ = 0,
          batched_ = 0;
  std::thread thread_;
};

}  // namespace bie::test
