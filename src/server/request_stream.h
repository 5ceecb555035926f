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
  // n: the request's choices; each sends its own finish event.
  explicit RequestStream(int32_t n = 1) : n_(n) {}

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
    finishes_.push_back(f);
    cv_.notify_one();
  }

  // HTTP side: waits up to `timeout` for news, then moves the pending tokens into `out` and the
  // choices' finish events that arrived since the last call into `finished` (both cleared
  // first; a choice's finish comes after every token of it). True once every choice has
  // finished and everything was taken.
  bool take(std::vector<TokenEvent>& out, std::vector<FinishEvent>& finished,
            std::chrono::milliseconds timeout) {
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, timeout, [&] { return !tokens_.empty() || !finishes_.empty(); });
    out.clear();
    out.swap(tokens_);
    finished.clear();
    finished.swap(finishes_);
    taken_ += static_cast<int32_t>(finished.size());
    return taken_ >= n_;
  }
  void mark_client_gone() {
    std::lock_guard lk(mu_);
    client_gone_ = true;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  const int32_t n_;
  std::vector<TokenEvent> tokens_;
  std::vector<FinishEvent> finishes_;
  int32_t taken_ = 0;  // finish events handed out
  bool client_gone_ = false;
};

}  // namespace bie::server
