// PagedKvCache: paged f16 stays within fp16 rounding noise of the contiguous cache on a tiny model,
// mixed regimes stay close to f16, sink/window routing after 300 tokens, out-of-budget appends,
// rollback, and the block-table attention against a double-precision reference over dequantised
// K/V.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "bie/attention/attention_runner.h"
#include "backend/cpu/paged_attention.h"
#include "bie/common/cpu_features.h"
#include "support/generate.h"
#include "bie/kv/paged_kv_cache.h"
#include "bie/model/model.h"
#include "support/contiguous_kv_cache.h"
#include "support/tiny_llama.h"

namespace bie {
namespace {

planner::KvFormat fmt(const char* name) {
  auto f = planner::parse_kv_format(name);
  EXPECT_TRUE(f.ok()) << name;
  return f.value();
}

planner::KvLayout layout(const char* k, const char* v, int sink, int window) {
  planner::KvLayout l;
  l.k = fmt(k);
  l.v = fmt(v);
  l.block_size = 16;
  l.sink_tokens = sink;
  l.window_tokens = window;
  return l;
}

std::unique_ptr<PagedKvCache> make_paged(const KvGeometry& g, const planner::KvLayout& l,
                                         int64_t max_tokens) {
  PagedKvCacheConfig c;
  c.geometry = g;
  c.layout = l;
  c.max_tokens = max_tokens;
  auto r = PagedKvCache::create(c);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error());
  return r.ok() ? std::move(r).value() : nullptr;
}

// head_dim 64 (SmolLM2's): every format's AVX2 path, GQA 2.
test::TinyLlama tiny64() {
  test::TinyLlama t;
  t.n_embd = 256;
  t.n_head = 4;
  t.n_head_kv = 2;
  t.n_ff = 96;
  return t;
}

std::unique_ptr<Model> load_tiny(test::TinyLlama& t, const std::string& tag) {
  const std::string path = std::filesystem::temp_directory_path() / ("bie_paged_" + tag + ".gguf");
  t.gguf().write(path);
  LoadOptions lo;
  lo.max_batch_tokens = 128;
  auto m = load_model(path, lo);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error());
  return m.ok() ? std::move(m).value() : nullptr;
}

std::vector<int32_t> tokens(int n, int n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(n_vocab));
  return t;
}

// Logits of every token, fed in chunks of `chunk`.
std::vector<float> run(Model& m, KvCache& kv, const std::vector<int32_t>& toks, int chunk) {
  CpuBackend pool(2);
  std::vector<float> all, logits;
  ForwardOptions fo;
  fo.logits_all = true;
  for (size_t off = 0; off < toks.size(); off += static_cast<size_t>(chunk)) {
    const size_t len = std::min(toks.size() - off, static_cast<size_t>(chunk));
    const Status s =
        forward_into(m, std::span<const int32_t>(toks).subspan(off, len), kv, pool, logits, fo);
    EXPECT_TRUE(s.ok()) << s.error();
    if (!s) return {};
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

double max_abs(const std::vector<float>& v) {
  double m = 0.0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  }
  return m;
}

TEST(PagedKvCache, F16CloseToContiguousOnTinyModels) {
  for (int variant = 0; variant < 2; ++variant) {
    test::TinyLlama t = variant == 0 ? test::TinyLlama{} : tiny64();  // head_dim 6 (scalar), 64
    auto m = load_tiny(t, "f16_" + std::to_string(variant));
    ASSERT_NE(m, nullptr);
    const auto toks = tokens(70, t.n_vocab, 1);
    for (int chunk : {1, 7, 70}) {
      ContiguousKvCache ref(kv::kv_geometry(m->geometry()), 128);
      auto paged = make_paged(kv::kv_geometry(m->geometry()), layout("f16", "f16", 8, 128), 128);
      ASSERT_NE(paged, nullptr);
      const auto a = run(*m, ref, toks, chunk);
      const auto b = run(*m, *paged, toks, chunk);
      // Same fp16 storage and score order; online softmax with fp32 weights vs two-pass softmax
      // with fp16-rounded probabilities. The random tiny model's near one-hot softmax amplifies
      // that (measured max |dlogit| / max |logit|: 0.0006 at head_dim 6, 0.0017 at 64).
      const double rel = max_diff(a, b) / max_abs(a);
      std::printf("  tiny f16 paged vs contiguous, variant %d chunk %d: %.5f\n", variant, chunk,
                  rel);
      EXPECT_LT(rel, 0.01) << "variant " << variant << " chunk " << chunk;
      EXPECT_TRUE(paged->check_integrity().ok());
    }
    // And against the double-precision reference (the synthetic test's bar).
    const auto ref = t.reference_logits(std::vector<int>(toks.begin(), toks.begin() + 20));
    auto paged = make_paged(kv::kv_geometry(m->geometry()), layout("f16", "f16", 8, 128), 128);
    const auto got = run(*m, *paged, std::vector<int32_t>(toks.begin(), toks.begin() + 20), 5);
    for (size_t i = 0; i < ref.size(); ++i) {
      double scale = 0.0;
      for (double r : ref[i]) scale = std::max(scale, std::fabs(r));
      for (int v = 0; v < t.n_vocab; ++v) {
        ASSERT_NEAR(got[i * static_cast<size_t>(t.n_vocab) + static_cast<size_t>(v)], ref[i][v],
                    1e-2 * scale);
      }
    }
  }
}

// Quantised body: tokens before the 16-token window (except the sink block) are int8 / int4.
TEST(PagedKvCache, MixedRegimesStayCloseToF16OnTinyModel) {
  test::TinyLlama t = tiny64();
  auto m = load_tiny(t, "mixed");
  ASSERT_NE(m, nullptr);
  const auto toks = tokens(120, t.n_vocab, 2);
  // One prefill chunk, then token by token (docs/kv-cache.md §8: a later prefill chunk during
  // which an FP16 block leaves the window needs one FP16 block more than the plan holds).
  auto run2 = [&](KvCache& kv) {
    auto a = run(*m, kv, std::vector<int32_t>(toks.begin(), toks.begin() + 100), 100);
    const auto b = run(*m, kv, std::vector<int32_t>(toks.begin() + 100, toks.end()), 1);
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  auto f16 = make_paged(kv::kv_geometry(m->geometry()), layout("f16", "f16", 8, 16), 128);
  const auto base = run2(*f16);
  const double scale = max_abs(base);
  struct Case {
    const char* k;
    const char* v;
    double bound;  // max |logit - f16 logit| / max |f16 logit| over all 120 positions
  };
  // Bounds are measured values (0.18, 0.44, 0.79, 0.75 on this machine) plus margin. They are
  // large because the random tiny model is badly conditioned: with N(0, 0.3) weights its
  // attention scores are O(100), so softmax is near one-hot and a quantisation error in a score
  // flips which token wins. This test shows the regimes run end to end and that the body really
  // is quantised; SmolLM2 (test_paged_kv_golden.cpp) measures quality.
  for (const Case& c : {Case{"int8", "int8", 0.3}, Case{"fp8_e4m3", "fp8_e4m3", 0.6},
                        Case{"int4_channel_t16", "int4_asym_g64", 1.0},
                        Case{"int4_asym_g64", "int4_asym_g64", 1.0}}) {
    auto kv = make_paged(kv::kv_geometry(m->geometry()), layout(c.k, c.v, 8, 16), 128);
    ASSERT_NE(kv, nullptr);
    const auto got = run2(*kv);
    const double rel = max_diff(got, base) / scale;
    std::printf("  tiny model, K %s / V %s body: max |dlogit| / max |logit| = %.4f\n", c.k, c.v,
                rel);
    EXPECT_LT(rel, c.bound) << c.k << "/" << c.v;
    EXPECT_GT(rel, 0.0) << "the body was not quantised";
    EXPECT_TRUE(kv->check_integrity().ok());
    EXPECT_GT(kv->manager().pool(kv::PoolKind::kBody).num_active(), 0);
  }
}

TEST(PagedKvCache, SinkAndWindowBlocksAreFp16After300Tokens) {
  test::TinyLlama t = tiny64();
  auto m = load_tiny(t, "sink");
  ASSERT_NE(m, nullptr);
  const planner::KvLayout l = layout("int4_channel_t16", "int4_asym_g64", 8, 128);
  auto kv = make_paged(kv::kv_geometry(m->geometry()), l, 300);
  ASSERT_NE(kv, nullptr);
  const auto toks = tokens(300, t.n_vocab, 3);
  CpuBackend pool(2);
  std::vector<float> logits;
  int64_t fed = 0;
  while (fed < 300) {
    const int64_t len = fed == 0 ? 100 : 1;  // a prefill chunk, then decode
    ASSERT_TRUE(forward_into(*m,
                             std::span<const int32_t>(toks).subspan(static_cast<size_t>(fed),
                                                                    static_cast<size_t>(len)),
                             *kv, pool, logits)
                    .ok());
    fed += len;
    ASSERT_TRUE(kv->check_integrity().ok()) << kv->check_integrity().error() << " at " << fed;
    const kv::BlockTable& tab = kv->table();
    ASSERT_EQ(static_cast<int64_t>(tab.size()), (fed + 15) / 16);
    for (int64_t i = 0; i < static_cast<int64_t>(tab.size()); ++i) {
      const bool fp16 = kv::block_role(l, 0, i, fed) == kv::BlockRole::kFp16;
      ASSERT_EQ(tab[static_cast<size_t>(i)].pool, fp16 ? kv::PoolKind::kFp16 : kv::PoolKind::kBody)
          << "block " << i << " at " << fed;
    }
  }
  // 300 tokens = blocks 0..18; window = the last 128 tokens (172..299) = blocks 10..18.
  const kv::BlockTable& tab = kv->table();
  for (size_t i = 0; i < tab.size(); ++i) {
    const bool want_fp16 = i == 0 || i >= 10;
    EXPECT_EQ(tab[i].pool, want_fp16 ? kv::PoolKind::kFp16 : kv::PoolKind::kBody) << i;
  }
  EXPECT_EQ(kv->manager().pool(kv::PoolKind::kFp16).num_active(), 10);
  EXPECT_EQ(kv->manager().pool(kv::PoolKind::kBody).num_active(), 9);
}

// Drives a cache without a model: random K/V rows, attention at every layer.
struct Driver {
  KvGeometry g{2, 2, 64, {}};
  int n_head = 4;
  std::mt19937 rng{7};
  std::normal_distribution<float> nd{0.0f, 1.0f};
  std::vector<float> k_all, v_all;  // [n_tokens, layer, kv_dim] everything stored so far
  CpuBackend pool{2};

  std::vector<float> rnd(size_t n) {
    std::vector<float> x(n);
    for (float& e : x) e = nd(rng);
    return x;
  }
  Status step(KvCache& kv, int64_t n, std::vector<float>* out_last = nullptr,
              std::vector<float>* q_last = nullptr) {
    const int64_t pos0 = kv.n_tokens();
    if (Status s = kv.append(n); !s) return s;
    const size_t kvd = static_cast<size_t>(g.kv_dim()),
                 qd = static_cast<size_t>(n_head * g.head_dim);
    std::vector<float> out(static_cast<size_t>(n) * qd);
    std::vector<std::vector<float>> ks, vs;
    for (int il = 0; il < g.n_layer; ++il) {
      ks.push_back(rnd(static_cast<size_t>(n) * kvd));
      vs.push_back(rnd(static_cast<size_t>(n) * kvd));
      const std::vector<float> q = rnd(static_cast<size_t>(n) * qd);
      kv.store(il, pos0, n, ks.back().data(), vs.back().data());
      attention::attend(kv, il, pos0, n, q.data(), n_head, 0.125f, out.data(), pool);
      if (il == g.n_layer - 1 && out_last) *out_last = out;
      if (il == g.n_layer - 1 && q_last) *q_last = q;
    }
    kv.finish_pass();
    for (int64_t i = 0; i < n; ++i) {
      for (int il = 0; il < g.n_layer; ++il) {
        k_all.insert(k_all.end(), ks[static_cast<size_t>(il)].begin() + i * kvd,
                     ks[static_cast<size_t>(il)].begin() + (i + 1) * kvd);
        v_all.insert(v_all.end(), vs[static_cast<size_t>(il)].begin() + i * kvd,
                     vs[static_cast<size_t>(il)].begin() + (i + 1) * kvd);
      }
    }
    return {};
  }
};

TEST(PagedKvCache, OutOfBudgetAppendFailsAndChangesNothing) {
  Driver d;
  PagedKvCacheConfig c;
  c.geometry = d.g;
  c.layout = layout("f16", "f16", 8, 128);
  c.max_tokens = 1000;
  auto r = PagedKvCache::create(c, 0, 2);  // a budget of two 16-token blocks
  ASSERT_TRUE(r.ok()) << r.error();
  PagedKvCache& kv = **r;
  ASSERT_TRUE(d.step(kv, 20).ok());
  const kv::BlockTable before = kv.table();
  EXPECT_FALSE(kv.can_append(13));
  const Status s = kv.append(13);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().find("out of budget"), std::string::npos) << s.error();
  EXPECT_EQ(kv.n_tokens(), 20);
  EXPECT_EQ(kv.table(), before);
  EXPECT_TRUE(kv.check_integrity().ok());
  EXPECT_TRUE(d.step(kv, 12).ok());  // exactly the budget
  EXPECT_FALSE(kv.append(1).ok());
  EXPECT_EQ(kv.n_tokens(), 32);

  // Planned pools: the capacity is the planned length, in a mixed layout too.
  auto mixed = make_paged(d.g, layout("int4_channel_t16", "int4_asym_g64", 8, 32), 100);
  ASSERT_NE(mixed, nullptr);
  ASSERT_TRUE(d.step(*mixed, 90).ok());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(d.step(*mixed, 1).ok()) << i;
  EXPECT_FALSE(mixed->append(1).ok());
  EXPECT_EQ(mixed->n_tokens(), 100);
  EXPECT_TRUE(mixed->check_integrity().ok());
}

TEST(PagedKvCache, RollbackOnlyTouchesWindowBlocks) {
  Driver d;
  auto kv = make_paged(d.g, layout("int8", "int8", 8, 16), 200);
  ASSERT_NE(kv, nullptr);
  ASSERT_TRUE(d.step(*kv, 64).ok());
  ASSERT_TRUE(d.step(*kv, 8).ok());  // 72 tokens: blocks 1, 2 body; 3, 4 FP16
  EXPECT_EQ(kv->table()[2].pool, kv::PoolKind::kBody);
  EXPECT_EQ(kv->table()[3].pool, kv::PoolKind::kFp16);
  const kv::BlockTable before = kv->table();
  EXPECT_FALSE(kv->truncate(60).ok());  // would bring body block 2 back into the window
  EXPECT_EQ(kv->n_tokens(), 72);
  EXPECT_EQ(kv->table(), before);
  ASSERT_TRUE(kv->truncate(70).ok());  // inside the window
  EXPECT_EQ(kv->n_tokens(), 70);
  ASSERT_TRUE(d.step(*kv, 3).ok());
  EXPECT_TRUE(kv->check_integrity().ok());
  ASSERT_TRUE(kv->truncate(0).ok());  // start over
  EXPECT_EQ(kv->n_tokens(), 0);
  EXPECT_EQ(kv->manager().pool(kv::PoolKind::kBody).num_active(), 0);
  ASSERT_TRUE(d.step(*kv, 5).ok());
  EXPECT_TRUE(kv->check_integrity().ok());
}

// The block walk (causal mask, GQA mapping, tiles, formats, migration) against attention in
// double over what the cache stores, dequantised with the formats' reference `load`.
TEST(PagedKvCache, AttentionMatchesReferenceOverStoredValues) {
  for (const char* kname : {"f16", "int8", "fp8_e4m3", "int4_channel_t16", "int4_asym_g32"}) {
    const char* vname = std::string(kname) == "int4_channel_t16" ? "int4_asym_g64" : kname;
    for (int64_t len : {1, 15, 16, 17, 50}) {
      Driver d;
      auto kv = make_paged(d.g, layout(kname, vname, 8, 16), 64);
      ASSERT_NE(kv, nullptr);
      if (len > 1) {
        ASSERT_TRUE(d.step(*kv, len - 1).ok());  // earlier blocks may migrate here
      }
      std::vector<float> out, q;
      ASSERT_TRUE(d.step(*kv, 1, &out, &q).ok());
      // Reference for the last layer's last token over dequantised K/V read through the table.
      const int hd = d.g.head_dim, H = d.g.n_head_kv, L = d.g.n_layer, il = L - 1;
      const kv::BlockTable& tab = kv->table();
      double worst = 0.0, mag = 0.0;
      for (int h = 0; h < d.n_head; ++h) {
        const int hk = h / (d.n_head / H);
        std::vector<double> s(static_cast<size_t>(len));
        std::vector<std::vector<float>> vrows;
        for (int64_t j = 0; j < len; ++j) {
          const kv::BlockTableEntry& e = tab[static_cast<size_t>(j / 16)];
          const bool body = e.pool == kv::PoolKind::kBody;
          const planner::KvFormat fk = body ? fmt(kname) : planner::kKvF16;
          const planner::KvFormat fv = body ? fmt(vname) : planner::kKvF16;
          const size_t kt = kv::kv_tile_bytes(fk, hd, 16), vt = kv::kv_tile_bytes(fv, hd, 16);
          const uint8_t* blk = kv->block_storage(e);
          const uint8_t* layer = blk + static_cast<size_t>(il) * H * (kt + vt);
          std::vector<float> kr(static_cast<size_t>(hd)), vr(static_cast<size_t>(hd));
          kv::kv_traits_scalar(fk.type)->load(kv::kv_row_geom(fk, hd), layer + hk * kt,
                                              static_cast<int>(j % 16), 1, kr.data());
          kv::kv_traits_scalar(fv.type)->load(kv::kv_row_geom(fv, hd), layer + H * kt + hk * vt,
                                              static_cast<int>(j % 16), 1, vr.data());
          double dot = 0.0;
          for (int c = 0; c < hd; ++c)
            dot += static_cast<double>(q[static_cast<size_t>(h * hd + c)]) *
                   kr[static_cast<size_t>(c)];
          // The AVX2 / AVX-512 kernels score int4_channel tiles by the int8-query method: the
          // reference takes the method's scores (its scalar twin) there.
          if (fk.type == planner::KvType::kInt4Channel && hd % 64 == 0 && has_avx2()) {
            const float* qh = q.data() + static_cast<size_t>(h) * hd;
            std::vector<float> sc(16);
            attention::detail::int4_channel_scores_i8q(hd, layer + hk * kt, 16, &qh, 1, sc.data(),
                                                       16);
            dot = sc[static_cast<size_t>(j % 16)];
          }
          s[static_cast<size_t>(j)] = 0.125 * dot;
          vrows.push_back(vr);
        }
        double mx = -1e300, sum = 0.0;
        for (double x : s) mx = std::max(mx, x);
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (int c = 0; c < hd; ++c) {
          double o = 0.0;
          for (int64_t j = 0; j < len; ++j)
            o += s[static_cast<size_t>(j)] / sum *
                 vrows[static_cast<size_t>(j)][static_cast<size_t>(c)];
          worst = std::max(worst, std::fabs(o - out[static_cast<size_t>(h * hd + c)]));
          mag = std::max(mag, std::fabs(o));
        }
      }
      // fp16 rounding of q and p on FP16 tiles (2^-11 relative) is the only deliberate difference.
      EXPECT_LT(worst, 2e-3 * std::max(mag, 1.0)) << kname << " len " << len;
      EXPECT_TRUE(kv->check_integrity().ok());
    }
  }
}

}  // namespace
}  // namespace bie

namespace bie {
namespace {

// A KV layer map stores each layer as a uniform cache of that layer's formats would: the same
// K/V and queries through a mapped cache and through one uniform cache per format give
// bit-identical attention at every layer and step (prefill straight into the body, decode steps
// whose window exits are quantised into the layer's own body format).
TEST(PagedKvCache, LayerMapStoresEachLayerAsAUniformCacheOfItsFormats) {
  const KvGeometry g{3, 2, 64, {}};
  const int n_head = 4;
  const char* formats[3][2] = {{"int4_channel_t16", "int4_asym_g64"},
                               {"int8_channel_t16", "int8"},
                               {"fp8_e4m3", "int4_asym_g32"}};
  planner::KvLayout mapped = layout("f16", "f16", 4, 32);
  std::vector<std::unique_ptr<PagedKvCache>> uniform;
  for (const auto& f : formats) {
    mapped.per_layer.push_back({fmt(f[0]), fmt(f[1])});
    uniform.push_back(make_paged(g, layout(f[0], f[1], 4, 32), 256));
    ASSERT_NE(uniform.back(), nullptr);
  }
  auto m = make_paged(g, mapped, 256);
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(m->store().coordinator().n_groups(), 3);

  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const auto rnd = [&](int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& e : x) e = nd(rng);
    return x;
  };
  CpuBackend pool{2};
  const int64_t kvd = g.kv_dim(), qd = int64_t{n_head} * g.head_dim;
  int64_t compared = 0;
  for (int64_t n : {96, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}) {
    const int64_t pos0 = m->n_tokens();
    ASSERT_TRUE(m->append(n).ok());
    for (auto& u : uniform) ASSERT_TRUE(u->append(n).ok());
    for (int il = 0; il < g.n_layer; ++il) {
      const std::vector<float> k = rnd(n * kvd), v = rnd(n * kvd), q = rnd(n * qd);
      std::vector<float> out_m(static_cast<size_t>(n * qd)), out_u(out_m.size());
      m->store(il, pos0, n, k.data(), v.data());
      attention::attend(*m, il, pos0, n, q.data(), n_head, 0.125f, out_m.data(), pool);
      PagedKvCache& u = *uniform[static_cast<size_t>(il)];
      for (auto& other : uniform) other->store(il, pos0, n, k.data(), v.data());
      attention::attend(u, il, pos0, n, q.data(), n_head, 0.125f, out_u.data(), pool);
      ASSERT_EQ(0, std::memcmp(out_m.data(), out_u.data(), out_m.size() * sizeof(float)))
          << "layer " << il << " at " << pos0;
      ++compared;
    }
    m->finish_pass();
    for (auto& u : uniform) u->finish_pass();
  }
  EXPECT_EQ(compared, 21 * 3);
  // The body pools hold each layer's format: every group quantised its window exits.
  for (int gi = 0; gi < 3; ++gi) {
    EXPECT_GT(m->store().coordinator().manager(gi).pool(kv::PoolKind::kBody).num_active(), 0) << gi;
  }
  ASSERT_TRUE(m->check_integrity().ok()) << m->check_integrity().error();
}

}  // namespace
}  // namespace bie
