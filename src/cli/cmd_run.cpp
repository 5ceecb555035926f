// bie run: generate text from a prompt through the Engine (one request), streaming it to stdout,
// then a line of timings.
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "bie/engine/engine.h"
#include "bie/engine/kv_setup.h"
#include "bie/planner/plan_report.h"
#include "bie/tokenizer/tokenizer.h"
#include "cli/commands.h"
#include "cli/kv_options.h"

namespace bie::cli {

namespace {

struct RunArgs {
  std::string model = "default";
  std::string prompt;
  std::string prompt_file;
  int32_t n_predict = 128;
  KvCliFlags kv;
  int32_t threads = 0;
  int64_t seed = -1;
  bool ignore_eos = false;
  bool no_special = false;
  bool no_bos = false;
  bool show_prompt = true;
  SamplingParams sampling;
  int32_t spec_tokens = 0;  // speculative decoding: draft tokens per step (0: off)
  std::string spec_model;   // a draft model GGUF instead of the n-gram drafter
  int32_t spec_vocab = 0;   // the draft model reads its first N output rows (0: all)
  bool spec_no_lookup = false;
};

// Ctrl-C: set by the SIGINT handler, read by the waiting main thread, which cancels the request
// (its timings are still printed).
std::atomic<bool> g_interrupted{false};

extern "C" void on_sigint(int) {
  g_interrupted.store(true);
}

// Exit code for a failed Engine::create: the user's flags or budget (2), else the model (1).
int create_exit_code(CreateError kind) {
  return kind == CreateError::kModel ? kExitFailure : kExitBadInput;
}

int run(const RunArgs& a) {
  std::string prompt = a.prompt;
  if (!a.prompt_file.empty()) {
    std::ifstream f(a.prompt_file, std::ios::binary);
    if (!f) {
      std::fprintf(stderr, "bie run: cannot read prompt file '%s'\n", a.prompt_file.c_str());
      return kExitBadInput;
    }
    std::stringstream ss;
    ss << f.rdbuf();
    prompt = ss.str();
  }
  if (prompt.empty()) {
    std::fprintf(stderr, "bie run: give a prompt with -p TEXT or -f FILE\n");
    return kExitBadInput;
  }
  auto dev = model_device(a.kv);
  if (!dev.ok()) {
    std::fprintf(stderr, "bie run: %s\n", dev.error().c_str());
    return kExitBadInput;
  }
  auto opts = to_engine_options(a.kv);
  if (!opts) {
    std::fprintf(stderr, "bie run: %s\n", opts.error().c_str());
    return kExitBadInput;
  }
  // The engine the server and the SDK drive, with one request: the scheduler's prefill chunks,
  // the prefix cache and the KV regime rules are the same as theirs.
  EngineConfig ec;
  ec.model = a.model;
  ec.kv = *opts;
  ec.threads = std::max(0, a.threads);
  ec.device = *dev;
  ec.f16_kill_switch = false;
  ec.speculative_draft_tokens = a.spec_tokens;
  ec.speculative_model = a.spec_model;
  ec.speculative_draft_vocab = a.spec_vocab;
  ec.speculative_lookup = !a.spec_no_lookup;
  CreateError kind = CreateError::kInvalidConfig;
  auto engine = Engine::create(ec, &kind);
  if (!engine) {
    std::fprintf(stderr, "bie run: %s\n", engine.error().c_str());
    return create_exit_code(kind);
  }
  Engine& eng = **engine;
  if (eng.model_info().synthetic) {
    fmt::print(stderr,
               "bie run: {} is a SYNTHETIC model (random weights, `bie synth`): its text is "
               "noise; use it for memory and speed only\n",
               eng.model_info().path);
  }
  const tokenizer::Tokenizer& tk = eng.tokenizer();
  tokenizer::EncodeOptions eo;
  eo.parse_special = !a.no_special;
  if (a.no_bos) eo.add_bos = false;
  EngineRequest req;
  req.prompt = tk.encode(prompt, eo);
  req.max_tokens = a.n_predict;  // -1: until end of generation or the context is full
  req.ignore_eos = a.ignore_eos;
  req.sampling = a.sampling;
  req.sampling.seed = a.seed >= 0 ? static_cast<uint64_t>(a.seed) : std::random_device{}();
  const KvSetupReport& report = eng.kv_report();
  if (static_cast<int64_t>(req.prompt.size()) > report.max_model_len) {
    std::fprintf(stderr, "bie run: the prompt has %zu tokens, more than --max-model-len %lld\n",
                 req.prompt.size(), static_cast<long long>(report.max_model_len));
    return kExitBadInput;
  }
  const std::string text = format_kv_report(report);  // the one start-up report
  std::fwrite(text.data(), 1, text.size(), stderr);
  if (a.show_prompt) {
    std::fwrite(prompt.data(), 1, prompt.size(), stdout);
    std::fflush(stdout);
  }
  std::mutex mu;
  std::condition_variable cv;
  std::optional<FinishEvent> fin;
  RequestCallbacks cb;
  cb.on_token = [](const TokenEvent& e) {  // the engine thread; stdout is ours alone
    std::fwrite(e.text.data(), 1, e.text.size(), stdout);
    std::fflush(stdout);
    return true;
  };
  cb.on_finish = [&](const FinishEvent& f) {
    std::lock_guard lk(mu);
    fin = f;
    cv.notify_all();
  };
  if (auto refused = eng.submit(1, req, cb)) {
    std::fprintf(stderr, "bie run: %s\n", refused->message.c_str());
    return refused->kind == SubmitError::kShuttingDown ? kExitFailure : kExitBadInput;
  }
  std::signal(SIGINT, on_sigint);
  {
    std::unique_lock lk(mu);
    bool cancelled = false;
    while (!cv.wait_for(lk, std::chrono::milliseconds(50), [&] { return fin.has_value(); })) {
      if (g_interrupted.load() && !cancelled) {
        eng.cancel(1);  // on_finish follows with "cancelled"
        cancelled = true;
      }
    }
  }
  std::signal(SIGINT, SIG_DFL);
  std::fwrite(fin->tail_text.data(), 1, fin->tail_text.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (fin->finish_reason == "error") {
    std::fprintf(stderr, "bie run: %s\n", fin->error.c_str());
    return kExitFailure;
  }
  const RequestMetrics& m = fin->metrics;
  const EngineMetrics em = eng.metrics();
  eng.shutdown(false);
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  // Prompt speed: the prompt's tokens over the time to the first token (its prefill); decode:
  // the tokens after the first over the rest.
  const double prompt_tps = m.ttft_seconds > 0 ? m.prompt_tokens / m.ttft_seconds : 0.0;
  const std::string spec =
      a.spec_tokens > 0
          ? fmt::format(" | drafts {} accepted {} ({:.0f} %)", m.draft_tokens, m.accepted_tokens,
                        100.0 * m.acceptance_rate())
          : std::string();
  std::fprintf(stderr,
               "prompt: %lld tokens, %.1f tok/s | decode: %lld tokens, %.1f tok/s | threads %d | "
               "seed %llu | finish: %s%s | KV committed %s | peak RSS %.1f MiB\n",
               static_cast<long long>(m.prompt_tokens), prompt_tps,
               static_cast<long long>(m.generated_tokens), m.decode_tps(),
               ec.threads > 0 ? ec.threads : static_cast<int>(std::thread::hardware_concurrency()),
               static_cast<unsigned long long>(req.sampling.seed), fin->finish_reason.c_str(),
               spec.c_str(),
               planner::format_bytes(static_cast<double>(em.kv_committed_bytes)).c_str(),
               static_cast<double>(ru.ru_maxrss) / 1024.0);
  return g_interrupted.load() ? kExitInterrupted : kExitOk;
}

}  // namespace

void add_run_command(CLI::App& root, int* rc) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* cmd = root.add_subcommand("run", "Generate text from a prompt");
  cmd->add_option("-m,--model", args->model, "GGUF file, or 'default' (SmolLM2-135M-Instruct Q4_1)")
      ->capture_default_str();
  cmd->add_option("-p,--prompt", args->prompt, "Prompt text");
  cmd->add_option("-f,--file", args->prompt_file, "Read the prompt from a file");
  cmd->add_option("-n,--n-predict", args->n_predict,
                  "Tokens to generate (-1: until end of generation or the context is full)")
      ->capture_default_str()
      ->check(CLI::Range(-1, 1 << 20));
  add_kv_engine_flags(
      cmd, args->kv,
      "KV format: f16, int8, fp8_e4m3, int4 (= int4_asym, int4_channel), int4_asym_gN, q8_0, q4_0");
  cmd->add_option("-t,--threads", args->threads, "Threads (0: all cores)")
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--seed", args->seed, "RNG seed (-1: random)");
  cmd->add_option("--temp", args->sampling.temperature, "Temperature (0: greedy)")
      ->capture_default_str();
  cmd->add_option("--top-k", args->sampling.top_k, "Top-k (0: off)")->capture_default_str();
  cmd->add_option("--top-p", args->sampling.top_p, "Top-p (1: off)")->capture_default_str();
  cmd->add_option("--min-p", args->sampling.min_p, "Min-p (0: off)")->capture_default_str();
  cmd->add_option("--repeat-penalty", args->sampling.repetition_penalty,
                  "Repetition penalty (1: off)")
      ->capture_default_str();
  cmd->add_option("--repeat-last-n", args->sampling.penalty_last_n,
                  "Tokens the penalties look back")
      ->capture_default_str();
  cmd->add_option("--presence-penalty", args->sampling.presence_penalty, "Presence penalty");
  cmd->add_option("--frequency-penalty", args->sampling.frequency_penalty, "Frequency penalty");
  cmd->add_flag("--ignore-eos", args->ignore_eos, "Keep generating past end-of-generation tokens");
  cmd->add_flag("--no-special", args->no_special,
                "Treat special-token text in the prompt as plain text");
  cmd->add_flag("--no-bos", args->no_bos, "Do not add the BOS token even if the model asks for it");
  cmd->add_flag("!--no-display-prompt", args->show_prompt, "Do not echo the prompt");
  cmd->add_option("--speculative-draft-tokens", args->spec_tokens,
                  "Speculative decoding: draft tokens per step (0: off), from the prompt-lookup "
                  "n-gram drafter or --speculative-model")
      ->capture_default_str()
      ->check(CLI::Range(0, 15));
  cmd->add_option("--speculative-model", args->spec_model,
                  "Draft model GGUF with the target's vocabulary (needs --speculative-draft-tokens)");
  cmd->add_option("--speculative-draft-vocab", args->spec_vocab,
                  "The draft model's output layer reads its first N rows (0: all); ids of the text above N "
                  "are scored apart")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_flag("--speculative-no-lookup", args->spec_no_lookup,
                "With --speculative-model: no prompt-lookup drafts beside the draft model's");
  cmd->callback([args, rc] {
    if (args->n_predict == 0) {
      std::fprintf(stderr, "bie run: -n must be at least 1, or -1 for no limit\n");
      *rc = kExitBadInput;
      return;
    }
    if (Status s = args->sampling.validate(); !s) {
      std::fprintf(stderr, "bie run: %s\n", s.error().c_str());
      *rc = kExitBadInput;
      return;
    }
    *rc = run(*args);
  });
}

}  // namespace bie::cli
