// Server: BIE's OpenAI-compatible HTTP server (HTTP/1.1 over Boost.Beast) in front of an Engine. It
// listens before the model is loaded (/health answers 503 until set_engine), maps /v1/completions
// and /v1/chat/completions onto Engine::submit (SSE when "stream": true), and serves /v1/models,
// /health and /metrics. Owns the listening socket and one thread per open connection (at most
// max_connections; the next gets 503); does not own the Engine.
// Methods are thread-safe; the Engine must outlive stop().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "bie/common/result.h"

namespace bie {
class Engine;
}

namespace bie::server {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8080;                      // 0: any free port (see port())
  std::string api_key;                  // non-empty: /v1/* need "Authorization: Bearer <key>"
  std::string served_model_name;        // empty: the model file's stem
  size_t max_body_bytes = 16u << 20;    // any transfer encoding; larger bodies get 413
  size_t max_header_bytes = 64u << 10;  // request line + headers; larger get 431
  int max_connections = 1024;           // open connections at once; the next one gets 503
  int keep_alive_seconds = 5;           // idle time between two requests on one connection
  double header_timeout_seconds = 10;   // first byte to the end of the headers, else 408
  double body_timeout_seconds = 60;     // end of the headers to the end of the body, else 408
  double write_timeout_seconds = 30;    // a client that stops reading is dropped after this
  // Parse special-token text (e.g. "<|im_start|>") inside chat message content as control
  // tokens. Off: content is always plain text, so a user cannot forge turns.
  bool special_tokens_in_content = false;
};

class Server {
 public:
  explicit Server(ServerConfig cfg);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the socket and starts serving on a background thread (503 until set_engine).
  [[nodiscard]] Status start();
  [[nodiscard]] int port() const;

  // The model is loaded: serve requests with it. Call once.
  void set_engine(Engine* engine);
  // New requests get 503 from now on (in-flight ones continue).
  void begin_shutdown();
  // Stops listening and waits for the handler threads (in-flight streams must be finishing:
  // shut the engine down between begin_shutdown() and stop()). Idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bie::server
