// PagedKvCache under chunked prefill: a long prompt fed in chunks of any size fits pools planned
// for exactly its length (blocks a chunk pushes out of the FP16 window move to the body pool
// before the chunk takes new FP16 blocks), for every mixed regime, and attention over the result
// stays close to the f16 cache's.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "bie/attention/attention_runner.h"
#include "support/generate.h"
#include "bie/kv/paged_kv_cache.h"
#include "bie/planner/kv_bytes.h"

namespace bie {
namespace {

planner::KvLayout layout(const char* k, const char* v, int window) {
  planner::KvLayout l;
  l.k = planner::parse_kv_format(k).value();
  l.v = planner::parse_kv_format(v).value();
  l.block_size = 16;
  l.sink_tokens = 8;
  l.window_tokens = window;
  return l;
}

// Feeds n_total random K/V rows in chunks of `chunk`; returns the last layer's attention output
// for the last token, or the first error.
Result<std::vector<float>> feed(PagedKvCache& kv, int64_t n_total, int64_t chunk) {
  const KvGeometry& g = kv.geometry();
  const int n_head = 2 * g.n_head_kv;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  CpuBackend pool(1);
  std::vector<float> out;
  for (int64_t pos0 = 0; pos0 < n_total; pos0 += chunk) {
    const int64_t n = std::min(chunk, n_total - pos0);
    if (Status s = kv.append(n); !s) return Error{s.error()};
    for (int il = 0; il < g.n_layer; ++il) {
      std::vector<float> k(static_cast<size_t>(n * g.kv_dim())), v(k.size()),
          q(static_cast<size_t>(n * n_head * g.head_dim));
      for (float& x : k) x = nd(rng);
      for (float& x : v) x = nd(rng);
      for (float& x : q) x = nd(rng);
      out.assign(q.size(), 0.0f);
      kv.store(il, pos0, n, k.data(), v.data());
      attention::attend(kv, il, pos0, n, q.data(), n_head, 0.125f, out.data(), pool);
    }
    kv.finish_pass();
  }
  const size_t row = static_cast<size_t>(n_head * g.head_dim);
  return std::vector<float>(out.end() - static_cast<std::ptrdiff_t>(row), out.end());
}

TEST(PagedKvChunked, LongPromptInChunksFitsPoolsPlannedForItsLength) {
  const KvGeometry g{2, 2, 64, {}};
  constexpr int64_t kTokens = 700;
  struct Regime {
    const char* k;
    const char* v;
    double bound;  // max |out - f16 out| / max |f16 out|
  };
  for (const int window : {32, 128}) {
    for (const int64_t chunk :
         {int64_t{16}, int64_t{64}, int64_t{100}, int64_t{128}, int64_t{200}, int64_t{512}}) {
      PagedKvCacheConfig c;
      c.geometry = g;
      c.max_tokens = kTokens;
      c.layout = layout("f16", "f16", window);
      auto base_kv = PagedKvCache::create(c);
      ASSERT_TRUE(base_kv.ok()) << base_kv.error();
      auto base = feed(**base_kv, kTokens, chunk);
      ASSERT_TRUE(base.ok()) << base.error();
      double scale = 0;
      for (float x : *base) scale = std::max(scale, static_cast<double>(std::fabs(x)));
      for (const Regime& r : {Regime{"int8", "int8", 0.05}, Regime{"fp8_e4m3", "fp8_e4m3", 0.15},
                              Regime{"int4_asym_g64", "int4_asym_g64", 0.4},
                              Regime{"int4_channel_t16", "int4_asym_g64", 0.4}}) {
        SCOPED_TRACE(testing::Message()
                     << r.k << "/" << r.v << " window " << window << " chunk " << chunk);
        // Per-channel keys: a chunk that starts inside a block may keep that block FP16 through
        // the pass (PerChannelKeysNeedBlockAlignedChunks); callers align chunks to blocks.
        const bool per_channel = std::string(r.k).starts_with("int4_channel");
        if (per_channel && chunk % 16 != 0) continue;
        c.layout = layout(r.k, r.v, window);
        auto kv = PagedKvCache::create(c);  // pools planned for exactly kTokens
        ASSERT_TRUE(kv.ok()) << kv.error();
        auto got = feed(**kv, kTokens, chunk);
        ASSERT_TRUE(got.ok()) << got.error();
        EXPECT_EQ((*kv)->n_tokens(), kTokens);
        ASSERT_TRUE((*kv)->check_integrity().ok()) << (*kv)->check_integrity().error();
        // After the last pass every block sits where the planner's count puts it.
        const planner::KvBlockCount want = planner::kv_block_count(c.layout, kTokens, 0);
        EXPECT_EQ((*kv)->manager().pool(kv::PoolKind::kFp16).num_active(), want.fp16);
        EXPECT_EQ((*kv)->manager().pool(kv::PoolKind::kBody).num_active(), want.body);
        double diff = 0;
        for (size_t i = 0; i < got->size(); ++i) {
          diff = std::max(diff, static_cast<double>(std::fabs((*got)[i] - (*base)[i])));
        }
        EXPECT_LT(diff / scale, r.bound);
        EXPECT_GT(diff, 0.0) << "the body was not quantised";
      }
    }
  }
}

// The dry run and the act agree: when the pools are one block short, append refuses and changes
// nothing.
TEST(PagedKvChunked, ShortPoolRefusesChunkAndChangesNothing) {
  PagedKvCacheConfig c;
  c.geometry = KvGeometry{1, 1, 64, {}};
  c.max_tokens = 400;
  c.layout = layout("int8", "int8", 32);
  // Planned for 400 tokens: FP16 = 1 sink block + up to 3 window blocks, body = up to 22 blocks.
  auto full = PagedKvCache::create(c);
  ASSERT_TRUE(full.ok()) << full.error();
  const int64_t f16 = (*full)->manager().pool(kv::PoolKind::kFp16).n_blocks();
  const int64_t body = (*full)->manager().pool(kv::PoolKind::kBody).n_blocks();
  auto short_body = PagedKvCache::create(c, f16, body - 1);
  ASSERT_TRUE(short_body.ok()) << short_body.error();
  PagedKvCache& kv = **short_body;
  ASSERT_TRUE(feed(kv, 384, 128).ok());
  const kv::BlockTable before = kv.table();
  EXPECT_FALSE(kv.can_append(16));
  EXPECT_FALSE(kv.append(16).ok());
  EXPECT_EQ(kv.table(), before);
  EXPECT_EQ(kv.n_tokens(), 384);
  EXPECT_TRUE(kv.check_integrity().ok());
  EXPECT_TRUE(kv.can_append(15));
}

TEST(PagedKvChunked, PrefillChunksEndOnBlockBoundaries) {
  // From an empty cache: full chunks, each ending on a block boundary.
  EXPECT_EQ(prefill_chunk_len(0, 1000, 512, 16), 512);
  EXPECT_EQ(prefill_chunk_len(512, 488, 512, 16), 488);  // the last chunk may end anywhere
  EXPECT_EQ(prefill_chunk_len(0, 1000, 100, 16), 96);    // 100 is not a multiple of 16
  EXPECT_EQ(prefill_chunk_len(96, 904, 100, 16), 96);
  // From inside a block (a prompt continued after decoding): up to the block's end first.
  EXPECT_EQ(prefill_chunk_len(100, 300, 512, 16), 12);
  EXPECT_EQ(prefill_chunk_len(100, 5, 512, 16), 5);
  EXPECT_EQ(prefill_chunk_len(112, 288, 512, 16), 288);
  // A chunk smaller than a block, and no alignment.
  EXPECT_EQ(prefill_chunk_len(0, 100, 8, 16), 8);
  EXPECT_EQ(prefill_chunk_len(8, 92, 8, 16), 8);
  EXPECT_EQ(prefill_chunk_len(100, 300, 512, 1), 300);
}

// int4_channel tiles are written whole, so a chunk that starts inside block P and pushes P out of
// the window keeps P in FP16 until the pass ends: one FP16 block more than the plan when the chunk
// also ends inside a block. The dry run says so (nothing changes), one spare FP16 block absorbs
// it, and block-aligned chunks (what generate() and bench do) never need it.
TEST(PagedKvChunked, PerChannelKeysNeedBlockAlignedChunks) {
  PagedKvCacheConfig c;
  c.geometry = KvGeometry{2, 2, 64, {}};
  c.max_tokens = 700;
  c.layout = layout("int4_channel_t16", "int4_asym_g64", 32);
  auto planned = PagedKvCache::create(c);
  ASSERT_TRUE(planned.ok()) << planned.error();
  const int64_t f16 = (*planned)->manager().pool(kv::PoolKind::kFp16).n_blocks();
  const int64_t body = (*planned)->manager().pool(kv::PoolKind::kBody).n_blocks();
  {
    PagedKvCache& kv = **planned;
    ASSERT_TRUE(feed(kv, 100, 100).ok());
    const kv::BlockTable before = kv.table();
    EXPECT_FALSE(kv.can_append(100));  // starts in block 6 (96..111), ends inside block 12
    const Status s = kv.append(100);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.error().find("out of budget"), std::string::npos) << s.error();
    EXPECT_EQ(kv.table(), before);
    EXPECT_TRUE(kv.can_append(12));  // up to the block boundary ...
    ASSERT_TRUE(kv.append(12).ok());
    EXPECT_TRUE(kv.can_append(88));  // ... then the rest of the chunk fits the plan
  }
  auto spare = PagedKvCache::create(c, f16 + 1, body);
  ASSERT_TRUE(spare.ok()) << spare.error();
  auto got = feed(**spare, 700, 100);
  ASSERT_TRUE(got.ok()) << got.error();
  EXPECT_TRUE((*spare)->check_integrity().ok());
}

}  // namespace
}  // namespace bie
