// KvEventPublisher: publishes the prefix cache's KV events (kv::KvEventSink) in vLLM's wire
// format, for prefix-aware routers (llm-d's KV-cache indexer, NVIDIA Dynamo). ZMQ PUB socket,
// one multipart message per batch: (topic, 8-byte big-endian sequence number, msgpack
// EventBatch). EventBatch = [ts, [event, ...], data_parallel_rank]; each event a tagged array:
//   ["BlockStored", [hash, ...], parent_hash | nil, [token, ...], block_size, lora_id (nil),
//    medium]
//   ["BlockRemoved", [hash, ...], medium]
//   ["AllBlocksCleared"]
// With a replay endpoint, a ROUTER socket answers [empty, 8-byte start seq] with
// [empty, seq, payload] for every buffered batch from start on, then [empty, -1, ""].
// Owns the sockets and one publisher thread; the sink calls only queue events under a mutex (the
// engine thread never encodes or sends), and the thread sends a batch every flush interval.
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bie/common/result.h"
#include "bie/kv/kv_event_sink.h"

namespace bie::server {

struct KvEventPublisherConfig {
  // PUB endpoint: bound when it has a wildcard ("tcp://*:5557"), "::", or is ipc:// or
  // inproc://, else connected (as vLLM does).
  std::string endpoint = "tcp://*:5557";
  std::string replay_endpoint;  // ROUTER, bound; empty: no replay
  std::string topic;            // "kv@<pod-id>@<model>"
  int32_t data_parallel_rank = 0;
  size_t replay_batches = 10000;  // batches kept for replay
  int send_hwm = 100000;          // ZMQ high-water mark of the PUB socket
  std::chrono::milliseconds flush_interval{10};
  // Events waiting for the publisher thread beyond which new ones are dropped (and counted):
  // a stalled publisher must not grow the server's memory without bound.
  size_t max_pending_events = 1 << 20;
};

class KvEventPublisher final : public kv::KvEventSink {
 public:
  // Opens the sockets (fails with the endpoint named if one cannot be bound or connected), queues
  // an AllBlocksCleared (the replica starts with an empty cache) and starts the thread.
  [[nodiscard]] static Result<std::unique_ptr<KvEventPublisher>> create(
      const KvEventPublisherConfig& cfg);
  // Sends what is still queued, then closes the sockets.
  ~KvEventPublisher() override;
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  void block_stored(std::string_view medium, uint64_t chain, std::optional<uint64_t> parent,
                    std::span<const int32_t> tokens, int block_size) override;
  void block_removed(std::string_view medium, uint64_t chain) override;
  void all_blocks_cleared();

  [[nodiscard]] uint64_t batches_sent() const { return sent_.load(); }
  [[nodiscard]] uint64_t events_dropped() const { return dropped_.load(); }

  // One queued event (public for the encoder in the .cpp).
  struct Event {
    enum class Kind : uint8_t { kStored, kRemoved, kCleared } kind = Kind::kStored;
    std::string medium;
    uint64_t hash = 0;
    bool has_parent = false;
    uint64_t parent = 0;
    int32_t block_size = 0;
    std::vector<int32_t> tokens;
  };

 private:
  struct Sockets;
  explicit KvEventPublisher(const KvEventPublisherConfig& cfg);
  void push(Event e);
  void run();
  void send_batch(std::vector<Event>& events);
  void serve_replay();

  KvEventPublisherConfig cfg_;
  std::unique_ptr<Sockets> sock_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Event> pending_;  // under mu_
  bool stop_ = false;           // under mu_
  // Publisher thread only.
  uint64_t next_seq_ = 0;
  std::deque<std::pair<uint64_t, std::string>> replay_;  // (seq, payload)
  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> dropped_{0};
  std::thread thread_;
};

}  // namespace bie::server
