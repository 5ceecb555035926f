// ServerMetrics: what the HTTP layer measures itself (latency histograms, responses by status),
// and the Prometheus text exposition of those plus an EngineMetrics snapshot.
// Thread-safe: every method may be called from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
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

class ServerMetrics {
 public:
  ServerMetrics();

  void observe_ttft(double seconds) { ttft_.observe(seconds); }
  void observe_inter_token(double seconds) { itl_.observe(seconds); }
  void observe_e2e(double seconds) { e2e_.observe(seconds); }
  void count_response(const std::string& route, int status);

  // The whole /metrics page. `engine` is null while the model loads.
  [[nodiscard]] std::string render(const EngineMetrics* engine, const std::string& model) const;

 private:
  Histogram ttft_, itl_, e2e_;
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> responses_;
};

}  // namespace bie::server
