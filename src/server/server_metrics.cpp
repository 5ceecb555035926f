#include "server/server_metrics.h"

#include <fmt/format.h>

namespace bie::server {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  std::lock_guard lk(mu_);
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++n_;
}

uint64_t Histogram::count() const {
  std::lock_guard lk(mu_);
  return n_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  std::lock_guard lk(mu_);
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
  }
  cum += counts_.back();
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, cum);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, sum_, name, n_);
}

namespace {

std::vector<double> latency_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3,
          0.4,   0.5,    0.75,  1.0,  2.5,  5.0,  7.5,  10,   20,  40,   80};
}

void gauge(std::string& out, const std::string& name, const std::string& help,
           const std::string& type) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

}  // namespace

std::string escape_label_value(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string_view route_label(std::string_view path) {
  static constexpr std::string_view kRoutes[] = {
      "/v1/completions", "/v1/chat/completions", "/v1/responses",      "/v1/models", "/health",
      "/metrics",        "/admin/kv-policy",     "/admin/prefix-cache"};
  for (std::string_view r : kRoutes) {
    if (path == r) return r;
  }
  return "other";
}

ServerMetrics::ServerMetrics()
    : ttft_(latency_bounds()), itl_(latency_bounds()), e2e_(latency_bounds()) {}

void ServerMetrics::count_response(std::string_view path, int status) {
  // A fixed label set: a client choosing paths can neither inject text nor grow the page.
  const std::string_view route = route_label(path);
  std::lock_guard lk(mu_);
  ++responses_[{std::string(route), status}];
}

std::string ServerMetrics::render(const EngineMetrics* m, const std::string& model) const {
  std::string out;
  const std::string lbl = fmt::format("model=\"{}\"", escape_label_value(model));
  gauge(out, "bie_model_loaded", "1 once the model is loaded and requests are served", "gauge");
  out += fmt::format("bie_model_loaded{{{}}} {}\n", lbl, m != nullptr ? 1 : 0);
  if (m != nullptr) {
    gauge(out, "bie_kv_blocks_total", "KV blocks in each pool", "gauge");
    for (const auto& p : m->pools) {
      out += fmt::format("bie_kv_blocks_total{{format=\"{}\"}} {}\n", p.format, p.blocks_total);
    }
    gauge(out, "bie_kv_blocks_used", "KV blocks held by sequences", "gauge");
    for (const auto& p : m->pools) {
      out += fmt::format("bie_kv_blocks_used{{format=\"{}\"}} {}\n", p.format, p.blocks_used);
    }
    gauge(out, "bie_kv_blocks_free", "KV blocks not held by sequences (cached included)", "gauge");
    for (const auto& p : m->pools) {
      out += fmt::format("bie_kv_blocks_free{{format=\"{}\"}} {}\n", p.format, p.blocks_free);
    }
    gauge(out, "bie_kv_blocks_cached", "free KV blocks holding prefix-cache content", "gauge");
    for (const auto& p : m->pools) {
      out += fmt::format("bie_kv_blocks_cached{{format=\"{}\"}} {}\n", p.format, p.blocks_cached);
    }
    const auto counter = [&](const char* name, const char* help, int64_t v) {
      gauge(out, name, help, "counter");
      out += fmt::format("{} {}\n", name, v);
    };
    const auto counter_f = [&](const char* name, const char* help, double v) {
      gauge(out, name, help, "counter");
      out += fmt::format("{} {}\n", name, v);
    };
    const auto plain_gauge = [&](const char* name, const char* help, double v) {
      gauge(out, name, help, "gauge");
      out += fmt::format("{} {}\n", name, v);
    };
    plain_gauge("bie_device_memory_bytes",
                "device-local buffers held on the GPU (weights, workspace, KV pools); 0 on the CPU",
                static_cast<double>(m->device_bytes));
    plain_gauge("bie_device_memory_peak_bytes", "most device-local bytes held since start",
                static_cast<double>(m->device_peak_bytes));
    counter("bie_prefix_cache_queried_blocks_total", "full prompt blocks looked up",
            m->prefix_queried_blocks);
    counter("bie_prefix_cache_hit_blocks_total", "prompt blocks found in the prefix cache",
            m->prefix_hit_blocks);
    plain_gauge("bie_prefix_cache_hit_rate", "hit blocks / queried blocks since start",
                m->prefix_queried_blocks > 0 ? static_cast<double>(m->prefix_hit_blocks) /
                                                   static_cast<double>(m->prefix_queried_blocks)
                                             : 0.0);
    counter("bie_preemptions_total", "sequences preempted (blocks freed, recomputed later)",
            m->preemptions);
    counter("bie_kv_entropy_probes_total",
            "requests whose attention entropy was measured at the prompt's last token "
            "(--kv-fallback-entropy)",
            m->kv_entropy_probes);
    counter("bie_kv_fallbacks_total",
            "requests recomputed in the fallback KV regime because their attention was spiky",
            m->kv_fallbacks);
    counter("bie_spec_steps_total", "sequence-steps that verified speculative drafts",
            m->spec_steps);
    counter("bie_spec_draft_tokens_total", "speculative draft tokens verified", m->draft_tokens);
    counter("bie_spec_accepted_tokens_total", "speculative draft tokens accepted",
            m->accepted_tokens);
    plain_gauge("bie_spec_acceptance_rate", "accepted / drafted tokens since start",
                m->draft_tokens > 0
                    ? static_cast<double>(m->accepted_tokens) / static_cast<double>(m->draft_tokens)
                    : 0.0);
    plain_gauge("bie_spec_mean_accepted_per_step", "accepted draft tokens per speculative step",
                m->spec_steps > 0
                    ? static_cast<double>(m->accepted_tokens) / static_cast<double>(m->spec_steps)
                    : 0.0);
    counter_f("bie_spec_drafter_seconds_total", "time spent proposing drafts", m->drafter_seconds);
    counter("bie_admission_refusals_total", "requests refused at submit (queue full, too long)",
            m->admission_refusals);
    plain_gauge("bie_kv_force_f16", "1 while the KV kill switch sends new requests to f16",
                m->force_f16 ? 1.0 : 0.0);
    plain_gauge("bie_requests_running", "requests holding KV blocks",
                static_cast<double>(m->requests_running));
    plain_gauge("bie_requests_waiting", "requests queued for admission",
                static_cast<double>(m->requests_waiting));
    counter("bie_requests_finished_total", "requests finished (any reason)", m->requests_finished);
    counter("bie_prompt_tokens_total", "prompt tokens of admitted requests", m->prompt_tokens);
    counter("bie_prompt_tokens_computed_total", "prompt tokens run through the model",
            m->computed_prompt_tokens);
    counter("bie_generation_tokens_total", "generated tokens", m->generated_tokens);
    counter("bie_engine_steps_total", "engine steps (batched forward passes)", m->steps);
    const double steps = static_cast<double>(m->steps);
    plain_gauge("bie_batch_tokens_mean", "mean tokens per engine step",
                steps > 0 ? static_cast<double>(m->batched_tokens) / steps : 0.0);
    plain_gauge("bie_batch_size_mean", "mean sequences per engine step",
                steps > 0 ? static_cast<double>(m->batched_seqs) / steps : 0.0);
    plain_gauge("bie_kv_usage_ratio", "KV budget held by running sequences, 0..1", m->kv_usage);

    // The same values under the Model Server Protocol's (vLLM's) names, which the Gateway API
    // Inference Extension / llm-d endpoint pickers and vLLM-aware dashboards read.
    const std::string mn = fmt::format("model_name=\"{}\"", escape_label_value(model));
    const auto msp = [&](const char* name, const char* help, double v) {
      gauge(out, name, help, "gauge");
      out += fmt::format("{}{{{}}} {}\n", name, mn, v);
    };
    msp("vllm:num_requests_running", "requests running (same as bie_requests_running)",
        static_cast<double>(m->requests_running));
    msp("vllm:num_requests_waiting", "requests waiting (same as bie_requests_waiting)",
        static_cast<double>(m->requests_waiting));
    msp("vllm:kv_cache_usage_perc", "KV cache usage, 0..1 (same as bie_kv_usage_ratio)",
        m->kv_usage);
    gauge(out, "vllm:cache_config_info", "KV cache configuration (value always 1)", "gauge");
    out += fmt::format("vllm:cache_config_info{{{},block_size=\"{}\",num_gpu_blocks=\"{}\"}} 1\n",
                       mn, m->kv_block_size, m->kv_blocks_default);
  }
  ttft_.render(out, "bie_time_to_first_token_seconds",
               "request arrival to first generated token, measured in the server");
  itl_.render(out, "bie_inter_token_latency_seconds",
              "time between consecutive generated tokens of a request");
  e2e_.render(out, "bie_request_duration_seconds", "request arrival to its last token");
  gauge(out, "bie_http_responses_total", "HTTP responses by route and status", "counter");
  std::lock_guard lk(mu_);
  for (const auto& [key, n] : responses_) {
    out += fmt::format("bie_http_responses_total{{route=\"{}\",status=\"{}\"}} {}\n", key.first,
                       key.second, n);
  }
  return out;
}

}  // namespace bie::server
