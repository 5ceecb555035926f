#include "bie/server/kv_event_publisher.h"

#include <fmt/format.h>

#include <msgpack.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

namespace bie::server {

namespace {

std::string big_endian(int64_t v) {
  std::string s(8, '\0');
  auto u = static_cast<uint64_t>(v);
  for (int i = 7; i >= 0; --i) {
    s[static_cast<size_t>(i)] = static_cast<char>(u & 0xff);
    u >>= 8;
  }
  return s;
}

bool binds(const std::string& endpoint) {
  return endpoint.find('*') != std::string::npos || endpoint.find("::") != std::string::npos ||
         endpoint.rfind("ipc://", 0) == 0 || endpoint.rfind("inproc://", 0) == 0;
}

using Packer = msgpack::packer<msgpack::sbuffer>;

void pack_str(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

using Event = KvEventPublisher::Event;

// Consecutive events that one vLLM event can carry: stored blocks of one chain (each the parent
// of the next) in one medium, or removals from one medium.
bool joins(const Event& run_last, const Event& e) {
  if (e.kind != run_last.kind || e.medium != run_last.medium) return false;
  if (e.kind == Event::Kind::kRemoved) return true;
  return e.kind == Event::Kind::kStored && e.has_parent && e.parent == run_last.hash &&
         e.block_size == run_last.block_size;
}

// [ts, [events...], dp_rank] with each run of joinable events packed as one event.
std::string encode_batch(const std::vector<Event>& events, int32_t dp_rank) {
  std::vector<std::pair<size_t, size_t>> runs;  // [first, last) into events
  for (size_t i = 0; i < events.size(); ++i) {
    if (!runs.empty() && joins(events[i - 1], events[i]) &&
        events[runs.back().first].kind != Event::Kind::kCleared) {
      runs.back().second = i + 1;
    } else {
      runs.emplace_back(i, i + 1);
    }
  }
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_array(3);
  const double ts =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  pk.pack_double(ts);
  pk.pack_array(static_cast<uint32_t>(runs.size()));
  for (const auto& [first, last] : runs) {
    const Event& head = events[first];
    const auto n = static_cast<uint32_t>(last - first);
    switch (head.kind) {
      case Event::Kind::kStored: {
        pk.pack_array(7);
        pack_str(pk, "BlockStored");
        pk.pack_array(n);
        for (size_t i = first; i < last; ++i) pk.pack_uint64(events[i].hash);
        if (head.has_parent) {
          pk.pack_uint64(head.parent);
        } else {
          pk.pack_nil();
        }
        size_t n_tok = 0;
        for (size_t i = first; i < last; ++i) n_tok += events[i].tokens.size();
        pk.pack_array(static_cast<uint32_t>(n_tok));
        for (size_t i = first; i < last; ++i) {
          for (const int32_t t : events[i].tokens) pk.pack_int32(t);
        }
        pk.pack_int32(head.block_size);
        pk.pack_nil();  // lora_id
        pack_str(pk, head.medium);
        break;
      }
      case Event::Kind::kRemoved:
        pk.pack_array(3);
        pack_str(pk, "BlockRemoved");
        pk.pack_array(n);
        for (size_t i = first; i < last; ++i) pk.pack_uint64(events[i].hash);
        pack_str(pk, head.medium);
        break;
      case Event::Kind::kCleared:
        pk.pack_array(1);
        pack_str(pk, "AllBlocksCleared");
        break;
    }
  }
  pk.pack_int32(dp_rank);
  return std::string(buf.data(), buf.size());
}

}  // namespace

struct KvEventPublisher::Sockets {
  zmq::context_t ctx{1};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
  std::optional<zmq::socket_t> replay;
};

KvEventPublisher::KvEventPublisher(const KvEventPublisherConfig& cfg)
    : cfg_(cfg), sock_(std::make_unique<Sockets>()) {}

Result<std::unique_ptr<KvEventPublisher>> KvEventPublisher::create(
    const KvEventPublisherConfig& cfg) {
  if (cfg.endpoint.empty()) return Error{"--kv-events-endpoint is empty"};
  std::unique_ptr<KvEventPublisher> p(new KvEventPublisher(cfg));
  Sockets& s = *p->sock_;
  try {
    s.pub.set(zmq::sockopt::sndhwm, cfg.send_hwm);
    s.pub.set(zmq::sockopt::linger, 1000);  // let the last batches out on shutdown
    if (binds(cfg.endpoint)) {
      s.pub.bind(cfg.endpoint);
    } else {
      s.pub.connect(cfg.endpoint);
    }
  } catch (const zmq::error_t& e) {
    return Error{fmt::format("--kv-events-endpoint {}: {}", cfg.endpoint, e.what())};
  }
  if (!cfg.replay_endpoint.empty()) {
    try {
      s.replay.emplace(s.ctx, zmq::socket_type::router);
      s.replay->set(zmq::sockopt::linger, 0);
      s.replay->set(zmq::sockopt::sndhwm, 0);  // a replay is sent whole
      s.replay->bind(cfg.replay_endpoint);
    } catch (const zmq::error_t& e) {
      return Error{
          fmt::format("--kv-events-replay-endpoint {}: {}", cfg.replay_endpoint, e.what())};
    }
  }
  p->all_blocks_cleared();
  KvEventPublisher* raw = p.get();
  p->thread_ = std::thread([raw] { raw->run(); });
  return p;
}

KvEventPublisher::~KvEventPublisher() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void KvEventPublisher::push(Event e) {
  {
    std::lock_guard lk(mu_);
    if (pending_.size() >= cfg_.max_pending_events) {
      dropped_.fetch_add(1);
      return;
    }
    pending_.push_back(std::move(e));
  }
}

void KvEventPublisher::block_stored(std::string_view medium, uint64_t chain,
                                    std::optional<uint64_t> parent, std::span<const int32_t> tokens,
                                    int block_size) {
  Event e;
  e.kind = Event::Kind::kStored;
  e.medium = medium;
  e.hash = chain;
  e.has_parent = parent.has_value();
  e.parent = parent.value_or(0);
  e.block_size = block_size;
  e.tokens.assign(tokens.begin(), tokens.end());
  push(std::move(e));
}

void KvEventPublisher::block_removed(std::string_view medium, uint64_t chain) {
  Event e;
  e.kind = Event::Kind::kRemoved;
  e.medium = medium;
  e.hash = chain;
  push(std::move(e));
}

void KvEventPublisher::all_blocks_cleared() {
  Event e;
  e.kind = Event::Kind::kCleared;
  push(std::move(e));
}

void KvEventPublisher::run() {
  std::vector<Event> events;
  for (;;) {
    if (sock_->replay) {
      zmq::pollitem_t item{static_cast<void*>(*sock_->replay), 0, ZMQ_POLLIN, 0};
      try {
        zmq::poll(&item, 1, cfg_.flush_interval);
        if (item.revents & ZMQ_POLLIN) serve_replay();
      } catch (const zmq::error_t&) {
        // EINTR and the like: try again next round
      }
    }
    bool stop = false;
    {
      std::unique_lock lk(mu_);
      if (!sock_->replay) {
        cv_.wait_for(lk, cfg_.flush_interval, [&] { return stop_; });
      }
      events.swap(pending_);
      stop = stop_;
    }
    if (!events.empty()) send_batch(events);
    events.clear();
    if (stop) {
      std::lock_guard lk(mu_);
      if (pending_.empty()) break;
    }
  }
}

void KvEventPublisher::send_batch(std::vector<Event>& events) {
  const uint64_t seq = next_seq_++;
  std::string payload = encode_batch(events, cfg_.data_parallel_rank);
  const std::string seq_bytes = big_endian(static_cast<int64_t>(seq));
  try {
    sock_->pub.send(zmq::buffer(cfg_.topic), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    sock_->pub.send(zmq::buffer(seq_bytes), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    sock_->pub.send(zmq::buffer(payload), zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
    // A PUB socket drops at its high-water mark; subscribers catch up through the replay.
  }
  replay_.emplace_back(seq, std::move(payload));
  while (replay_.size() > cfg_.replay_batches) replay_.pop_front();
  sent_.fetch_add(1);
}

void KvEventPublisher::serve_replay() {
  zmq::socket_t& r = *sock_->replay;
  for (int budget = 0; budget < 64; ++budget) {  // a bounded number of requests per round
    std::vector<zmq::message_t> req;
    if (!zmq::recv_multipart(r, std::back_inserter(req), zmq::recv_flags::dontwait)) return;
    if (req.size() != 3 || req[2].size() != 8) continue;  // [identity, empty, start seq]
    uint64_t start = 0;
    const auto* b = static_cast<const unsigned char*>(req[2].data());
    for (int i = 0; i < 8; ++i) start = (start << 8) | b[i];
    const std::string id = req[0].to_string();
    const auto send = [&](const std::string& seq, const std::string& payload) {
      r.send(zmq::buffer(id), zmq::send_flags::sndmore);
      r.send(zmq::str_buffer(""), zmq::send_flags::sndmore);
      r.send(zmq::buffer(seq), zmq::send_flags::sndmore);
      r.send(zmq::buffer(payload), zmq::send_flags::none);
    };
    for (const auto& [seq, payload] : replay_) {
      if (seq >= start) send(big_endian(static_cast<int64_t>(seq)), payload);
    }
    send(big_endian(-1), std::string());
  }
}

}  // namespace bie::server
