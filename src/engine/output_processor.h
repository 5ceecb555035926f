// The output processor: after a forward pass, samples each sequence's next token from its
// logits rows (or verifies its drafts), advances structured output's grammar, forks the other
// choices of n > 1, streams tokens through the stop strings and the request's callbacks, and
// finishes requests. The engine facade keeps the request accounting callers see (Hooks). Not
// thread-safe (engine thread).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "bie/engine/drafter.h"
#include "bie/engine/engine.h"
#include "bie/engine/scheduler.h"
#include "bie/tokenizer/tokenizer.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/speculative_policy.h"

namespace bie {

class OutputProcessor {
 public:
  // What finishing a request asks of the engine facade (engine thread).
  class Hooks {
   public:
    virtual ~Hooks() = default;
    // The label of KV regime `regime` (RequestMetrics::kv_regime).
    [[nodiscard]] virtual const std::string& regime_label(size_t regime) const = 0;
    // `choices` choices of request rid ended; true when they were its last.
    [[nodiscard]] virtual bool retire(RequestId rid, int32_t choices) = 0;
    virtual void publish_metrics() = 0;
  };

  struct Deps {
    Scheduler* sched = nullptr;
    const tokenizer::Tokenizer* tok = nullptr;
    RequestMap* reqs = nullptr;
    EngineMetrics* metrics = nullptr;
    Hooks* hooks = nullptr;
    Drafter* drafter = nullptr;         // null: speculation off
    SpeculativePolicy* spec = nullptr;  // null: speculation off
    int32_t n_vocab = 0;
    int64_t max_model_len = 0;
  };

  explicit OutputProcessor(const Deps& d) : d_(d) {}

  // Commits every scheduled sequence's computed tokens and samples (or verifies drafts) for
  // those that sample, from `logits` (rows in the scheduled order, as ModelRunner::run returns).
  void process(const std::vector<ScheduledSeq>& scheduled, std::span<float> logits);
  // Ends r (its sequence, its drafter state) and delivers its FinishEvent; r is gone after.
  void finish(Request& r, const std::string& reason, const std::string& error = {});

 private:
  // Gives sc's request the logits of the prompt positions of its chunk it has not had yet
  // (EngineRequest::on_prompt_logits); `rows` holds one row per token of the chunk.
  void give_prompt_rows(const ScheduledSeq& sc, const float* rows);
  // Samples (or verifies drafts) from sc's logits rows and commits the verified tokens.
  void sample(const ScheduledSeq& sc, float* logits);
  // Streams one generated token; false when the request finished (it is gone then).
  [[nodiscard]] bool emit(Request& r, Sequence& s, int32_t tok, float* raw);
  // Advances r's grammar by a sampled token; false (r finished with an error) when the grammar
  // allowed no token at all.
  [[nodiscard]] bool grammar_accept(Request& r, int32_t tok);
  // n > 1: forks the other choices of r (choice 0, its prompt just computed) sharing its KV
  // blocks; each samples its first token from `row` (the prompt's last logits, unmodified).
  // false: r finished with an error (it is gone then).
  [[nodiscard]] bool fork_choices(Request& r, const float* row);

  Deps d_;
  std::vector<float> raw_;       // a copy of one logits row (logprobs)
  std::vector<float> fork_row_;  // n > 1: the prompt's last row, for the forked choices
};

}  // namespace bie
