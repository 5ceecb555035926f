#include "server/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/beast/core/error.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cerrno>
#include <cstring>

namespace bie::server {

namespace http = boost::beast::http;
using Clock = std::chrono::steady_clock;

namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
}

enum class ReadResult { kData, kClosed, kTimeout };

// Appends what the socket has to `buf`, waiting until `deadline` at most.
ReadResult read_some(int fd, std::string& buf, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, remaining_ms(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ReadResult::kClosed;
    if (r == 0) return ReadResult::kTimeout;
    char tmp[16384];
    const ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return ReadResult::kClosed;
    buf.append(tmp, static_cast<size_t>(n));
    return ReadResult::kData;
  }
}

std::string peer_address(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(ss).sin_addr, host, sizeof host);
  } else if (ss.ss_family == AF_INET6) {
    const auto& a6 = reinterpret_cast<const sockaddr_in6&>(ss);
    if (IN6_IS_ADDR_V4MAPPED(&a6.sin6_addr)) {
      ::inet_ntop(AF_INET, &a6.sin6_addr.s6_addr[12], host, sizeof host);
    } else {
      ::inet_ntop(AF_INET6, &a6.sin6_addr, host, sizeof host);
    }
  }
  return host;
}

std::string error_body(std::string_view message, std::string_view code) {
  // The OpenAI error shape, written by hand: the transport does not depend on the API layer.
  std::string escaped;
  for (char c : message) {
    if (c == '"' || c == '\\') escaped.push_back('\\');
    escaped.push_back(c);
  }
  return fmt::format(
      R"({{"error":{{"message":"{}","type":"invalid_request_error","param":null,"code":"{}"}}}})",
      escaped, code);
}

// After an error answer on a connection whose request was not read to its end: stop sending,
// then read and drop what the client still sends for a moment, so it reads our answer instead
// of a reset (a client that is still writing its body gets ECONNRESET if we close at once).
// Bounded in time and bytes and buffers nothing.
void linger_close(int fd) {
  ::shutdown(fd, SHUT_WR);
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(2000);
  size_t dropped = 0;
  char tmp[16384];
  while (dropped < (size_t{64} << 20)) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, remaining_ms(deadline)) <= 0) break;
    const ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
    if (n <= 0) break;
    dropped += static_cast<size_t>(n);
  }
}

}  // namespace

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (iequals(k, name)) return v;
  }
  return {};
}

// ---- HttpExchange ------------------------------------------------------------------------

bool HttpExchange::write_all(std::string_view data) {
  if (!ok_) return false;
  const Clock::time_point deadline = Clock::now() + limits_.write_timeout;
  while (!data.empty()) {
    const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd_, POLLOUT, 0};
      const int r = ::poll(&p, 1, remaining_ms(deadline));
      if (r > 0 && (p.revents & POLLOUT) != 0) continue;
      if (r < 0 && errno == EINTR) continue;
    }
    ok_ = false;  // peer gone, socket error, or a client that stopped reading
    return false;
  }
  return true;
}

std::string HttpExchange::head(
    int status, std::string_view content_type,
    const std::vector<std::pair<std::string, std::string>>& extra) const {
  const auto reason = http::obsolete_reason(static_cast<http::status>(status));
  std::string h = fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\nConnection: {}\r\n", status,
                              std::string_view(reason.data(), reason.size()), content_type,
                              keep_alive_ ? "keep-alive" : "close");
  for (const auto& [k, v] : extra) h += fmt::format("{}: {}\r\n", k, v);
  return h;
}

bool HttpExchange::send(int status, std::string_view content_type, std::string_view body,
                        const std::vector<std::pair<std::string, std::string>>& extra) {
  status_ = status;
  std::string out = head(status, content_type, extra);
  out += fmt::format("Content-Length: {}\r\n\r\n", body.size());
  out += body;
  return write_all(out);
}

bool HttpExchange::begin_chunked(int status, std::string_view content_type,
                                 const std::vector<std::pair<std::string, std::string>>& extra) {
  status_ = status;
  chunk_open_ = true;
  return write_all(head(status, content_type, extra) + "Transfer-Encoding: chunked\r\n\r\n");
}

bool HttpExchange::write_chunk(std::string_view data) {
  if (data.empty()) return ok_;
  std::string out = fmt::format("{:x}\r\n", data.size());
  out += data;
  out += "\r\n";
  return write_all(out);
}

bool HttpExchange::end_chunked() {
  chunk_open_ = false;
  return write_all("0\r\n\r\n");
}

bool HttpExchange::client_gone() {
  if (!ok_) return true;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if ((p.revents & (POLLHUP | POLLERR | POLLRDHUP)) != 0) return true;
  if ((p.revents & POLLIN) != 0) {
    char c;
    const ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
  return false;
}

// ---- HttpServer --------------------------------------------------------------------------

HttpServer::HttpServer(HttpLimits limits, HttpHandlers handlers)
    : limits_(limits), handlers_(std::move(handlers)) {}

HttpServer::~HttpServer() {
  stop();
}

Status HttpServer::start(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0) {
    return Error{"cannot resolve '" + host + "': " + ::gai_strerror(rc)};
  }
  std::string why = "no address";
  for (addrinfo* a = res; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      listen_fd_ = fd;
    } else {
      why = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(res);
  if (listen_fd_ < 0) {
    return Error{"cannot listen on " + host + ":" + std::to_string(port) + " (" + why + ")"};
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6&>(ss).sin6_port
                                         : reinterpret_cast<sockaddr_in&>(ss).sin_port);
  if (::pipe2(wake_pipe_, O_CLOEXEC) != 0) return Error{"pipe2 failed"};
  acceptor_ = std::thread([this] { accept_loop(); });
  return {};
}

void HttpServer::reject_busy(int fd) {
  // Best effort and never blocking: the accept thread must stay free.
  const std::string body =
      error_body(fmt::format("the server has {} open connections, its limit; retry later",
                             limits_.max_connections),
                 "too_many_connections");
  const std::string out = fmt::format(
      "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: "
      "close\r\nRetry-After: 1\r\nContent-Length: {}\r\n\r\n{}",
      body.size(), body);
  [[maybe_unused]] const ssize_t n =
      ::send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  ::shutdown(fd, SHUT_WR);
  ::close(fd);
  if (handlers_.on_transport_error) handlers_.on_transport_error(503);
}

void HttpServer::accept_loop() {
  while (!stopping_.load()) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if ((p[1].revents & POLLIN) != 0 || stopping_.load()) break;
    if ((p[0].revents & POLLIN) == 0) continue;
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC);
    if (fd < 0) {
      // EMFILE and friends: back off a little instead of spinning.
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      continue;
    }
    if (open_.load() >= limits_.max_connections) {
      reject_busy(fd);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    {
      std::lock_guard lk(mu_);
      fds_[fd] = false;
      open_.fetch_add(1);
    }
    std::thread([this, fd, remote = peer_address(ss)]() mutable {
      serve(fd, std::move(remote));
    }).detach();
  }
}

void HttpServer::serve(int fd, std::string remote) {
  std::string buf;  // bytes read and not yet parsed (a pipelined next request stays here)
  bool first = true;
  const auto fail = [&](int status, std::string_view message, std::string_view code) {
    HttpExchange ex(fd, limits_, /*keep_alive=*/false);
    ex.send(status, "application/json", error_body(message, code));
    if (handlers_.on_transport_error) handlers_.on_transport_error(status);
  };
  while (!stopping_.load()) {
    // Idle until the next request starts (the first one gets the header timeout).
    if (buf.empty()) {
      const auto idle = first ? limits_.header_timeout : limits_.keep_alive_timeout;
      if (read_some(fd, buf, Clock::now() + idle) != ReadResult::kData) break;
    }
    first = false;
    http::request_parser<http::string_body> parser;
    parser.header_limit(
        static_cast<std::uint32_t>(std::min<size_t>(limits_.max_header_bytes, UINT32_MAX)));
    parser.body_limit(limits_.max_body_bytes);
    Clock::time_point deadline = Clock::now() + limits_.header_timeout;
    HttpRequest head;  // filled once the headers are in; the body joins it at the end
    bool header_seen = false, answered = false, closed = false;
    boost::beast::error_code ec;
    while (!parser.is_done()) {
      if (!buf.empty()) {
        const size_t used = parser.put(boost::asio::buffer(buf.data(), buf.size()), ec);
        buf.erase(0, used);
        if (ec == http::error::need_more) {
          ec = {};
        } else if (ec) {
          break;
        }
        if (!header_seen && parser.is_header_done()) {
          header_seen = true;
          deadline = Clock::now() + limits_.body_timeout;
          const auto& msg = parser.get();
          head.method = std::string(msg.method_string());
          head.target = std::string(msg.target());
          head.path = head.target.substr(0, head.target.find('?'));
          head.remote_addr = remote;
          for (const auto& f : msg) {
            head.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
          }
          const std::string enc = head.header("Content-Encoding");
          if (!enc.empty() && !iequals(enc, "identity")) {
            fail(415, "Content-Encoding '" + enc + "' is not accepted; send the body uncompressed",
                 "unsupported_content_encoding");
            answered = true;
            break;
          }
          HttpExchange ex(fd, limits_, /*keep_alive=*/false);
          if (handlers_.on_headers && handlers_.on_headers(head, ex)) {
            answered = true;  // e.g. 401: the body is never read
            break;
          }
          if (iequals(head.header("Expect"), "100-continue") && !parser.is_done()) {
            HttpExchange cont(fd, limits_, true);
            if (!cont.send(100, "text/plain", "")) closed = true;
          }
        }
        if (parser.is_done() || closed) break;
        if (used > 0 && !buf.empty()) continue;  // the parser stops after the header
      }
      const ReadResult r = read_some(fd, buf, deadline);
      if (r == ReadResult::kClosed) {
        closed = true;
        break;
      }
      if (r == ReadResult::kTimeout) {
        fail(408,
             header_seen ? "the request body did not arrive in time"
                         : "the request headers did not arrive in time",
             "request_timeout");
        answered = true;
        break;
      }
    }
    if (closed) break;
    if (answered) {
      linger_close(fd);
      break;
    }
    if (ec) {
      if (ec == http::error::header_limit) {
        fail(431, fmt::format("the request headers exceed {} bytes", limits_.max_header_bytes),
             "headers_too_large");
      } else if (ec == http::error::body_limit) {
        fail(413,
             fmt::format("the request body is larger than the server accepts ({} bytes)",
                         limits_.max_body_bytes),
             "body_too_large");
      } else {
        fail(400, "malformed HTTP request: " + ec.message(), "bad_request");
      }
      linger_close(fd);
      break;
    }
    HttpRequest req = std::move(head);
    auto msg = parser.release();
    req.body = std::move(msg.body());
    HttpExchange ex(fd, limits_, msg.keep_alive() && !stopping_.load());
    set_busy(fd, true);
    handlers_.on_request(req, ex);
    set_busy(fd, false);
    if (!ex.responded()) ex.send(500, "application/json", error_body("no response", "internal"));
    if (!ex.reusable()) break;
  }
  std::lock_guard lk(mu_);
  fds_.erase(fd);
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
  open_.fetch_sub(1);
  cv_.notify_all();  // under the lock: stop() may destroy *this as soon as it sees zero
}

void HttpServer::set_busy(int fd, bool busy) {
  std::lock_guard lk(mu_);
  fds_[fd] = busy;
  // A connection that finished its response while stopping is not read again.
  if (!busy && stopping_.load()) ::shutdown(fd, SHUT_RDWR);
}

void HttpServer::shutdown_idle(bool all) {
  // Wakes the threads blocked on a client (slow headers, slow body, idle keep-alive; with `all`
  // also a client that stopped reading its response): their reads and writes fail at once.
  for (const auto& [fd, busy] : fds_) {
    if (all || !busy) ::shutdown(fd, SHUT_RDWR);
  }
}

void HttpServer::stop(std::chrono::milliseconds wait) {
  if (stopping_.exchange(true)) {
    if (acceptor_.joinable()) acceptor_.join();
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return open_.load() == 0; });
    return;
  }
  if (wake_pipe_[1] >= 0) {
    const char c = 'x';
    [[maybe_unused]] const ssize_t n = ::write(wake_pipe_[1], &c, 1);
  }
  if (acceptor_.joinable()) acceptor_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
  std::unique_lock lk(mu_);
  shutdown_idle(/*all=*/false);
  if (!cv_.wait_for(lk, wait, [&] { return open_.load() == 0; })) {
    shutdown_idle(/*all=*/true);
    cv_.wait(lk, [&] { return open_.load() == 0; });
  }
  lk.unlock();
  for (int& p : wake_pipe_) {
    if (p >= 0) ::close(p);
    p = -1;
  }
}

}  // namespace bie::server
