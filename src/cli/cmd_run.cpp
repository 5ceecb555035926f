// bie run: generate text from a prompt, streaming it to stdout, then a line of timings.
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>

#include "bie/backend/backend.h"
#include "bie/backend/thread_pool.h"
#include "bie/engine/generate.h"
#include "bie/engine/kv_setup.h"
#include "bie/engine/model_path.h"
#include "bie/engine/synth_model.h"
#include "bie/model/model.h"
#include "bie/planner/plan_report.h"
#include "bie/tokenizer/stream_decoder.h"
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
};

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
  auto backend = create_backend(BackendConfig{*dev, std::max(0, a.threads)});
  if (!backend) {
    std::fprintf(stderr, "bie run: %s\n", backend.error().c_str());
    return kExitFailure;
  }
  Backend& be = **backend;
  auto opts = to_engine_options(a.kv);
  if (!opts) {
    std::fprintf(stderr, "bie run: %s\n", opts.error().c_str());
    return kExitBadInput;
  }
  LoadOptions lo;
  lo.max_batch_tokens = static_cast<int32_t>(opts->chunked_prefill_size);
  auto model = load_named_model(a.model, lo);
  if (!model.ok()) {
    std::fprintf(stderr, "bie run: %s\n", model.error().c_str());
    return kExitFailure;
  }
  Model& m = **model;
  if (m.file().get_bool(kSyntheticKey).value_or(false)) {
    fmt::print(stderr,
               "bie run: {} is a SYNTHETIC model (random weights, `bie synth`): its text is "
               "noise; use it for memory and speed only\n",
               m.file().path());
  }
  auto kv = setup_kv_cache(m, *opts, &be);
  if (!kv) {
    std::fprintf(stderr, "bie run: %s\n", kv.error().c_str());
    return kExitBadInput;
  }
  auto tok = tokenizer::Tokenizer::from_gguf(m.file());
  if (!tok.ok()) {
    std::fprintf(stderr, "bie run: %s\n", tok.error().c_str());
    return kExitFailure;
  }
  const tokenizer::Tokenizer& tk = *tok;

  tokenizer::EncodeOptions eo;
  eo.parse_special = !a.no_special;
  if (a.no_bos) eo.add_bos = false;
  GenerateRequest req;
  req.prompt = tk.encode(prompt, eo);
  req.max_tokens = a.n_predict;
  req.prefill_chunk = static_cast<int32_t>(opts->chunked_prefill_size);
  req.prefill_align = kv->report.layout.block_size;
  req.sampling = a.sampling;
  req.sampling.seed = a.seed >= 0 ? static_cast<uint64_t>(a.seed) : std::random_device{}();
  if (!a.ignore_eos) req.stop_tokens = tk.vocab().eog_ids();

  if (static_cast<int64_t>(req.prompt.size()) > kv->report.max_model_len) {
    std::fprintf(stderr, "bie run: the prompt has %zu tokens, more than --max-model-len %lld\n",
                 req.prompt.size(), static_cast<long long>(kv->report.max_model_len));
    return kExitBadInput;
  }
  const std::string report = format_kv_report(kv->report);  // the one start-up report
  std::fwrite(report.data(), 1, report.size(), stderr);
  if (a.show_prompt) {
    std::fwrite(prompt.data(), 1, prompt.size(), stdout);
    std::fflush(stdout);
  }
  tokenizer::StreamDecoder dec(tk);
  auto stats = generate(m, *kv->cache, be, req, [&](int32_t id) {
    const std::string piece = dec.push(id);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  const std::string tail = dec.flush();
  std::fwrite(tail.data(), 1, tail.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (!stats.ok()) {
    std::fprintf(stderr, "bie run: %s\n", stats.error().c_str());
    return kExitFailure;
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::fprintf(stderr,
               "prompt: %lld tokens, %.1f tok/s | decode: %lld tokens, %.1f tok/s | threads %d | "
               "seed %llu | finish: %s | KV held %s | peak RSS %.1f MiB\n",
               static_cast<long long>(stats->n_prompt), stats->prompt_tps(),
               static_cast<long long>(stats->n_generated), stats->decode_tps(),
               be.host_threads().size(), static_cast<unsigned long long>(req.sampling.seed),
               stats->finish_reason.c_str(),
               planner::format_bytes(static_cast<double>(kv_held_bytes(*kv->cache))).c_str(),
               static_cast<double>(ru.ru_maxrss) / 1024.0);
  return kExitOk;
}

}  // namespace

void add_run_command(CLI::App& root, int* rc) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* cmd = root.add_subcommand("run", "Generate text from a prompt");
  cmd->add_option("-m,--model", args->model, "GGUF file, or 'default' (SmolLM2-135M-Instruct Q4_1)")
      ->capture_default_str();
  cmd->add_option("-p,--prompt", args->prompt, "Prompt text");
  cmd->add_option("-f,--file", args->prompt_file, "Read the prompt from a file");
  cmd->add_option("-n,--n-predict", args->n_predict, "Tokens to generate")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
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
  cmd->callback([args, rc] {
    if (Status s = args->sampling.validate(); !s) {
      std::fprintf(stderr, "bie run: %s\n", s.error().c_str());
      *rc = kExitBadInput;
      return;
    }
    *rc = run(*args);
  });
}

}  // namespace bie::cli
