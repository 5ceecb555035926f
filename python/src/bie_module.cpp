// _bie: the native half of the benni_inference Python SDK. Wraps bie::Engine (one engine thread,
// continuous batching) for Python: submit a batch and wait for it with the GIL released,
// streaming through a blocking iterator, Ctrl-C turned into cancellation, engine errors turned
// into Python exceptions. The Python package (python/benni_inference) holds the user-facing
// classes and validation; this module takes plain dicts and lists.
// Thread-safety: an Engine object may be used from several Python threads at once; callbacks run
// on the engine thread, touch only C++ state under a mutex and never take the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bie/backend/device.h"
#include "bie/engine/engine.h"
#include "bie/engine/kv_setup.h"
#include "bie/engine/model_path.h"
#include "bie/planner/kv_layer_map.h"
#include "bie/planner/kv_layout_flags.h"
#include "bie/tokenizer/chat_template.h"
#include "bie/tokenizer/tokenizer.h"

namespace py = pybind11;

namespace bie::python {

namespace {

// Raised for budget refusals; registered as benni_inference.BieOutOfMemory (a MemoryError).
struct OutOfMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// How long a waiting call sleeps between checks for Ctrl-C.
constexpr auto kSignalPoll = std::chrono::milliseconds(50);

template <class T>
T get_or(const py::dict& d, const char* key, T fallback) {
  if (!d.contains(key) || d[key].is_none()) return fallback;
  return d[key].cast<T>();
}

std::optional<uint64_t> byte_size(const py::dict& d, const char* key) {
  if (!d.contains(key) || d[key].is_none()) return std::nullopt;
  py::handle v = d[key];
  if (py::isinstance<py::int_>(v)) {
    const auto n = v.cast<int64_t>();
    if (n <= 0) throw py::value_error(std::string(key) + " must be > 0 bytes");
    return static_cast<uint64_t>(n);
  }
  auto b = parse_byte_size(v.cast<std::string>());
  if (!b) throw py::value_error(std::string(key) + ": " + b.error());
  return *b;
}

EngineConfig engine_config_from(const py::dict& d) {
  EngineConfig c;
  c.model = get_or<std::string>(d, "model", "default");
  planner::KvLayoutFlags& f = c.kv.kv;
  f.dtype = get_or<std::string>(d, "kv_cache_dtype", f.dtype);
  f.dtype_k = get_or<std::string>(d, "kv_cache_dtype_k", "");
  f.dtype_v = get_or<std::string>(d, "kv_cache_dtype_v", "");
  f.group_size = get_or<int>(d, "kv_group_size", f.group_size);
  f.block_size = get_or<int>(d, "paged_block_size", f.block_size);
  f.sink_tokens = get_or<int>(d, "kv_sink_tokens", f.sink_tokens);
  f.window_tokens = get_or<int>(d, "kv_window_tokens", f.window_tokens);
  if (d.contains("kv_rotate") && !d["kv_rotate"].is_none()) f.rotate = d["kv_rotate"].cast<bool>();
  if (const std::string map = get_or<std::string>(d, "kv_layer_map", ""); !map.empty()) {
    auto layers = planner::read_kv_layer_map(map);
    if (!layers) throw py::value_error(layers.error());
    f.layer_map = *layers;
  }
  c.kv.max_model_len = get_or<int64_t>(d, "max_model_len", 0);
  c.kv.max_num_seqs = get_or<int64_t>(d, "max_num_seqs", c.kv.max_num_seqs);
  c.kv.chunked_prefill_size = get_or<int64_t>(d, "chunked_prefill_size", c.kv.chunked_prefill_size);
  c.kv.gpu_memory_utilization =
      get_or<double>(d, "gpu_memory_utilization", c.kv.gpu_memory_utilization);
  c.kv.kv_cache_memory = byte_size(d, "kv_cache_memory");
  c.kv.device_memory = byte_size(d, "device_memory");
  c.threads = get_or<int32_t>(d, "threads", 0);
  c.max_num_batched_tokens = get_or<int64_t>(d, "max_num_batched_tokens", 0);
  c.enable_prefix_caching = get_or<bool>(d, "enable_prefix_caching", true);
  c.max_queue = get_or<int64_t>(d, "max_queue", c.max_queue);
  c.check_integrity = get_or<bool>(d, "check_integrity", false);
  c.speculative_draft_tokens = get_or<int32_t>(d, "speculative_draft_tokens", 0);
  c.speculative_ngram_min = get_or<int32_t>(d, "speculative_ngram_min", c.speculative_ngram_min);
  c.speculative_ngram_max = get_or<int32_t>(d, "speculative_ngram_max", c.speculative_ngram_max);
  c.speculative_adaptive = get_or<bool>(d, "speculative_adaptive", false);
  c.speculative_model = get_or<std::string>(d, "speculative_model", "");
  c.speculative_lookup = get_or<bool>(d, "speculative_lookup", true);
  c.speculative_always = get_or<bool>(d, "speculative_always", false);
  c.speculative_draft_vocab = get_or<int32_t>(d, "speculative_draft_vocab", 0);
  c.kv_regimes = get_or<std::vector<std::string>>(d, "kv_regimes", {});
  c.kv_policy = get_or<std::string>(d, "kv_policy", "");
  c.kv_fallback_entropy = get_or<double>(d, "kv_fallback_entropy", 0.0);
  c.kv_fallback_regime = get_or<std::string>(d, "kv_fallback_regime", c.kv_fallback_regime);
  // auto/cpu/vulkan[:N] as the CLI's --device: a device that is not here is a ValueError.
  auto device = backend_for_device(get_or<std::string>(d, "device", "auto"));
  if (!device) throw py::value_error(device.error());
  c.device = *device;

  // Argument errors the engine would only report as a failed start: name them as ValueError.
  if (auto layout = planner::resolve_kv_layout(f); !layout) throw py::value_error(layout.error());
  if (auto path = resolve_model_path(c.model); !path) throw py::value_error(path.error());
  return c;
}

EngineRequest request_from(std::vector<int32_t> prompt, const py::dict& d) {
  EngineRequest r;
  r.prompt = std::move(prompt);
  SamplingParams& s = r.sampling;
  s.temperature = get_or<float>(d, "temperature", s.temperature);
  s.top_k = get_or<int32_t>(d, "top_k", s.top_k);
  s.top_p = get_or<float>(d, "top_p", s.top_p);
  s.min_p = get_or<float>(d, "min_p", s.min_p);
  s.repetition_penalty = get_or<float>(d, "repetition_penalty", s.repetition_penalty);
  s.presence_penalty = get_or<float>(d, "presence_penalty", s.presence_penalty);
  s.frequency_penalty = get_or<float>(d, "frequency_penalty", s.frequency_penalty);
  s.penalty_last_n = get_or<int32_t>(d, "penalty_last_n", s.penalty_last_n);
  s.seed = get_or<uint64_t>(d, "seed", s.seed);
  if (Status st = s.validate(); !st) throw py::value_error(st.error());
  r.max_tokens = get_or<int32_t>(d, "max_tokens", r.max_tokens);
  r.stop = get_or<std::vector<std::string>>(d, "stop", {});
  r.ignore_eos = get_or<bool>(d, "ignore_eos", false);
  r.logprobs = get_or<int32_t>(d, "logprobs", -1);
  r.kv_cache_dtype = get_or<std::string>(d, "kv_cache_dtype", "");
  return r;
}

[[noreturn]] void throw_submit_failure(const SubmitFailure& f) {
  switch (f.kind) {
    case SubmitError::kInvalid:
      throw py::value_error(f.message);
    case SubmitError::kTooLong:
      throw OutOfMemory(f.message);
    case SubmitError::kQueueFull:
      throw std::runtime_error("request queue full: " + f.message);
    case SubmitError::kShuttingDown:
      break;
  }
  throw std::runtime_error("the engine is closed: " + f.message);
}

// What one request has produced so far; written by the engine thread under Batch::mu.
struct Output {
  RequestId id = 0;
  std::vector<int32_t> tokens;
  std::string text;
  std::deque<std::string> pending;  // text pieces not yet taken by a stream
  std::vector<float> logprobs;
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;
  bool finished = false;
  FinishEvent finish;
};

// Requests waited on together. Shared with the engine callbacks, so it outlives an interrupted
// wait.
struct Batch {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Output> outs;
  size_t n_finished = 0;

  [[nodiscard]] bool done() const { return n_finished == outs.size(); }
};

RequestCallbacks callbacks_for(const std::shared_ptr<Batch>& batch, size_t i) {
  RequestCallbacks cb;
  cb.on_token = [batch, i](const TokenEvent& ev) {
    std::lock_guard lk(batch->mu);
    Output& o = batch->outs[i];
    o.tokens.push_back(ev.token);
    o.text += ev.text;
    if (!ev.text.empty()) o.pending.push_back(ev.text);
    o.logprobs.push_back(ev.logprob);
    if (!ev.top.empty()) {
      auto& alts = o.top_logprobs.emplace_back();
      for (const TopLogprob& t : ev.top) alts.emplace_back(t.token, t.logprob);
    }
    batch->cv.notify_all();
    return true;
  };
  cb.on_finish = [batch, i](const FinishEvent& ev) {
    std::lock_guard lk(batch->mu);
    Output& o = batch->outs[i];
    o.finish = ev;
    o.text += ev.tail_text;
    if (!ev.tail_text.empty()) o.pending.push_back(ev.tail_text);
    o.finished = true;
    ++batch->n_finished;
    batch->cv.notify_all();
  };
  return cb;
}

py::dict to_dict(const Output& o, bool with_logprobs) {
  const RequestMetrics& m = o.finish.metrics;
  py::dict metrics;
  metrics["prompt_tokens"] = m.prompt_tokens;
  metrics["cached_tokens"] = m.cached_tokens;
  metrics["generated_tokens"] = m.generated_tokens;
  metrics["preemptions"] = m.preemptions;
  metrics["queue_seconds"] = m.queue_seconds;
  metrics["ttft"] = m.ttft_seconds;
  metrics["total_seconds"] = m.total_seconds;
  metrics["tokens_per_second"] = m.decode_tps();
  metrics["kv_regime"] = m.kv_regime;
  metrics["draft_tokens"] = m.draft_tokens;
  metrics["accepted_tokens"] = m.accepted_tokens;
  metrics["acceptance_rate"] = m.draft_tokens > 0 ? py::cast(m.acceptance_rate()) : py::none();
  metrics["attn_entropy"] = m.attn_entropy >= 0 ? py::cast(m.attn_entropy) : py::none();
  metrics["kv_fallback"] = m.kv_fallback;
  py::dict d;
  d["text"] = o.text;
  d["token_ids"] = o.tokens;
  d["finish_reason"] = o.finish.finish_reason;
  d["error"] = o.finish.error;
  d["metrics"] = metrics;
  if (with_logprobs) {
    d["logprobs"] = o.logprobs;
    d["top_logprobs"] = o.top_logprobs;
  }
  return d;
}

// The engine, shared by the Python object and its live streams. close() shuts the engine down
// and drops this reference; the Engine (and its threads) goes away with the last user.
class EngineHandle {
 public:
  explicit EngineHandle(const py::dict& cfg_dict) {
    const EngineConfig cfg = engine_config_from(cfg_dict);
    Result<std::unique_ptr<Engine>> e = Error{};
    CreateError kind = CreateError::kInvalidConfig;
    {
      py::gil_scoped_release nogil;
      e = Engine::create(cfg, &kind);
    }
    if (!e) {
      const std::string& msg = e.error();
      switch (kind) {
        case CreateError::kOutOfBudget:
          throw OutOfMemory(msg);
        case CreateError::kInvalidConfig:
          throw py::value_error(msg);
        case CreateError::kModel:
          break;
      }
      throw std::runtime_error(msg);
    }
    engine_ = std::shared_ptr<Engine>(std::move(*e));
    if (auto t = tokenizer::ChatTemplate::detect(engine_->model_info().chat_template,
                                                 engine_->tokenizer())) {
      chat_ = std::move(*t);
    } else {
      chat_error_ = t.error();
    }
  }

  ~EngineHandle() { close(); }

  // The engine, or RuntimeError once closed.
  [[nodiscard]] std::shared_ptr<Engine> get() const {
    std::lock_guard lk(mu_);
    if (!engine_) throw std::runtime_error("the engine is closed");
    return engine_;
  }

  void close() {
    std::shared_ptr<Engine> e;
    {
      std::lock_guard lk(mu_);
      e.swap(engine_);
    }
    if (!e) return;
    py::gil_scoped_release nogil;
    e->shutdown(false);
    e.reset();  // joins the engine's threads unless a stream still holds it
  }

  [[nodiscard]] bool closed() const {
    std::lock_guard lk(mu_);
    return !engine_;
  }

  [[nodiscard]] RequestId next_id() { return next_id_.fetch_add(1); }

  // Submits every prompt, then waits for all of them with the GIL released. Ctrl-C (or any
  // pending Python signal that raises) cancels the whole batch and re-raises.
  py::list generate(const std::vector<std::vector<int32_t>>& prompts, const py::dict& params) {
    std::vector<EngineRequest> reqs;
    reqs.reserve(prompts.size());
    for (const auto& p : prompts) {
      if (p.empty()) throw py::value_error("empty prompt: give at least one token");
      reqs.push_back(request_from(p, params));
    }
    const bool with_logprobs = reqs.empty() ? false : reqs[0].logprobs >= 0;
    std::shared_ptr<Engine> engine = get();
    auto batch = std::make_shared<Batch>();
    batch->outs.resize(reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) batch->outs[i].id = next_id();

    // Submit all before waiting, so the scheduler batches them.
    for (size_t i = 0; i < reqs.size(); ++i) {
      auto fail = engine->submit(batch->outs[i].id, std::move(reqs[i]), callbacks_for(batch, i));
      if (fail) {
        {
          std::lock_guard lk(batch->mu);
          // Requests never accepted count as finished; cancel the accepted ones.
          batch->n_finished += reqs.size() - i;
          for (size_t j = i; j < reqs.size(); ++j) batch->outs[j].finished = true;
        }
        cancel_and_drain(*engine, *batch, i);
        throw_submit_failure(*fail);
      }
    }
    wait_all(*engine, *batch);

    py::list out;
    std::lock_guard lk(batch->mu);
    for (const Output& o : batch->outs) {
      if (o.finish.finish_reason == "error") throw std::runtime_error(o.finish.error);
      out.append(to_dict(o, with_logprobs));
    }
    return out;
  }

  [[nodiscard]] std::vector<int32_t> tokenize(const std::string& text, bool add_special,
                                              bool parse_special) const {
    std::shared_ptr<Engine> e = get();
    tokenizer::EncodeOptions o;
    o.add_special = add_special;
    o.parse_special = parse_special;
    py::gil_scoped_release nogil;
    return e->tokenizer().encode(text, o);
  }

  [[nodiscard]] std::string detokenize(const std::vector<int32_t>& ids, bool skip_special) const {
    std::shared_ptr<Engine> e = get();
    const int32_t n = e->tokenizer().n_tokens();
    for (int32_t id : ids) {
      if (id < 0 || id >= n)
        throw py::value_error("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                              std::to_string(n) + ")");
    }
    tokenizer::DecodeOptions o;
    o.render_special = !skip_special;
    return e->tokenizer().decode(ids, o);
  }

  // The chat prompt as token ids and the family's end-of-turn text.
  [[nodiscard]] std::pair<std::vector<int32_t>, std::string> render_chat(
      const std::vector<std::pair<std::string, std::string>>& messages) const {
    std::shared_ptr<Engine> e = get();
    if (!chat_) throw std::runtime_error("this model has no usable chat template: " + chat_error_);
    std::vector<tokenizer::ChatMessage> msgs;
    for (const auto& [role, content] : messages) msgs.push_back({role, content});
    auto text = chat_->render(msgs);
    if (!text) throw py::value_error(text.error());
    tokenizer::EncodeOptions o;
    o.add_special = false;  // the template writes BOS itself where the family wants it
    o.parse_special = true;
    return {e->tokenizer().encode(*text, o), chat_->end_of_turn()};
  }

  [[nodiscard]] std::string chat_template_name() const { return chat_ ? chat_->name() : ""; }

  [[nodiscard]] py::dict plan() const {
    std::shared_ptr<Engine> e = get();
    const KvSetupReport& r = e->kv_report();
    py::dict d;
    d["kv_regime"] = r.layout_label;
    d["max_model_len"] = r.max_model_len;
    d["max_num_seqs"] = r.max_num_seqs;
    d["chunked_prefill_size"] = r.chunked_prefill_size;
    d["explicit_kv_memory"] = r.explicit_kv_memory;
    d["device_bytes"] = r.device_bytes;
    d["utilization"] = r.utilization;
    d["usable_bytes"] = r.usable_bytes;
    d["weights_bytes"] = r.weights_bytes;
    d["workspace_bytes"] = r.workspace_bytes;
    d["kv_budget_bytes"] = r.kv_budget_bytes;
    d["kv_pool_bytes"] = r.kv_pool_bytes();
    d["fp16_blocks"] = r.fp16_blocks;
    d["body_blocks"] = r.body_blocks;
    d["fp16_block_bytes"] = r.fp16_block_bytes;
    d["body_block_bytes"] = r.body_block_bytes;
    d["block_size"] = r.layout.block_size;
    d["bytes_per_token"] = r.bytes_per_token;
    d["seq_bytes"] = r.seq_bytes;
    d["tokens_fit"] = r.tokens_fit;
    d["max_concurrency"] = r.max_concurrency;
    d["report"] = format_kv_report(r);
    return d;
  }

  [[nodiscard]] py::dict model_info() const {
    std::shared_ptr<Engine> e = get();
    const ModelInfo& m = e->model_info();
    py::dict d;
    d["id"] = m.id;
    d["path"] = m.path;
    d["sha256"] = m.sha256;
    d["arch"] = m.arch;
    d["max_model_len"] = m.max_model_len;
    d["n_vocab"] = m.n_vocab;
    d["chat_template"] = chat_template_name();
    return d;
  }

  // The KV regimes, the length policy and the kill switch (Engine::kv_policy).
  [[nodiscard]] py::dict kv_policy() const {
    std::shared_ptr<Engine> e = get();
    const KvPolicyInfo p = e->kv_policy();
    py::dict d;
    d["force_f16"] = p.force_f16;
    d["policy"] = p.policy;
    d["budget_bytes"] = p.budget_bytes;
    py::list regimes;
    for (const KvRegimeInfo& r : p.regimes) {
      py::dict rd;
      rd["name"] = r.name;
      rd["kv"] = r.label;
      rd["max_tokens"] = r.tokens_fit;
      regimes.append(rd);
    }
    d["regimes"] = regimes;
    return d;
  }
  void set_force_f16(bool on) { get()->set_force_f16(on); }

  [[nodiscard]] py::dict metrics() const {
    std::shared_ptr<Engine> e = get();
    const EngineMetrics m = e->metrics();
    py::dict d;
    py::list pools;
    for (const auto& p : m.pools) {
      py::dict pd;
      pd["format"] = p.format;
      pd["blocks_total"] = p.blocks_total;
      pd["blocks_used"] = p.blocks_used;
      pd["blocks_cached"] = p.blocks_cached;
      pd["blocks_free"] = p.blocks_free;
      pools.append(pd);
    }
    d["pools"] = pools;
    d["requests_running"] = m.requests_running;
    d["requests_waiting"] = m.requests_waiting;
    d["requests_finished"] = m.requests_finished;
    d["prompt_tokens"] = m.prompt_tokens;
    d["computed_prompt_tokens"] = m.computed_prompt_tokens;
    d["generated_tokens"] = m.generated_tokens;
    d["prefix_queried_blocks"] = m.prefix_queried_blocks;
    d["prefix_hit_blocks"] = m.prefix_hit_blocks;
    d["preemptions"] = m.preemptions;
    d["admission_refusals"] = m.admission_refusals;
    d["steps"] = m.steps;
    d["batched_tokens"] = m.batched_tokens;
    d["batched_seqs"] = m.batched_seqs;
    d["kv_entropy_probes"] = m.kv_entropy_probes;
    d["kv_fallbacks"] = m.kv_fallbacks;
    return d;
  }

  // Blocks (GIL released) until the batch is done; on a Python signal cancels it and rethrows.
  static void wait_all(Engine& engine, Batch& batch) {
    for (;;) {
      {
        py::gil_scoped_release nogil;
        std::unique_lock lk(batch.mu);
        if (batch.cv.wait_for(lk, kSignalPoll, [&] { return batch.done(); })) return;
      }
      if (PyErr_CheckSignals() != 0) {
        cancel_and_drain(engine, batch, batch.outs.size());
        throw py::error_already_set();
      }
    }
  }

  // Cancels the first n requests of the batch and waits (GIL released) until all have finished,
  // so none is left running when the caller raises.
  static void cancel_and_drain(Engine& engine, Batch& batch, size_t n) {
    py::gil_scoped_release nogil;
    for (size_t i = 0; i < n; ++i) engine.cancel(batch.outs[i].id);
    std::unique_lock lk(batch.mu);
    batch.cv.wait(lk, [&] { return batch.done(); });
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<Engine> engine_;
  std::optional<tokenizer::ChatTemplate> chat_;
  std::string chat_error_;
  std::atomic<RequestId> next_id_{1};
};

// One streaming request: an iterator of text pieces. Dropping it (or close()) cancels the request.
class Stream {
 public:
  Stream(std::shared_ptr<EngineHandle> handle, std::vector<int32_t> prompt, const py::dict& params)
      : engine_(handle->get()), batch_(std::make_shared<Batch>()) {
    if (prompt.empty()) throw py::value_error("empty prompt: give at least one token");
    EngineRequest req = request_from(std::move(prompt), params);
    batch_->outs.resize(1);
    batch_->outs[0].id = handle->next_id();
    if (auto fail = engine_->submit(batch_->outs[0].id, std::move(req), callbacks_for(batch_, 0))) {
      batch_->outs[0].finished = true;
      batch_->n_finished = 1;
      throw_submit_failure(*fail);
    }
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() { cancel(); }

  // The next text piece; StopIteration at the end.
  std::string next() {
    for (;;) {
      std::optional<std::string> piece;
      bool finished = false;
      {
        py::gil_scoped_release nogil;
        std::unique_lock lk(batch_->mu);
        Output& o = batch_->outs[0];
        batch_->cv.wait_for(lk, kSignalPoll, [&] { return !o.pending.empty() || o.finished; });
        if (!o.pending.empty()) {
          piece = std::move(o.pending.front());
          o.pending.pop_front();
        } else {
          finished = o.finished;
        }
      }
      // Exceptions are raised with the GIL held.
      if (piece) return std::move(*piece);
      if (finished) {
        std::lock_guard lk(batch_->mu);
        const FinishEvent& f = batch_->outs[0].finish;
        if (f.finish_reason == "error" && !reported_error_) {
          reported_error_ = true;
          throw std::runtime_error(f.error);
        }
        throw py::stop_iteration();
      }
      if (PyErr_CheckSignals() != 0) {
        cancel();
        throw py::error_already_set();
      }
    }
  }

  // Cancels the request (if still running) and waits until the engine has let go of it.
  void cancel() {
    if (!engine_) return;
    EngineHandle::cancel_and_drain(*engine_, *batch_, 1);
  }

  [[nodiscard]] py::object result() const {
    std::lock_guard lk(batch_->mu);
    if (!batch_->outs[0].finished) return py::none();
    return to_dict(batch_->outs[0], false);
  }

 private:
  std::shared_ptr<Engine> engine_;
  std::shared_ptr<Batch> batch_;
  bool reported_error_ = false;
};

}  // namespace

}  // namespace bie::python

PYBIND11_MODULE(_bie, m) {
  using bie::python::EngineHandle;
  using bie::python::Stream;
  m.doc() = "Native core of benni_inference (BIE). Use the benni_inference package instead.";

  py::register_exception<bie::python::OutOfMemory>(m, "BieOutOfMemory", PyExc_MemoryError);

  py::class_<EngineHandle, std::shared_ptr<EngineHandle>>(m, "Engine")
      .def(py::init<const py::dict&>(), py::arg("config"))
      .def("generate", &EngineHandle::generate, py::arg("prompts"), py::arg("params"))
      .def(
          "stream",
          [](std::shared_ptr<EngineHandle> self, std::vector<int32_t> prompt,
             const py::dict& params) {
            return std::make_unique<Stream>(std::move(self), std::move(prompt), params);
          },
          py::arg("prompt"), py::arg("params"))
      .def("tokenize", &EngineHandle::tokenize, py::arg("text"), py::arg("add_special") = true,
           py::arg("parse_special") = false)
      .def("detokenize", &EngineHandle::detokenize, py::arg("ids"),
           py::arg("skip_special_tokens") = true)
      .def("render_chat", &EngineHandle::render_chat, py::arg("messages"))
      .def("plan", &EngineHandle::plan)
      .def("model_info", &EngineHandle::model_info)
      .def("metrics", &EngineHandle::metrics)
      .def("kv_policy", &EngineHandle::kv_policy)
      .def("set_force_f16", &EngineHandle::set_force_f16, py::arg("on"))
      .def("close", &EngineHandle::close)
      .def_property_readonly("closed", &EngineHandle::closed);

  py::class_<Stream>(m, "Stream")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &Stream::next)
      .def("cancel", &Stream::cancel)
      .def("result", &Stream::result);
}
