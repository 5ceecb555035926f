// HttpServer: BIE's HTTP/1.1 transport. Boost.Beast parses every request (request line,
// headers, Content-Length and chunked bodies) under explicit limits; this class owns the
// listening socket, one thread per connection, and the deadlines a hostile client must not be
// able to stretch: total time for the headers, total time for the body, idle keep-alive time,
// time to write. Beyond `max_connections` a connection gets an immediate 503 and is closed, so
// slow clients cannot take every thread. Bodies are never decompressed (Content-Encoding other
// than identity is refused), so the body limit is the memory bound.
// Thread-safe: start()/stop() from one owner thread; handlers run on connection threads.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bie/common/result.h"

namespace bie::server {

struct HttpLimits {
  size_t max_body_bytes = 16u << 20;    // after transfer decoding; larger bodies get 413
  size_t max_header_bytes = 64u << 10;  // request line + all header fields; larger get 431
  int max_connections = 1024;           // open connections; the next one gets 503
  std::chrono::milliseconds header_timeout{10'000};     // first byte to the end of the headers
  std::chrono::milliseconds body_timeout{60'000};       // end of the headers to the end of body
  std::chrono::milliseconds keep_alive_timeout{5'000};  // idle time between two requests
  std::chrono::milliseconds write_timeout{30'000};      // one response write (or SSE chunk)
};

struct HttpRequest {
  std::string method;       // "GET", "POST", ...
  std::string target;       // as sent, e.g. "/v1/models?x=1"
  std::string path;         // target without the query
  std::string body;         // decoded (chunked bodies joined); empty before the body is read
  std::string remote_addr;  // peer IP ("127.0.0.1", "::1", ...)
  std::vector<std::pair<std::string, std::string>> headers;

  // First value of a header (case-insensitive name), or "".
  [[nodiscard]] std::string header(std::string_view name) const;
};

// One response on one connection: either send() once, or begin_chunked() / write_chunk()* /
// end_chunked(). Writes return false once the client is gone (the connection is then closed).
class HttpExchange {
 public:
  HttpExchange(int fd, const HttpLimits& limits, bool keep_alive)
      : fd_(fd), limits_(limits), keep_alive_(keep_alive) {}

  bool send(int status, std::string_view content_type, std::string_view body,
            const std::vector<std::pair<std::string, std::string>>& extra = {});
  bool begin_chunked(int status, std::string_view content_type,
                     const std::vector<std::pair<std::string, std::string>>& extra = {});
  bool write_chunk(std::string_view data);
  bool end_chunked();

  // True once the peer has closed its side or the socket failed (checked without blocking).
  [[nodiscard]] bool client_gone();

  [[nodiscard]] int status() const { return status_; }
  [[nodiscard]] bool responded() const { return status_ != 0; }
  [[nodiscard]] bool reusable() const { return keep_alive_ && ok_ && !chunk_open_; }
  void force_close() { keep_alive_ = false; }

 private:
  bool write_all(std::string_view data);
  std::string head(int status, std::string_view content_type,
                   const std::vector<std::pair<std::string, std::string>>& extra) const;

  int fd_;
  const HttpLimits& limits_;
  bool keep_alive_;
  bool ok_ = true;
  bool chunk_open_ = false;
  int status_ = 0;
};

// Handlers. `on_headers` runs once the headers are in, before the body is read; returning true
// means it answered (e.g. 401) and the body is not read. `on_request` answers a whole request.
// `on_transport_error` lets the owner count the transport's own answers (400/408/413/431/503).
struct HttpHandlers {
  std::function<bool(const HttpRequest&, HttpExchange&)> on_headers;
  std::function<void(const HttpRequest&, HttpExchange&)> on_request;
  std::function<void(int status)> on_transport_error;
};

class HttpServer {
 public:
  HttpServer(HttpLimits limits, HttpHandlers handlers);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port (0: any free port) and starts the accept thread.
  [[nodiscard]] Status start(const std::string& host, int port);
  [[nodiscard]] int port() const { return port_; }

  // Closes the listening socket and shuts every idle or still-reading connection down at once
  // (a thread blocked on a slow client wakes); connections whose handler runs get up to `wait`
  // to finish their response, then are shut down too. Returns when every connection thread has
  // ended. Idempotent.
  void stop(std::chrono::milliseconds wait = std::chrono::milliseconds(10'000));

 private:
  void accept_loop();
  void serve(int fd, std::string remote);
  void reject_busy(int fd);
  void set_busy(int fd, bool busy);
  void shutdown_idle(bool all);

  HttpLimits limits_;
  HttpHandlers handlers_;
  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};
  int port_ = 0;
  std::thread acceptor_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> open_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<int, bool> fds_;  // open connection sockets -> a handler runs on it
};

}  // namespace bie::server
