// KV events from the block manager (kv/kv_event_sink.h): every full block that enters the prefix
// index is reported once as stored, every block that leaves it once as removed, so a subscriber
// that replays the events holds exactly the manager's index — through hits, copy-on-write,
// window exits (FP16 -> body), LRU evictions and rollbacks. Tiny fake shapes (4-token blocks,
// int8 body, 2 sink tokens, 8-token FP16 window; kv_block_test_util.h).
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <string>

#include "bie/kv/block_manager.h"
#include "bie/kv/prefix_hash.h"
#include "kv_block_test_util.h"

namespace bie::kv {
namespace {

using test::iota_tokens;
using test::make_manager;
using test::tiny_config;
using Tok = std::vector<int32_t>;

struct Event {
  bool stored = false;
  std::string medium;
  uint64_t chain = 0;
  std::optional<uint64_t> parent;
  Tok tokens;
  int block_size = 0;
};

// Records every event and keeps the set of (medium, chain) a subscriber would rebuild.
struct RecordingSink final : KvEventSink {
  std::vector<Event> events;
  std::set<std::pair<std::string, uint64_t>> held;
  std::string error;  // first inconsistency seen (a removal of a block never stored, ...)

  void block_stored(std::string_view medium, uint64_t chain, std::optional<uint64_t> parent,
                    std::span<const int32_t> tokens, int block_size) override {
    events.push_back(
        {true, std::string(medium), chain, parent, Tok(tokens.begin(), tokens.end()), block_size});
    if (!held.emplace(std::string(medium), chain).second && error.empty()) {
      error = "stored twice: " + std::string(medium);
    }
  }
  void block_removed(std::string_view medium, uint64_t chain) override {
    events.push_back({false, std::string(medium), chain, std::nullopt, {}, 0});
    if (held.erase({std::string(medium), chain}) != 1 && error.empty()) {
      error = "removed but not held: " + std::string(medium);
    }
  }
};

std::set<std::pair<std::string, uint64_t>> index_of(const BlockManager& m) {
  std::set<std::pair<std::string, uint64_t>> out;
  for (const CachedBlock& b : m.cached_blocks()) out.emplace(m.event_medium(b.pool), b.chain);
  return out;
}

BlockManagerConfig with_sink(BlockManagerConfig c, KvEventSink* s) {
  c.events = s;
  c.events_medium = "int8";
  return c;
}

TEST(KvEvents, StoredBlocksCarryChainParentTokensAndMedium) {
  RecordingSink sink;
  BlockManager m = make_manager(with_sink(tiny_config(8, 8), &sink));
  const Tok p = iota_tokens(9);  // blocks 0, 1 full; block 2 holds the last token
  ASSERT_TRUE(m.allocate(1, p).ok());
  ASSERT_TRUE(m.mark_computed(1, 9).ok());
  ASSERT_EQ(sink.events.size(), 2u);
  const uint64_t root = prefix_root_hash("tiny");
  const uint64_t c0 = prefix_chain_hash(root, std::span(p).first(4));
  const uint64_t c1 = prefix_chain_hash(c0, std::span(p).subspan(4, 4));
  const Event& e0 = sink.events[0];
  EXPECT_TRUE(e0.stored);
  EXPECT_EQ(e0.medium, "int8/fp16");  // 9 tokens: every block is still in the FP16 window
  EXPECT_EQ(e0.chain, c0);
  EXPECT_EQ(e0.parent, std::nullopt);  // a sequence's first block has no parent
  EXPECT_EQ(e0.tokens, (Tok{100, 101, 102, 103}));
  EXPECT_EQ(e0.block_size, 4);
  EXPECT_EQ(sink.events[1].chain, c1);
  EXPECT_EQ(sink.events[1].parent, std::optional<uint64_t>(c0));
  EXPECT_EQ(sink.events[1].tokens, (Tok{104, 105, 106, 107}));
  // A second request with the same prefix hits: no new events.
  ASSERT_TRUE(m.allocate(2, p).ok());
  ASSERT_TRUE(m.mark_computed(2, 9).ok());
  EXPECT_EQ(sink.events.size(), 2u);
  EXPECT_EQ(index_of(m), sink.held);
}

TEST(KvEvents, EvictionOfACachedBlockIsReported) {
  RecordingSink sink;
  // 3 FP16 blocks, no room for two 2-block sequences at once.
  BlockManager m = make_manager(with_sink(tiny_config(3, 4), &sink));
  const Tok a = iota_tokens(8, 100);
  ASSERT_TRUE(m.allocate(1, a).ok());
  ASSERT_TRUE(m.mark_computed(1, 8).ok());
  ASSERT_TRUE(m.free(1).ok());  // both blocks cached (LRU: block 1 of a first, tail first)
  ASSERT_EQ(sink.held.size(), 2u);
  const Tok b = iota_tokens(12, 500);  // needs 3 fresh blocks: 1 free + 2 evicted
  ASSERT_TRUE(m.allocate(2, b).ok());
  std::vector<Event> removed;
  for (const Event& e : sink.events)
    if (!e.stored) removed.push_back(e);
  ASSERT_EQ(removed.size(), 2u);
  const uint64_t c0 = prefix_chain_hash(prefix_root_hash("tiny"), std::span(a).first(4));
  // The tail goes first (freed in reverse order), then the head.
  EXPECT_EQ(removed[1].chain, c0);
  EXPECT_EQ(removed[0].medium, "int8/fp16");
  EXPECT_TRUE(sink.error.empty()) << sink.error;
  EXPECT_EQ(index_of(m), sink.held);
  EXPECT_TRUE(sink.held.empty());
}

TEST(KvEvents, WindowExitsStoreTheBodyCopy) {
  RecordingSink sink;
  BlockManager m = make_manager(with_sink(tiny_config(8, 8), &sink));
  const Tok p = iota_tokens(20);
  ASSERT_TRUE(m.allocate(1, p).ok());
  ASSERT_TRUE(m.mark_computed(1, 20).ok());
  for (const WindowExit& x : m.blocks_leaving_window(1)) {
    ASSERT_FALSE(x.drop);
    auto mg = m.begin_migration(1, x.logical);
    ASSERT_TRUE(mg.ok()) << mg.error();
    ASSERT_TRUE(m.migrate(1, x.logical, mg->dst).ok());
  }
  std::multiset<std::string> media;
  for (const Event& e : sink.events) media.insert(e.medium);
  EXPECT_GT(media.count("int8/body"), 0u);
  EXPECT_GT(media.count("int8/fp16"), 0u);
  EXPECT_TRUE(sink.error.empty()) << sink.error;
  EXPECT_EQ(index_of(m), sink.held);
}

// Random workloads: after every operation the set rebuilt from the events equals the index.
TEST(KvEvents, ReplayedEventsEqualTheIndexUnderRandomWork) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    RecordingSink sink;
    BlockManager m = make_manager(with_sink(tiny_config(6, 10), &sink));
    std::mt19937 rng(seed);
    std::map<SeqId, int64_t> live;  // seq -> tokens written
    SeqId next = 1;
    for (int op = 0; op < 300; ++op) {
      const int what = static_cast<int>(rng() % 4);
      if (what == 0 || live.empty()) {
        // A prompt from a few shared prefixes, so hits, sharing and evictions all happen.
        Tok p = iota_tokens(4 * static_cast<int>(rng() % 3), 1000 * static_cast<int>(rng() % 3));
        const Tok tail = iota_tokens(1 + static_cast<int>(rng() % 9), static_cast<int>(rng() % 50));
        p.insert(p.end(), tail.begin(), tail.end());
        if (!m.can_allocate(p)) continue;
        ASSERT_TRUE(m.allocate(next, p).ok());
        ASSERT_TRUE(m.mark_computed(next, static_cast<int64_t>(p.size())).ok());
        live[next++] = static_cast<int64_t>(p.size());
      } else {
        auto it = live.begin();
        std::advance(it, static_cast<long>(rng() % live.size()));
        const SeqId s = it->first;
        if (what == 1) {
          ASSERT_TRUE(m.free(s).ok());
          live.erase(it);
        } else if (what == 2) {
          const Tok t = iota_tokens(1 + static_cast<int>(rng() % 5), static_cast<int>(rng() % 7));
          if (!m.can_append(s, static_cast<int64_t>(t.size()))) continue;
          ASSERT_TRUE(m.append(s, t).ok());
          it->second += static_cast<int64_t>(t.size());
          ASSERT_TRUE(m.mark_computed(s, it->second).ok());
          for (const WindowExit& x : m.blocks_leaving_window(s)) {
            auto mg = m.begin_migration(s, x.logical);
            if (!mg) break;
            ASSERT_TRUE(m.migrate(s, x.logical, mg->dst).ok());
          }
        } else {
          // Roll back into the FP16 window (refused when it would touch a body block).
          const int64_t n = std::max<int64_t>(1, it->second - 1 - static_cast<int64_t>(rng() % 4));
          if (m.truncate(s, n).ok()) it->second = n;
        }
      }
      ASSERT_TRUE(m.check_integrity().ok()) << m.check_integrity().error();
      ASSERT_TRUE(sink.error.empty()) << "seed " << seed << " op " << op << ": " << sink.error;
      ASSERT_EQ(index_of(m), sink.held) << "seed " << seed << " op " << op;
    }
  }
}

}  // namespace
}  // namespace bie::kv
