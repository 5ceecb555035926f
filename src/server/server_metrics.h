// ServerMetrics: what the HTTP layer measures itself (latency histograms, responses by status),
// and the Prometheus text exposition of those plus an EngineMetrics snapshot.
// Thread-safe: every method may be called from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "bie/engine/engine.h"

namespace bie::server {

// A cumulative Prometheus histogram with fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // Appends "# HELP", "# TYPE" and the _bucket/_sum/_count lines for `name`.
  void render(std::string& out, const std::string& name, const std::string& help) const;
  [[nodiscard]] uint64_t count() const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // [bounds + 1]: the last is +Inf
  double sum_ = 0.0;
  uint64_t n_ = 0;
};

// Prometheus label-value escaping (backslash, double quote, newline).
[[nodiscard]] std::string escape_label_value(std::string_view v);
// The metrics label of a request path: one of the served routes, else "other".
[[nodiscard]] std::string_view route_label(std::string_view path);

class ServerMetrics {
 public:
  ServerMetrics();

  void observe_ttft(double seconds) { ttft_.observe(seconds); }
  void observe_inter_token(double seconds) { itl_.observe(seconds); }
  void observe_e2e(double seconds) { e2e_.observe(seconds); }
  // Counts one response under route_label(path).
  void count_response(std::string_view path, int status);

  // The whole /metrics page. `engine` is null while the model loads.
  [[nodiscard]] std::string render(const EngineMetrics* engine, const std::string& model) const;

 private:
  Histogram ttft_, itl_, e2e_;
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> responses_;
};

}  // namespace bie::server
