// RequestStream: hands one request's engine events (pushed on the engine thread) to the HTTP
// thread that writes them out, and carries "the client went away" back the other way.
// Thread-safe: one producer (engine callbacks), one consumer (the HTTP handler).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <vector>

#include "bie/engine/engine.h"

namespace bie::server {

class RequestStream {
 public:
  // Engine side. push_token returns false once the client is gone (the engine then cancels).
  bool push_token(const TokenEvent& ev) {
    std::lock_guard lk(mu_);
    if (client_gone_) return false;
    tokens_.push_back(ev);
    cv_.notify_one();
    return true;
  }
  void push_finish(const FinishEvent& f) {
    std::lock_guard lk(mu_);
    finish_ = f;
    cv_.notify_one();
  }

  // HTTP side: waits up to `timeout` for news, then moves the pending tokens into `out` (cleared
  // first). Returns the finish event once it has arrived and every token before it was taken.
  std::optional<FinishEvent> take(std::vector<TokenEvent>& out, std::chrono::milliseconds timeout) {
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, timeout, [&] { return !tokens_.empty() || finish_.has_value(); });
    out.clear();
    out.swap(tokens_);
    return finish_;
  }
  void mark_client_gone() {
    std::lock_guard lk(mu_);
    client_gone_ = true;
  }
  [[nodiscard]] bool finished() const {
    std::lock_guard lk(mu_);
    return finish_.has_value();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<TokenEvent> tokens_;
  std::optional<FinishEvent> finish_;
  bool client_gone_ = false;
};

}  // namespace bie::server
