// Seeded property test: thousands of random allocate / append / forward / rollback / migrate /
// drop / fork / free operations on small pools, with check_integrity after every one. A shadow
// store plays the KV data: the "forward pass" writes each token id into the slot its table names,
// copies and migrations move shadow data, and after every operation each sequence must read its
// own tokens back through its table, and every cached block must still hold its key's tokens.
// Failed calls must leave the snapshot unchanged.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "bie/kv/block_manager.h"
#include "kv_block_test_util.h"

namespace bie::kv {
namespace {

class Sim {
 public:
  Sim(BlockManagerConfig cfg, uint32_t seed) : m_(test::make_manager(cfg)), rng_(seed) {
    B_ = cfg.layout.block_size;
    for (int p = 0; p < kPoolKinds; ++p) {
      shadow_[p].assign(static_cast<size_t>(m_.pool(PoolKind(p)).n_blocks() + 1) * B_, -1);
    }
    for (auto& base : bases_) {
      base.resize(48);
      for (int32_t& t : base) t = static_cast<int32_t>(rng_() % 3);  // tiny vocab: equal blocks
    }
  }

  void run(int n_ops) {
    for (int op = 0; op < n_ops && !::testing::Test::HasFailure(); ++op) {
      step();
      const Status st = m_.check_integrity();
      ASSERT_TRUE(st.ok()) << "after op " << op << " (" << last_ << "): " << st.error();
      verify_data(op);
    }
  }

  int64_t successes = 0, failures = 0, hits = 0, copies = 0, migrations = 0, drops = 0;

 private:
  int32_t& slot(const BlockTableEntry& e, int64_t pos) {
    return shadow_[static_cast<int>(e.pool)][static_cast<size_t>(e.block.index) * B_ + pos % B_];
  }
  size_t rnd(size_t n) { return static_cast<size_t>(rng_() % n); }
  SeqId pick() { return live_[rnd(live_.size())]; }

  void expect_unchanged(const test::Snapshot& before, bool ok) {
    if (ok) {
      ++successes;
      return;
    }
    ++failures;
    EXPECT_EQ(test::snapshot(m_, live_), before) << "failed " << last_ << " changed state";
  }

  // Writes tokens [num_computed, num_tokens) into the slots the table names (the forward pass).
  void forward(SeqId s, int64_t upto) {
    const auto toks = m_.tokens(s);
    const BlockTable& t = m_.table(s);
    for (int64_t pos = m_.num_computed(s); pos < upto; ++pos) {
      const BlockTableEntry& e = t[static_cast<size_t>(pos / B_)];
      if (e.block.index != kNullBlock) slot(e, pos) = toks[static_cast<size_t>(pos)];
    }
  }

  void do_copies(const std::vector<KvCopy>& cs) {
    for (const KvCopy& c : cs) {
      ++copies;
      ASSERT_FALSE(m_.pool(c.pool).is_stale(c.src));
      ASSERT_FALSE(m_.pool(c.pool).is_stale(c.dst));
      auto& sh = shadow_[static_cast<int>(c.pool)];
      std::copy_n(sh.begin() + static_cast<ptrdiff_t>(c.src.index) * B_, B_,
                  sh.begin() + static_cast<ptrdiff_t>(c.dst.index) * B_);
    }
  }

  void op_allocate() {
    last_ = "allocate";
    const auto& base = bases_[rnd(bases_.size())];
    std::vector<int32_t> prompt(base.begin(), base.begin() + 1 + static_cast<ptrdiff_t>(rnd(40)));
    for (size_t k = rnd(6); k > 0; --k) prompt.push_back(static_cast<int32_t>(rng_() % 3));
    const SeqId id = next_id_++;
    const bool can = m_.can_allocate(prompt);
    const int64_t expect_cached = m_.lookup_prefix(prompt).cached_tokens;
    const auto before = test::snapshot(m_, live_);
    auto r = m_.allocate(id, prompt);
    ASSERT_EQ(r.ok(), can) << "can_allocate disagrees with allocate";
    expect_unchanged(before, r.ok());
    if (!r.ok()) return;
    live_.push_back(id);
    ASSERT_EQ(r.value(), expect_cached);
    hits += r.value() > 0;
    // Chunked prefill: compute part or all of the prompt.
    const int64_t n = static_cast<int64_t>(prompt.size());
    const int64_t upto =
        r.value() + static_cast<int64_t>(rnd(static_cast<size_t>(n - r.value()) + 1));
    forward(id, upto);
    ASSERT_TRUE(m_.mark_computed(id, upto).ok());
  }

  void op_append() {
    last_ = "append";
    const SeqId s = pick();
    std::vector<int32_t> toks(1 + rnd(6));
    for (int32_t& t : toks) t = static_cast<int32_t>(rng_() % 3);
    const bool can = m_.can_append(s, static_cast<int64_t>(toks.size()));
    const auto before = test::snapshot(m_, live_);
    auto r = m_.append(s, toks);
    ASSERT_EQ(r.ok(), can) << "can_append disagrees with append";
    expect_unchanged(before, r.ok());
    if (!r.ok()) return;
    do_copies(r.value());
    // Forward over everything known (prompt rest + drafts), then reject a random tail.
    forward(s, m_.num_tokens(s));
    if (rnd(3) == 0) {
      const int64_t n = m_.num_tokens(s) - static_cast<int64_t>(rnd(toks.size() + 1));
      const auto before_t = test::snapshot(m_, live_);
      const Status t = m_.truncate(s, n);
      last_ = "append+truncate";
      expect_unchanged(before_t, t.ok());
    }
    ASSERT_TRUE(m_.mark_computed(s, m_.num_tokens(s)).ok());
  }

  void op_exits() {
    last_ = "window exits";
    const SeqId s = pick();
    for (const WindowExit& x : m_.blocks_leaving_window(s)) {
      if (x.drop) {
        auto d = m_.drop(s, x.logical);
        ASSERT_TRUE(d.ok()) << d.error();
        ++drops;
        continue;
      }
      const auto before = test::snapshot(m_, live_);
      auto mg = m_.begin_migration(s, x.logical);
      expect_unchanged(before, mg.ok());
      if (!mg.ok()) continue;
      auto& fp = shadow_[0];
      auto& body = shadow_[1];
      const auto src = fp.begin() + static_cast<ptrdiff_t>(mg->src.index) * B_;
      const auto dst = body.begin() + static_cast<ptrdiff_t>(mg->dst.index) * B_;
      if (mg->needs_quantise) {
        std::copy_n(src, B_, dst);
      } else {
        ASSERT_TRUE(std::equal(src, src + B_, dst)) << "body hit holds other data";
      }
      const size_t what = rnd(10);
      if (what == 0) {
        pending_.push_back({s, x.logical, mg->dst});  // leave it in flight
      } else if (what == 1) {
        ASSERT_TRUE(m_.abort_migration(s, x.logical).ok());
      } else {
        ASSERT_TRUE(m_.migrate(s, x.logical, mg->dst).ok());
        ++migrations;
      }
    }
  }

  void op_finish_pending() {
    last_ = "finish migrations";
    for (const auto& [s, logical, dst] : pending_) {
      if (!m_.has_sequence(s)) continue;  // freed: its migrations were aborted
      auto r = m_.migrate(s, logical, dst);
      ASSERT_TRUE(r.ok()) << r.error();
      ++migrations;
    }
    pending_.clear();
  }

  void op_fork() {
    last_ = "fork";
    const SeqId child = next_id_++;
    ASSERT_TRUE(m_.fork(pick(), child).ok());
    live_.push_back(child);
  }

  void op_free() {
    last_ = "free";
    const size_t k = rnd(live_.size());
    ASSERT_TRUE(m_.free(live_[k]).ok());
    live_.erase(live_.begin() + static_cast<ptrdiff_t>(k));
  }

  void op_truncate() {
    last_ = "truncate";
    const SeqId s = pick();
    const int64_t n = m_.num_tokens(s);
    const int64_t to = std::max<int64_t>(0, n - static_cast<int64_t>(rnd(9)));
    const auto before = test::snapshot(m_, live_);
    expect_unchanged(before, m_.truncate(s, to).ok());
  }

  void step() {
    const size_t r = rnd(100);
    if (live_.empty() || r < 22) return op_allocate();
    if (r < 50) return op_append();
    if (r < 65) return op_exits();
    if (r < 70) return op_finish_pending();
    if (r < 76 && live_.size() < 12) return op_fork();
    if (r < 90) return op_free();
    return op_truncate();
  }

  void verify_data(int op) {
    for (SeqId s : live_) {
      const auto toks = m_.tokens(s);
      const BlockTable& t = m_.table(s);
      for (int64_t pos = 0; pos < m_.num_computed(s); ++pos) {
        const BlockTableEntry& e = t[static_cast<size_t>(pos / B_)];
        if (e.block.index == kNullBlock) continue;
        ASSERT_EQ(slot(e, pos), toks[static_cast<size_t>(pos)])
            << "op " << op << " (" << last_ << "): seq " << s << " reads a wrong token at " << pos;
      }
    }
    for (int p = 0; p < kPoolKinds; ++p) {
      const BlockPool& pl = m_.pool(PoolKind(p));
      for (BlockIndex b = 1; b <= pl.n_blocks(); ++b) {
        if (!pl.has_key(b)) continue;
        const auto kt = pl.key_tokens(b);
        ASSERT_TRUE(std::equal(kt.begin(), kt.end(), shadow_[p].begin() + b * B_))
            << "op " << op << " (" << last_ << "): cached block " << b << " was overwritten";
      }
    }
  }

  BlockManager m_;
  std::mt19937 rng_;
  int B_ = 4;
  std::array<std::vector<int32_t>, kPoolKinds> shadow_;
  std::array<std::vector<int32_t>, 3> bases_;
  std::vector<SeqId> live_;
  SeqId next_id_ = 1;
  struct Pending {
    SeqId seq;
    int64_t logical;
    BlockRef dst;
  };
  std::vector<Pending> pending_;
  const char* last_ = "";
};

void run_config(const BlockManagerConfig& cfg, const char* name) {
  int64_t ok = 0, failed = 0, hits = 0, copies = 0, migrations = 0, drops = 0;
  for (uint32_t seed : {1u, 2u, 3u}) {
    Sim sim(cfg, seed);
    sim.run(4000);
    ASSERT_FALSE(::testing::Test::HasFailure()) << name << " seed " << seed;
    ok += sim.successes;
    failed += sim.failures;
    hits += sim.hits;
    copies += sim.copies;
    migrations += sim.migrations;
    drops += sim.drops;
  }
  // The random walk must actually reach the interesting states, or the test proves little.
  EXPECT_GT(ok, 1000) << name;
  EXPECT_GT(failed, 50) << name;
  if (cfg.enable_prefix_caching && cfg.local_window == 0) {
    EXPECT_GT(hits, 100) << name;
  }
  EXPECT_GT(copies, 10) << name;
  if (cfg.layout.mixed()) {
    EXPECT_GT(migrations, 100) << name;
  }
  if (cfg.local_window > 0) {
    EXPECT_GT(drops, 100) << name;
  }
}

TEST(KvBlockProperty, MixedLayoutWithPrefixCaching) {
  run_config(test::tiny_config(14, 20), "mixed+cache");
}

TEST(KvBlockProperty, MixedLayoutWithoutPrefixCaching) {
  run_config(test::tiny_config(14, 20, false), "mixed");
}

TEST(KvBlockProperty, UnmixedLayoutWithPrefixCaching) {
  auto cfg = test::tiny_config(0, 30);
  cfg.layout.k = cfg.layout.v = planner::kKvF16;
  run_config(cfg, "f16+cache");
}

TEST(KvBlockProperty, SlidingWindowGroup) {
  auto cfg = test::tiny_config(14, 20);
  cfg.local_window = 10;
  run_config(cfg, "local");
}

}  // namespace
}  // namespace bie::kv
