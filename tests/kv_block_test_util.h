// Helpers for the KV block manager tests: tiny configurations and a full snapshot of a manager's
// observable state, to assert that a failed call changed nothing.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "bie/kv/block_manager.h"

namespace bie::kv::test {

// Memory for a pool's blocks, reserved from a CPU backend and attached (what the KV store does
// for its pools). The buffer must outlive the pool.
inline std::unique_ptr<DeviceBuffer> attach_host_memory(BlockPool& pool) {
  static CpuBackend backend(1);
  auto buf = backend.reserve(pool.reserved_bytes());
  EXPECT_TRUE(buf.ok()) << (buf.ok() ? "" : buf.error());
  if (!buf.ok()) return nullptr;
  const Status st = pool.attach_memory(**buf);
  EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error());
  return std::move(buf).value();
}

// int8 body (a mixed layout), blocks of 4 tokens, 2 sink tokens (block 0), an 8-token window.
inline planner::KvLayout tiny_mixed_layout() {
  planner::KvLayout l;
  l.k = planner::KvFormat{planner::KvType::kInt8, 0};
  l.v = planner::KvFormat{planner::KvType::kInt8, 0};
  l.block_size = 4;
  l.sink_tokens = 2;
  l.window_tokens = 8;
  return l;
}

inline BlockManagerConfig tiny_config(int64_t fp16_blocks, int64_t body_blocks,
                                      bool caching = true) {
  BlockManagerConfig c;
  c.layout = tiny_mixed_layout();
  c.model_id = "tiny";
  c.enable_prefix_caching = caching;
  c.fp16_blocks = fp16_blocks;
  c.body_blocks = body_blocks;
  return c;
}

inline BlockManager make_manager(const BlockManagerConfig& c) {
  auto m = BlockManager::create(c);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error());
  return std::move(m.value());
}

// Tokens start, start + 1, ... (n of them).
inline std::vector<int32_t> iota_tokens(int n, int32_t start = 100) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

inline std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct PoolSnapshot {
  std::vector<int32_t> refs;
  std::vector<uint32_t> gens;
  std::vector<uint8_t> keyed;
  std::vector<BlockIndex> free_order, lru_order;
  bool operator==(const PoolSnapshot&) const = default;
};

struct SeqSnapshot {
  SeqId id = 0;
  BlockTable table;
  std::vector<int32_t> tokens;
  int64_t computed = 0;
  std::vector<WindowExit> exits;
  bool operator==(const SeqSnapshot&) const = default;
};

struct Snapshot {
  PoolSnapshot pools[kPoolKinds];
  std::vector<SeqSnapshot> seqs;
  bool operator==(const Snapshot&) const = default;
};

inline Snapshot snapshot(const BlockManager& m, const std::vector<SeqId>& ids) {
  Snapshot s;
  for (int p = 0; p < kPoolKinds; ++p) {
    const BlockPool& pl = m.pool(PoolKind(p));
    PoolSnapshot& ps = s.pools[p];
    for (BlockIndex b = 0; b <= pl.n_blocks(); ++b) {
      ps.refs.push_back(pl.ref_count(b));
      ps.gens.push_back(pl.generation(b));
      ps.keyed.push_back(pl.has_key(b) ? 1 : 0);
    }
    ps.free_order = pl.free_order();
    ps.lru_order = pl.lru_order();
  }
  for (SeqId id : ids) {
    if (!m.has_sequence(id)) continue;
    auto t = m.tokens(id);
    s.seqs.push_back({id, m.table(id), std::vector<int32_t>(t.begin(), t.end()), m.num_computed(id),
                      m.blocks_leaving_window(id)});
  }
  return s;
}

#define BIE_EXPECT_INTEGRITY(m)                      \
  do {                                               \
    const ::bie::Status st_ = (m).check_integrity(); \
    EXPECT_TRUE(st_.ok()) << st_.error();            \
  } while (0)

}  // namespace bie::kv::test
