// Collecting one Engine request's streamed tokens, text and finish event, for tests that drive
// the engine directly.
#pragma once

#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bie/engine/engine.h"

namespace bie::test {

struct Collected {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  std::vector<std::vector<TopLogprob>> top;  // per token, when the request asked for top logprobs
  std::string text;
  std::optional<FinishEvent> finish;
  void wait() {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return finish.has_value(); });
  }
};

// Callbacks that fill c (text includes the finish event's held-back tail).
inline RequestCallbacks collect(Collected& c) {
  RequestCallbacks cb;
  cb.on_token = [&c](const TokenEvent& e) {
    std::lock_guard lk(c.mu);
    c.tokens.push_back(e.token);
    c.top.push_back(e.top);
    c.text += e.text;
    return true;
  };
  cb.on_finish = [&c](const FinishEvent& f) {
    std::lock_guard lk(c.mu);
    c.text += f.tail_text;
    c.finish = f;
    c.cv.notify_all();
  };
  return cb;
}

// Submits req and waits for it to finish. A refused submission comes back as a finish event
// with reason "refused" and the refusal's message as its error.
inline void run_to_end(Engine& e, RequestId id, EngineRequest req, Collected& c) {
  if (auto refused = e.submit(id, std::move(req), collect(c))) {
    FinishEvent f;
    f.finish_reason = "refused";
    f.error = refused->message;
    c.finish = f;
    return;
  }
  c.wait();
}

// Blocks held by sequences (or migrations) in every pool of every regime.
inline int64_t used_blocks(const Engine& e) {
  int64_t used = 0;
  for (const auto& p : e.metrics().pools) used += p.blocks_used;
  return used;
}

}  // namespace bie::test
