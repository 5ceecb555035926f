// bie-serve: the OpenAI-compatible HTTP server. Listens first (so /health answers 503 while the
// model loads), loads the Engine on a helper thread, prints the start-up report, then serves
// until SIGTERM/SIGINT: stop accepting, let running requests finish, exit 0.
#include <pthread.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "bie/engine/engine.h"
#include "bie/engine/model_path.h"
#include "bie/server/kv_event_publisher.h"
#include "bie/server/server.h"
#include "bie/template/jinja.h"
#include "bie/tokenizer/chat_template.h"
#include "cli/kv_options.h"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitBadInput = 2;

struct ServeArgs {
  std::string model = "default";
  bie::server::ServerConfig server;
  bie::cli::KvCliFlags kv;
  int32_t threads = 0;
  int64_t max_num_batched_tokens = 0;
  int64_t max_queue = 256;
  bool prefix_caching = true;
  int32_t spec_tokens = 0;
  std::string spec_ngram = "2:3";
  bool spec_adaptive = false;
  std::string spec_model;
  int32_t spec_vocab = 0;
  bool spec_no_lookup = false;
  std::string kv_policy;
  std::vector<std::string> kv_regimes;
  double kv_fallback_entropy = 0;
  std::string kv_fallback_regime = "int8";
  bool spec_always = false;
  double drain_seconds = 30;
  std::string chat_template_file;
  std::string kv_events_endpoint;
  std::string kv_events_replay_endpoint;
  std::string kv_events_pod_id;
  std::string kv_events_topic;
};

// The whole file, or nullopt if it cannot be read.
std::optional<std::string> read_text(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return std::nullopt;
  std::string s;
  char buf[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  std::fclose(f);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  ServeArgs a;
  a.kv.opts.max_num_seqs = 16;  // a server holds many sequences; `bie run` holds one
  CLI::App app{"bie-serve — OpenAI-compatible server for the Benni Inference Engine"};
  app.set_version_flag("--version", "bie-serve 0.1.0");
  app.add_option("-m,--model", a.model, "GGUF file, or 'default' (SmolLM2-135M-Instruct Q4_1)")
      ->capture_default_str();
  app.add_option("--host", a.server.host, "address to listen on")->capture_default_str();
  app.add_option("--port", a.server.port, "TCP port (0: any free port)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option("--api-key", a.server.api_key,
                 "require 'Authorization: Bearer KEY' on /v1/* (default: no auth)");
  app.add_option("--served-model-name", a.server.served_model_name,
                 "model name in /v1/models and responses (default: the file stem)");
  app.add_option("--max-queue", a.max_queue, "requests waiting for admission before 429")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--max-num-batched-tokens", a.max_num_batched_tokens,
                 "tokens one engine step may schedule (0: max(chunked prefill, max-num-seqs))")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", a.prefix_caching,
               "reuse KV blocks of identical prompt prefixes (default: on)");
  app.add_option("-t,--threads", a.threads, "compute threads (0: all cores)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--max-connections", a.server.max_connections,
                 "open HTTP connections at once (one thread each); the next gets 503")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  app.add_option("--max-body-bytes", a.server.max_body_bytes,
                 "largest request body, any transfer encoding (larger: 413)")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1024}, size_t{1} << 32));
  app.add_option("--header-timeout", a.server.header_timeout_seconds,
                 "seconds a client has to send its request headers (then 408)")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--body-timeout", a.server.body_timeout_seconds,
                 "seconds a client has to send its request body after the headers (then 408)")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--drain-timeout", a.drain_seconds,
                 "on SIGTERM/SIGINT: seconds running requests get to finish before they are "
                 "cancelled")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  app.add_flag("--special-tokens-in-content", a.server.special_tokens_in_content,
               "parse special-token text in chat message content as control tokens (unsafe: "
               "lets a user forge turns; default: content is plain text)");
  app.add_option("--speculative-draft-tokens", a.spec_tokens,
                 "draft tokens per step for speculative decoding with the prompt-lookup n-gram "
                 "drafter (0: off; 1..15)")
      ->capture_default_str();
  app.add_option("--speculative-ngram", a.spec_ngram,
                 "MIN:MAX suffix lengths the n-gram drafter matches")
      ->capture_default_str();
  app.add_option("--speculative-model", a.spec_model,
                 "draft model GGUF with the target's vocabulary (instead of the n-gram drafter; "
                 "its weights and KV come out of the memory budget)");
  app.add_option("--speculative-draft-vocab", a.spec_vocab,
                 "the draft model's output layer reads its first N rows (0: all); ids of the "
                 "request's text above N are scored apart")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--speculative-no-lookup", a.spec_no_lookup,
               "with --speculative-model: no prompt-lookup drafts beside the draft model's");
  app.add_flag("--speculative-always", a.spec_always,
               "draft every step without asking the cost model whether drafts pay (measurements)");
  app.add_flag("--speculative-adaptive", a.spec_adaptive,
               "shrink the draft length after rejections, grow it after acceptances");
  app.add_option("--kv-policy", a.kv_policy,
                 "KV regime by request length (prompt + max_tokens), e.g. "
                 "\"int4_asym:0-16384,int8:16384-\"; other lengths use --kv-cache-dtype");
  app.add_option("--kv-regimes", a.kv_regimes,
                 "further KV formats requests may ask for with \"kv_cache_dtype\" (f16 is always "
                 "one: the kill switch POST /admin/kv-policy sends new requests to it)")
      ->delimiter(',');
  app.add_option("--kv-fallback-entropy", a.kv_fallback_entropy,
                 "serve requests whose attention is spiky in --kv-fallback-regime: the attention "
                 "entropy at the prompt's last token (0 = one key, 1 = uniform; the spikiest "
                 "layer's mean over heads) is measured for requests in the default regime, and "
                 "one below this is recomputed in the fallback before its first token (0: off; "
                 "CPU only)");
  app.add_option("--kv-fallback-regime", a.kv_fallback_regime,
                 "the KV format spiky requests fall back to (--kv-fallback-entropy)");
  app.add_option("--chat-template", a.chat_template_file,
                 "Jinja chat template file to use instead of the GGUF's tokenizer.chat_template "
                 "(rendered as transformers does: messages, tools, add_generation_prompt, "
                 "bos_token, eos_token)");
  app.add_option("--kv-events-endpoint", a.kv_events_endpoint,
                 "publish KV events (blocks stored in / evicted from the prefix cache) in vLLM's "
                 "format on this ZMQ PUB endpoint, e.g. tcp://*:5557 (binds; tcp://host:port "
                 "connects)");
  app.add_option("--kv-events-replay-endpoint", a.kv_events_replay_endpoint,
                 "ZMQ ROUTER endpoint answering replay requests for missed KV event batches, "
                 "e.g. tcp://*:5558");
  app.add_option("--kv-events-pod-id", a.kv_events_pod_id,
                 "pod id in the KV event topic kv@<pod-id>@<model> (default: HOST:PORT of the "
                 "HTTP listener)");
  app.add_option("--kv-events-topic", a.kv_events_topic,
                 "the whole KV event topic, instead of kv@<pod-id>@<model>");
  bie::cli::add_kv_engine_flags(
      &app, a.kv,
      "KV format: f16, int8, fp8_e4m3, int4 (= int4_asym, int4_channel), int4_asym_gN, q8_0, q4_0");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "bie-serve: %s (see --help)\n", e.what());
    return kExitBadInput;
  }
  auto dev = bie::cli::model_device(a.kv);
  if (!dev.ok()) {
    std::fprintf(stderr, "bie-serve: %s\n", dev.error().c_str());
    return kExitBadInput;
  }
  auto kv = bie::cli::to_engine_options(a.kv);
  if (!kv) {
    std::fprintf(stderr, "bie-serve: %s\n", kv.error().c_str());
    return kExitBadInput;
  }
  bie::EngineConfig ec;
  ec.model = a.model;
  ec.kv = *kv;
  ec.threads = a.threads;
  ec.device = *dev;
  ec.max_num_batched_tokens = a.max_num_batched_tokens;
  ec.enable_prefix_caching = a.prefix_caching;
  ec.max_queue = a.max_queue;
  ec.speculative_draft_tokens = a.spec_tokens;
  ec.speculative_adaptive = a.spec_adaptive;
  ec.speculative_model = a.spec_model;
  ec.speculative_draft_vocab = a.spec_vocab;
  ec.speculative_lookup = !a.spec_no_lookup;
  ec.kv_policy = a.kv_policy;
  ec.kv_regimes = a.kv_regimes;
  ec.kv_fallback_entropy = a.kv_fallback_entropy;
  ec.kv_fallback_regime = a.kv_fallback_regime;
  ec.speculative_always = a.spec_always;
  if (!a.chat_template_file.empty()) {
    auto text = read_text(a.chat_template_file);
    if (!text || text->empty()) {
      std::fprintf(stderr, "bie-serve: --chat-template: cannot read '%s' (or it is empty)\n",
                   a.chat_template_file.c_str());
      return kExitBadInput;
    }
    if (auto t = bie::jinja::Template::parse(*text); !t) {
      std::fprintf(stderr, "bie-serve: --chat-template %s: %s\n", a.chat_template_file.c_str(),
                   t.error().c_str());
      return kExitBadInput;
    }
    ec.chat_template = std::move(*text);
  }
  if (int lo = 0, hi = 0; std::sscanf(a.spec_ngram.c_str(), "%d:%d", &lo, &hi) == 2) {
    ec.speculative_ngram_min = lo;
    ec.speculative_ngram_max = hi;
  } else {
    std::fprintf(stderr, "bie-serve: --speculative-ngram wants MIN:MAX, got '%s'\n",
                 a.spec_ngram.c_str());
    return kExitBadInput;
  }

  // Signals are taken synchronously by main (sigwait); every thread started below inherits the
  // mask. SIGUSR1 is the loader thread saying the model failed to load.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  // One descriptor per connection: raise the soft limit to the hard one, and keep the
  // connection limit below it so accept() never fails for lack of descriptors.
  if (rlimit rl{}; ::getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
    ::getrlimit(RLIMIT_NOFILE, &rl);
    const auto room = static_cast<int64_t>(rl.rlim_cur) - 64;
    if (room < a.server.max_connections) {
      a.server.max_connections = static_cast<int>(std::max<int64_t>(1, room));
      std::fprintf(stderr, "bie-serve: --max-connections lowered to %d (open-file limit %llu)\n",
                   a.server.max_connections, static_cast<unsigned long long>(rl.rlim_cur));
    }
  }
  bie::server::Server server(a.server);
  if (bie::Status st = server.start(); !st) {
    std::fprintf(stderr, "bie-serve: %s\n", st.error().c_str());
    return kExitFailure;
  }
  std::fprintf(stderr, "bie-serve: listening on http://%s:%d (loading model '%s')\n",
               a.server.host.c_str(), server.port(), a.model.c_str());
  std::fflush(stderr);

  // KV events: the sockets open before the model loads, so a bad endpoint fails at once.
  std::unique_ptr<bie::server::KvEventPublisher> kv_events;
  if (!a.kv_events_endpoint.empty()) {
    bie::server::KvEventPublisherConfig pc;
    pc.endpoint = a.kv_events_endpoint;
    pc.replay_endpoint = a.kv_events_replay_endpoint;
    std::string model = a.server.served_model_name;
    if (model.empty()) {
      auto path = bie::resolve_model_path(a.model);
      model = path ? std::filesystem::path(*path).stem().string() : a.model;
    }
    const std::string pod = a.kv_events_pod_id.empty()
                                ? a.server.host + ":" + std::to_string(server.port())
                                : a.kv_events_pod_id;
    pc.topic = a.kv_events_topic.empty() ? "kv@" + pod + "@" + model : a.kv_events_topic;
    auto p = bie::server::KvEventPublisher::create(pc);
    if (!p) {
      std::fprintf(stderr, "bie-serve: %s\n", p.error().c_str());
      server.stop();
      return kExitFailure;
    }
    kv_events = std::move(p).value();
    ec.kv_events = kv_events.get();
    std::fprintf(stderr, "bie-serve: KV events on %s%s%s (topic %s)\n",
                 a.kv_events_endpoint.c_str(),
                 a.kv_events_replay_endpoint.empty() ? "" : ", replay on ",
                 a.kv_events_replay_endpoint.c_str(), pc.topic.c_str());
  }

  std::unique_ptr<bie::Engine> engine;
  std::string load_error;
  std::thread loader([&] {
    auto e = bie::Engine::create(ec);
    if (!e) {
      load_error = e.error();
      ::kill(::getpid(), SIGUSR1);
      return;
    }
    engine = std::move(e).value();
    // A template that does not parse is a start-up error (llama-server --jinja does the same);
    // a model with no template and no known chat tokens still serves /v1/completions.
    const std::string& source = engine->model_info().chat_template;
    auto chat = bie::tokenizer::ChatTemplate::detect(source, engine->tokenizer());
    if (!chat && !source.empty()) {
      load_error = chat.error();
      ::kill(::getpid(), SIGUSR1);
      return;
    }
    if (chat) {
      std::fprintf(
          stderr, "bie-serve: chat template %s (%s), end of turn '%s'\n",
          a.chat_template_file.empty() ? chat->origin().c_str() : a.chat_template_file.c_str(),
          chat->name().c_str(), chat->end_of_turn().c_str());
    } else {
      std::fprintf(stderr, "bie-serve: warning: %s (chat requests will be refused)\n",
                   chat.error().c_str());
    }
    const std::string report = bie::format_kv_report(engine->kv_report());
    std::fwrite(report.data(), 1, report.size(), stderr);
    server.set_engine(engine.get());
    const bie::ModelInfo& mi = engine->model_info();
    if (mi.synthetic) {
      std::fprintf(stderr,
                   "bie-serve: warning: %s is a SYNTHETIC model (random weights, `bie synth`): its "
                   "text is noise; serve it for memory and speed tests only\n",
                   mi.path.c_str());
    }
    std::fprintf(stderr, "bie-serve: model '%s' (sha256 %s) ready on http://%s:%d\n", mi.id.c_str(),
                 mi.sha256.c_str(), a.server.host.c_str(), server.port());
    std::fflush(stderr);
  });

  int sig = 0;
  sigwait(&sigs, &sig);
  server.begin_shutdown();  // no new connections; new requests get 503
  loader.join();
  if (!load_error.empty()) {
    std::fprintf(stderr, "bie-serve: %s\n", load_error.c_str());
    server.stop();
    return kExitFailure;
  }
  std::fprintf(stderr, "bie-serve: %s: finishing running requests, then exiting\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM");
  if (engine) {
    // Running requests get --drain-timeout to finish (the server answers 503 to new ones, and
    // /health says shutting_down); whatever still runs then is cancelled.
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(a.drain_seconds * 1000));
    for (;;) {
      const bie::EngineMetrics m = engine->metrics();
      // Live counts (the running/waiting gauges come from the last step, and a first step on a
      // slow device can outlast a request that just arrived).
      if (m.requests_in_flight == 0) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        std::fprintf(stderr, "bie-serve: drain timeout: cancelling %lld running request(s)\n",
                     static_cast<long long>(m.requests_in_flight));
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    engine->shutdown(/*finish_running=*/false);
  }
  server.stop();
  std::fprintf(stderr, "bie-serve: stopped\n");
  return kExitOk;
}
