// bie bench --speculative: two engines on the same model, one plain and one drafting, each task
// sent to both in turn (interleaved, so machine noise hits both alike), greedy, one stream at a
// time. Decode speed is timed from the first streamed token to the last, so prefill does not
// dilute it. Greedy outputs must be identical; a difference is reported and fails the run.
#include "cli/bench_spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "bie/engine/engine.h"
#include "bie/tokenizer/chat_template.h"
#include "bie/tokenizer/tokenizer.h"
#include "cli/commands.h"

namespace bie::cli {

namespace {

struct Task {
  const char* kind;  // "grounded" or "open chat"
  const char* name;
  std::string text;
};

std::vector<Task> tasks() {
  const std::string code =
      "def parse_config(path):\n    with open(path) as f:\n        lines = f.readlines()\n"
      "    config = {}\n    for line in lines:\n        line = line.strip()\n"
      "        if not line or line.startswith(\"#\"):\n            continue\n"
      "        key, value = line.split(\"=\", 1)\n        config[key.strip()] = value.strip()\n"
      "    return config\n";
  const std::string json =
      "{\"orders\": [\n  {\"id\": 1041, \"customer\": \"Ada Lovelace\", \"city\": \"London\", "
      "\"total\": 12.5},\n  {\"id\": 1042, \"customer\": \"Alan Turing\", \"city\": "
      "\"Manchester\", \"total\": 30.0},\n  {\"id\": 1043, \"customer\": \"Grace Hopper\", "
      "\"city\": \"New York\", \"total\": 45.25}\n]}";
  const std::string article =
      "The river had flooded twice that spring. \"We lost the lower field,\" said Marta Ruiz, "
      "who has farmed the valley for thirty years. \"But the orchard survived, and the bees came "
      "back in May.\" The county engineer, Tom Okafor, said the new levee would be finished by "
      "October. \"It will hold a hundred-year flood,\" he said, \"if it is maintained.\"";
  return {
      {"grounded", "code-edit",
       "Rename the function parse_config to load_config in this code and print the whole file "
       "again:\n\n" +
           code},
      {"grounded", "json",
       "Rewrite this JSON so that every order also has a field \"currency\": \"EUR\". Print the "
       "whole JSON:\n\n" +
           json},
      {"grounded", "quotes", "Summarise this article using direct quotes from it:\n\n" + article},
      {"open chat", "hobbies",
       "What are three good hobbies for someone who works from home? Explain each."},
      {"open chat", "story", "Tell me a short story about a dragon who is afraid of the dark."},
  };
}

struct Timed {
  std::vector<int32_t> tokens;
  double decode_seconds = 0;  // first streamed token to last
  FinishEvent fin;
};

Timed generate(Engine& eng, RequestId id, const std::vector<int32_t>& prompt, int32_t n,
               const std::string& stop) {
  using clock = std::chrono::steady_clock;
  std::mutex mu;
  std::condition_variable cv;
  Timed t;
  std::optional<clock::time_point> first;
  clock::time_point last;
  bool done = false;
  RequestCallbacks cb;
  cb.on_token = [&](const TokenEvent& e) {
    std::lock_guard lk(mu);
    const auto now = clock::now();
    if (!first) first = now;
    last = now;
    t.tokens.push_back(e.token);
    return true;
  };
  cb.on_finish = [&](const FinishEvent& f) {
    std::lock_guard lk(mu);
    t.fin = f;
    done = true;
    cv.notify_all();
  };
  EngineRequest r;
  r.prompt = prompt;
  r.sampling.temperature = 0;
  r.max_tokens = n;
  if (!stop.empty()) r.stop = {stop};
  if (auto refused = eng.submit(id, r, cb)) {
    t.fin.finish_reason = "error";
    t.fin.error = refused->message;
    return t;
  }
  std::unique_lock lk(mu);
  cv.wait(lk, [&] { return done; });
  if (first) t.decode_seconds = std::chrono::duration<double>(last - *first).count();
  return t;
}

double tps(const Timed& t) {
  const auto n = static_cast<double>(t.tokens.size());
  return n > 1 && t.decode_seconds > 0 ? (n - 1) / t.decode_seconds : 0.0;
}

}  // namespace

int run_spec_bench(const SpecBenchOptions& o) {
  const auto fail = [](int code, const std::string& msg) {
    std::fprintf(stderr, "bie bench: %s\n", msg.c_str());
    return code;
  };
  EngineConfig base;
  base.model = o.model;
  base.kv = o.kv;
  if (base.kv.max_model_len == 0) base.kv.max_model_len = 4096;
  base.kv.max_num_seqs = 1;
  base.threads = o.threads;
  base.enable_prefix_caching = false;
  EngineConfig spec = base;
  spec.speculative_draft_tokens = o.draft_tokens;
  spec.speculative_always = o.always;
  spec.speculative_draft_vocab = o.draft_vocab;
  spec.speculative_lookup = o.lookup;
  if (o.drafter != "ngram") spec.speculative_model = o.drafter;
  auto plain = Engine::create(base);
  if (!plain) return fail(kExitBadInput, plain.error());
  auto drafting = Engine::create(spec);
  if (!drafting) return fail(kExitBadInput, drafting.error());
  const std::string report = format_kv_report((*drafting)->kv_report());
  std::fwrite(report.data(), 1, report.size(), stderr);

  const tokenizer::Tokenizer& tok = (*plain)->tokenizer();
  auto tmpl = tokenizer::ChatTemplate::detect((*plain)->model_info().chat_template, tok);
  if (!tmpl) return fail(kExitFailure, tmpl.error());
  struct Row {
    const Task* task = nullptr;
    std::vector<int32_t> prompt;
    std::vector<double> base_tps, spec_tps;
    int64_t tokens = 0;
  };
  const std::vector<Task> all = tasks();
  std::vector<Row> rows;
  for (const Task& t : all) {
    const tokenizer::ChatMessage msg{"user", t.text};
    auto text = tmpl->render(std::span<const tokenizer::ChatMessage>(&msg, 1));
    if (!text) return fail(kExitFailure, text.error());
    tokenizer::EncodeOptions eo;
    eo.parse_special = true;
    rows.push_back({&t, tok.encode(*text, eo), {}, {}, 0});
  }
  const EngineMetrics m0 = (*drafting)->metrics();
  RequestId id = 1;
  bool identical = true;
  for (int rep = 0; rep < o.reps; ++rep) {
    for (Row& r : rows) {
      fmt::print(stderr, "bench: run {}/{}  {}  {}\n", rep + 1, o.reps, r.task->kind, r.task->name);
      const Timed b = generate(**plain, id++, r.prompt, o.n_gen, tmpl->end_of_turn());
      const Timed s = generate(**drafting, id++, r.prompt, o.n_gen, tmpl->end_of_turn());
      if (b.fin.finish_reason == "error") return fail(kExitFailure, b.fin.error);
      if (s.fin.finish_reason == "error") return fail(kExitFailure, s.fin.error);
      if (b.tokens != s.tokens) {
        identical = false;
        fmt::print(stderr, "bench: OUTPUT DIFFERS for {} (run {})\n", r.task->name, rep + 1);
      }
      r.base_tps.push_back(tps(b));
      r.spec_tps.push_back(tps(s));
      r.tokens = static_cast<int64_t>(b.tokens.size());
    }
  }
  const EngineMetrics m1 = (*drafting)->metrics();
  const double drafted = static_cast<double>(m1.draft_tokens - m0.draft_tokens);
  const double accepted = static_cast<double>(m1.accepted_tokens - m0.accepted_tokens);
  const double steps = static_cast<double>(m1.spec_steps - m0.spec_steps);
  const double acceptance = drafted > 0 ? accepted / drafted : 0.0;
  const double per_step = steps > 0 ? accepted / steps : 0.0;
  const double drafter_s = m1.drafter_seconds - m0.drafter_seconds;
  std::map<std::string, std::vector<double>> ratios;
  for (const Row& r : rows) {
    const double b = median(r.base_tps);
    ratios[r.task->kind].push_back(b > 0 ? median(r.spec_tps) / b : 0.0);
  }
  const std::string drafter =
      o.drafter == "ngram" ? "n-gram" : "draft model " + o.drafter;
  if (o.json) {
    nlohmann::json j;
    j["model"] = (*plain)->model_info().path;
    j["drafter"] = o.drafter;
    j["draft_tokens"] = o.draft_tokens;
    j["repetitions"] = o.reps;
    j["identical_outputs"] = identical;
    j["acceptance_rate"] = acceptance;
    j["mean_accepted_per_step"] = per_step;
    j["draft_tokens_verified"] = drafted;
    j["drafter_seconds"] = drafter_s;
    j["results"] = nlohmann::json::array();
    for (const Row& r : rows) {
      j["results"].push_back({{"class", r.task->kind},
                              {"task", r.task->name},
                              {"tokens", r.tokens},
                              {"base_tps", median(r.base_tps)},
                              {"spec_tps", median(r.spec_tps)},
                              {"runs_base_tps", r.base_tps},
                              {"runs_spec_tps", r.spec_tps}});
    }
    for (const auto& [kind, v] : ratios) j["median_speedup"][kind] = median(v);
    fmt::print("{}\n", j.dump(1));
  } else {
    fmt::print("model   {}\ndrafter {}, up to {} draft tokens per step{}; {} repetitions\n",
               (*plain)->model_info().path, drafter, o.draft_tokens,
               o.always ? " (always)" : " (cost model)", o.reps);
    fmt::print("{:<10} {:<10} {:>7} {:>11} {:>11} {:>8}\n", "class", "task", "tokens", "base t/s",
               "spec t/s", "speedup");
    for (const Row& r : rows) {
      const double b = median(r.base_tps), s = median(r.spec_tps);
      fmt::print("{:<10} {:<10} {:>7} {:>11.1f} {:>11.1f} {:>7.2f}x\n", r.task->kind, r.task->name,
                 r.tokens, b, s, b > 0 ? s / b : 0.0);
    }
    for (const auto& [kind, v] : ratios) {
      fmt::print("{}: median speed-up {:.2f}x\n", kind, median(v));
    }
    fmt::print(
        "speculation: {:.0f} drafts verified, acceptance {:.2f}, mean accepted per step {:.2f}, "
        "drafter time {:.2f} s\n",
        drafted, acceptance, per_step, drafter_s);
    fmt::print("greedy outputs {}\n", identical ? "identical" : "DIFFER");
  }
  return identical ? kExitOk : kExitFailure;
}

}  // namespace bie::cli
