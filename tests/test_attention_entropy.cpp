// The attention-entropy probe behind --kv-fallback-entropy (attention/attention_entropy.h): each
// head's body mass and body entropy against a softmax in double over the keys dequantised with
// the formats' scalar load(), with FP16 sink/window blocks and a quantised body, a sliding window,
// rotated keys; a planted key makes a head spiky; and the request's figure weighs heads by mass.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "bie/attention/attention_entropy.h"
#include "bie/backend/kv_format_rotate.h"
#include "bie/kv/paged_kv_cache.h"
#include "bie/planner/kv_layout_flags.h"

namespace bie::attention {
namespace {

constexpr int kHeadDim = 64;
constexpr int kHeadsKv = 2;
constexpr int kHeads = 4;  // GQA groups of 2

planner::KvLayout layout_of(const char* k, const char* v, bool rotate = false) {
  planner::KvLayoutFlags f;
  f.dtype_k = k;
  f.dtype_v = v;
  f.sink_tokens = 16;
  f.window_tokens = 32;
  f.block_size = 16;
  f.rotate = rotate;
  auto l = planner::resolve_kv_layout(f);
  EXPECT_TRUE(l.ok()) << l.error();
  return l.ok() ? *l : planner::KvLayout{};
}

// The reference: dequantise every visible key with its format's load(), score in double.
std::vector<HeadEntropy> reference(const kv::HostKvBlocks& b, int64_t pos, const float* q,
                                   float scale, int64_t window) {
  const int B = b.block_size;
  const int64_t first = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
  std::vector<HeadEntropy> out(kHeads);
  std::vector<float> key(kHeadDim), qh(kHeadDim);
  for (int h = 0; h < kHeads; ++h) {
    std::copy(q + h * kHeadDim, q + (h + 1) * kHeadDim, qh.begin());
    if (b.rotate_keys) kv::hadamard_rotate(qh.data(), kHeadDim);
    std::vector<double> s;
    std::vector<bool> body;
    for (int64_t j = first; j <= pos; ++j) {
      const kv::KvBlockView& bv = b.blocks[static_cast<size_t>(j / B)];
      bv.tk->load(bv.gk, bv.k + (h / 2) * bv.k_tile_bytes, static_cast<int>(j % B), 1, key.data());
      double dot = 0;
      for (int c = 0; c < kHeadDim; ++c) dot += static_cast<double>(qh[c]) * key[c];
      s.push_back(dot * scale);
      body.push_back(bv.tk->type != planner::KvType::kF16 || bv.tv->type != planner::KvType::kF16);
    }
    const double m = *std::max_element(s.begin(), s.end());
    double z = 0, zb = 0;
    int64_t nb = 0;
    for (size_t j = 0; j < s.size(); ++j) {
      z += std::exp(s[j] - m);
      if (body[j]) {
        zb += std::exp(s[j] - m);
        ++nb;
      }
    }
    double hb = 0;
    for (size_t j = 0; j < s.size(); ++j) {
      if (!body[j]) continue;
      const double p = std::exp(s[j] - m) / zb;
      if (p > 0) hb -= p * std::log(p);
    }
    out[static_cast<size_t>(h)].body_mass = static_cast<float>(zb / z);
    out[static_cast<size_t>(h)].body_entropy =
        nb > 1 ? static_cast<float>(hb / std::log(static_cast<double>(nb))) : 1.0f;
  }
  return out;
}

struct Filled {
  std::unique_ptr<PagedKvCache> cache;
  std::vector<float> k;  // [n, kv_dim] as stored
};

// n tokens of random K/V through one pass, then the pass's window exits.
Filled fill(const planner::KvLayout& l, int64_t n, uint32_t seed) {
  PagedKvCacheConfig cfg;
  cfg.geometry = KvGeometry{1, kHeadsKv, kHeadDim, {}};
  cfg.layout = l;
  cfg.max_tokens = n;
  auto c = l.mixed() ? PagedKvCache::create(cfg, 8, 16) : PagedKvCache::create(cfg);
  EXPECT_TRUE(c.ok()) << c.error();
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Filled f{std::move(c).value(), std::vector<float>(static_cast<size_t>(n) * kHeadsKv * kHeadDim)};
  std::vector<float> v(f.k.size());
  for (float& x : f.k) x = nd(rng);
  for (float& x : v) x = nd(rng);
  EXPECT_TRUE(f.cache->append(n).ok());
  f.cache->store(0, 0, n, f.k.data(), v.data());
  f.cache->finish_pass();
  return f;
}

void expect_near(const std::vector<HeadEntropy>& got, const std::vector<HeadEntropy>& want,
                 const char* what) {
  for (int h = 0; h < kHeads; ++h) {
    EXPECT_NEAR(got[h].body_mass, want[h].body_mass, 2e-5) << what << " head " << h;
    EXPECT_NEAR(got[h].body_entropy, want[h].body_entropy, 2e-5) << what << " head " << h;
  }
}

TEST(AttentionEntropy, MatchesASoftmaxOverTheDequantisedKeys) {
  struct Case {
    const char* k;
    const char* v;
    bool rotate;
    int64_t window;
  };
  for (const Case& cs : {Case{"int8_channel_t16", "int8", false, 0},
                         Case{"int4_channel_t16", "int4_asym_g64", false, 0},
                         Case{"int4_asym_g64", "int4_asym_g64", true, 0},
                         Case{"f16", "int4_asym_g64", false, 0},
                         Case{"int8", "int8", false, 70}}) {
    const planner::KvLayout l = layout_of(cs.k, cs.v, cs.rotate);
    Filled f = fill(l, 120, 3);
    std::mt19937 rng(9);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> q(kHeads * kHeadDim);
    for (float& x : q) x = 2.0f * nd(rng);
    const kv::HostKvBlocks b = f.cache->host_blocks(0, 120);
    ASSERT_EQ(b.rotate_keys, cs.rotate);
    std::vector<HeadEntropy> got(kHeads);
    attention_entropy(b, f.cache->geometry(), 119, q.data(), kHeads, 0.125f, cs.window,
                      got.data());
    const std::string what = std::string(cs.k) + "/" + cs.v;
    expect_near(got, reference(b, 119, q.data(), 0.125f, cs.window), what.c_str());
    for (const HeadEntropy& h : got) {
      // Blocks 1..4 (tokens 16..87) are the body: sink 16, window 32 (the last two blocks).
      EXPECT_GT(h.body_mass, 0.05f) << what;
      EXPECT_LT(h.body_mass, 0.95f) << what;
      EXPECT_GT(h.body_entropy, 0.2f) << what;
    }
  }
}

// A query that matches one body key closely puts its weight there: body mass near 1, body
// entropy near 0; all-FP16 caches (nothing quantised) give mass 0, entropy 1, figure 1.
TEST(AttentionEntropy, APlantedKeyIsSpikyAndAnAllF16CacheIsNot) {
  Filled f = fill(layout_of("int8_channel_t16", "int8"), 120, 4);
  std::vector<float> q(kHeads * kHeadDim);
  const int64_t planted = 40;  // in the body
  for (int h = 0; h < kHeads; ++h) {
    for (int c = 0; c < kHeadDim; ++c) {
      q[h * kHeadDim + c] = 4.0f * f.k[(planted * kHeadsKv + h / 2) * kHeadDim + c];
    }
  }
  std::vector<HeadEntropy> got(kHeads);
  attention_entropy(f.cache->host_blocks(0, 120), f.cache->geometry(), 119, q.data(), kHeads,
                    0.125f, 0, got.data());
  for (const HeadEntropy& h : got) {
    EXPECT_GT(h.body_mass, 0.99f);
    EXPECT_LT(h.body_entropy, 0.05f);
  }
  EXPECT_LT(entropy_proxy(got), 0.05);

  planner::KvLayout all16;
  all16.k = all16.v = planner::kKvF16;
  all16.block_size = 16;
  Filled g = fill(all16, 120, 4);
  attention_entropy(g.cache->host_blocks(0, 120), g.cache->geometry(), 119, q.data(), kHeads,
                    0.125f, 0, got.data());
  for (const HeadEntropy& h : got) {
    EXPECT_EQ(h.body_mass, 0.0f);
    EXPECT_EQ(h.body_entropy, 1.0f);
  }
  EXPECT_EQ(entropy_proxy(got), 1.0);
}

TEST(AttentionEntropy, TheRequestsFigureWeighsHeadsByTheirBodyMass) {
  const std::vector<HeadEntropy> heads = {{0.2f, 0.9f}, {1.0f, 0.1f}, {0.5f, 0.0f}};
  EXPECT_NEAR(entropy_proxy(heads), (0.2 * 0.9 + 1.0 * 0.1) / 1.0, 1e-6);
  EXPECT_EQ(entropy_proxy({}), 1.0);
}

}  // namespace
}  // namespace bie::attention
