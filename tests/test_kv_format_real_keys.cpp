// Measurement behind docs/kv-formats.md's int4 key recipe: runs a real model over real text,
// records its roped fp32 K rows, V rows and queries, then scores every stored K format with the
// fused dot kernels against the exact fp32 scores. Disabled by default (tens of seconds); run
//   build/bie_tests --gtest_also_run_disabled_tests --gtest_filter='*KvFormatRealKeys*'
// (BIE_KV_MEASURE_TOKENS overrides the context length, default 2048).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "support/generate.h"
#include "support/contiguous_kv_cache.h"
#include "bie/backend/kv_format.h"
#include "bie/backend/kv_format_rotate.h"
#include "bie/model/model.h"
#include "bie/tokenizer/tokenizer.h"
#include "support/paths.h"

namespace bie::kv {
namespace {

using planner::KvFormat;
using planner::KvType;

// Delegates to ContiguousKvCache (behaviour unchanged) and keeps a fp32 copy of what passes by.
class RecordingKvCache final : public KvCache {
 public:
  RecordingKvCache(const KvGeometry& g, int64_t max_tokens) : inner_(g, max_tokens) {
    k_.resize(static_cast<size_t>(g.n_layer));
    v_.resize(static_cast<size_t>(g.n_layer));
    q_.resize(static_cast<size_t>(g.n_layer));
  }
  const KvGeometry& geometry() const override { return inner_.geometry(); }
  int64_t n_tokens() const override { return inner_.n_tokens(); }
  int64_t capacity() const override { return inner_.capacity(); }
  bool can_append(int64_t n) const override { return inner_.can_append(n); }
  Status append(int64_t n) override { return inner_.append(n); }
  void store(int il, int64_t pos0, int64_t n, const float* k, const float* v) override {
    const size_t kv_dim = static_cast<size_t>(geometry().kv_dim());
    auto& K = k_[static_cast<size_t>(il)];
    auto& V = v_[static_cast<size_t>(il)];
    K.resize(static_cast<size_t>(pos0 + n) * kv_dim);
    V.resize(static_cast<size_t>(pos0 + n) * kv_dim);
    std::copy(k, k + n * static_cast<int64_t>(kv_dim),
              K.begin() + static_cast<int64_t>(pos0 * kv_dim));
    std::copy(v, v + n * static_cast<int64_t>(kv_dim),
              V.begin() + static_cast<int64_t>(pos0 * kv_dim));
    inner_.store(il, pos0, n, k, v);
  }
  void attend(int il, int64_t pos0, int64_t n, const float* q, int n_head, float scale, float* out,
              Backend& pool, int64_t window = 0) override {
    n_head_ = n_head;
    scale_ = scale;
    const size_t qd = static_cast<size_t>(n_head) * static_cast<size_t>(geometry().head_dim);
    auto& Q = q_[static_cast<size_t>(il)];
    Q.resize(static_cast<size_t>(pos0 + n) * qd);
    std::copy(q, q + n * static_cast<int64_t>(qd), Q.begin() + static_cast<int64_t>(pos0 * qd));
    inner_.attend(il, pos0, n, q, n_head, scale, out, pool, window);
  }
  Status truncate(int64_t n) override { return inner_.truncate(n); }

  std::vector<std::vector<float>> k_, v_, q_;  // per layer: [n_tokens, kv_dim] / [n, n_head*hd]
  int n_head_ = 0;
  float scale_ = 1.0f;

 private:
  ContiguousKvCache inner_;
};

struct Recipe {
  const char* name;
  KvFormat fmt;
  bool rotate;
};

struct Errors {
  double score_se = 0, score_n = 0;  // squared score error (logit units) over quantised keys
  double tv = 0, kl = 0, out_rel = 0, n_q = 0;
  double top1_agree = 0;
};

constexpr int kBlock = 16;  // paged block size; int4_channel tiles are one block
constexpr int kSinkBlocks = 1;
constexpr int kWindow = 128;

// Scores every recipe on the recorded layers. `regime`: the first block and the last kWindow
// keys (rounded out to whole blocks) stay exact, as the mixed-precision cache keeps them in FP16.
void measure(const RecordingKvCache& rec, const KvGeometry& geo, int n_tok, bool regime,
             const std::vector<Recipe>& recipes, std::vector<Errors>& errs) {
  const int d = geo.head_dim, n_kv = geo.n_head_kv, n_head = rec.n_head_, grp = n_head / n_kv;
  const int kv_dim = geo.kv_dim();
  const int q_first = std::min(512, n_tok / 2), q_step = 32;
  std::vector<float> rows(static_cast<size_t>(n_tok) * d), qv(d), s_ref(n_tok), s_q(n_tok);
  std::vector<float> o_ref(d), o_q(d);
  std::vector<char> quantised(n_tok);
  for (size_t r = 0; r < recipes.size(); ++r) {
    const Recipe& rc = recipes[r];
    const KvFormatTraits& tr = *kv_traits(rc.fmt.type);
    const KvRowGeom g = kv_row_geom(rc.fmt, d);
    for (int il = 0; il < geo.n_layer; ++il) {
      for (int h = 0; h < n_kv; ++h) {
        for (int t = 0; t < n_tok; ++t) {
          std::copy_n(rec.k_[il].data() + static_cast<size_t>(t) * kv_dim + h * d, d,
                      rows.data() + static_cast<size_t>(t) * d);
          if (rc.rotate) hadamard_rotate(rows.data() + static_cast<size_t>(t) * d, d);
        }
        const int n_full = n_tok / kBlock * kBlock;
        std::vector<uint8_t> packed(kv_tile_bytes(rc.fmt, d, n_full));
        for (int t = 0; t < n_full; t += kBlock) {
          tr.store(g, rows.data() + static_cast<size_t>(t) * d,
                   packed.data() + kv_tile_bytes(rc.fmt, d, t), 0, kBlock);
        }
        for (int hq = h * grp; hq < (h + 1) * grp; ++hq) {
          for (int i = q_first; i < n_tok; i += q_step) {
            const float* q = rec.q_[il].data() + static_cast<size_t>(i) * n_head * d + hq * d;
            const int n_keys = i + 1;
            for (int j = 0; j < n_keys; ++j) {
              const float* k = rec.k_[il].data() + static_cast<size_t>(j) * kv_dim + h * d;
              double s = 0;
              for (int c = 0; c < d; ++c) s += static_cast<double>(q[c]) * k[c];
              s_ref[j] = static_cast<float>(s * rec.scale_);
            }
            std::copy_n(q, d, qv.data());
            if (rc.rotate) hadamard_rotate(qv.data(), d);
            // Fused scores block by block, as attention will call them.
            const int exact_from =
                regime ? (std::max(0, n_keys - kWindow) / kBlock * kBlock) : n_keys;
            for (int b = 0; b < n_keys; b += kBlock) {
              const int n = std::min(kBlock, n_keys - b);
              const bool exact =
                  (regime && b < kSinkBlocks * kBlock) || b >= exact_from || b + n > n_full;
              std::fill_n(quantised.begin() + b, n, exact ? 0 : 1);
              if (exact) {
                std::copy_n(s_ref.data() + b, n, s_q.data() + b);
                continue;
              }
              tr.dot(g, qv.data(), packed.data() + kv_tile_bytes(rc.fmt, d, b), 0, n,
                     s_q.data() + b);
              for (int j = b; j < b + n; ++j) s_q[j] *= rec.scale_;
            }
            // Errors over the keys that were quantised; softmax over all keys.
            Errors& e = errs[r];
            double mx_r = -1e30, mx_q = -1e30;
            int arg_r = 0, arg_q = 0;
            for (int j = 0; j < n_keys; ++j) {
              const double diff = s_q[j] - s_ref[j];
              if (quantised[j]) {  // score error over the keys the recipe quantised
                e.score_se += diff * diff;
                e.score_n += 1;
              }
              if (s_ref[j] > mx_r) mx_r = s_ref[j], arg_r = j;
              if (s_q[j] > mx_q) mx_q = s_q[j], arg_q = j;
            }
            double zr = 0, zq = 0;
            for (int j = 0; j < n_keys; ++j) {
              zr += std::exp(s_ref[j] - mx_r);
              zq += std::exp(s_q[j] - mx_q);
            }
            std::fill(o_ref.begin(), o_ref.end(), 0.0f);
            std::fill(o_q.begin(), o_q.end(), 0.0f);
            double tv = 0, kl = 0;
            for (int j = 0; j < n_keys; ++j) {
              const double pr = std::exp(s_ref[j] - mx_r) / zr, pq = std::exp(s_q[j] - mx_q) / zq;
              tv += std::fabs(pr - pq);
              if (pr > 0) kl += pr * (std::log(pr) - std::log(std::max(pq, 1e-300)));
              const float* v = rec.v_[il].data() + static_cast<size_t>(j) * kv_dim + h * d;
              for (int c = 0; c < d; ++c) {
                o_ref[c] += static_cast<float>(pr) * v[c];
                o_q[c] += static_cast<float>(pq) * v[c];
              }
            }
            double on = 0, od = 0;
            for (int c = 0; c < d; ++c) {
              on += (o_q[c] - o_ref[c]) * (o_q[c] - o_ref[c]);
              od += o_ref[c] * o_ref[c];
            }
            e.tv += 0.5 * tv;
            e.kl += kl;
            e.out_rel += std::sqrt(on / std::max(od, 1e-30));
            e.top1_agree += arg_r == arg_q ? 1 : 0;
            e.n_q += 1;
          }
        }
      }
    }
  }
}

TEST(KvFormatRealKeys, DISABLED_Int4KeyRecipes) {
  const char* model_env = std::getenv("BIE_KV_MEASURE_MODEL");
  const std::string path = model_env ? model_env : test::smollm2_path();
  auto m = load_model(path);
  if (!m.ok()) GTEST_SKIP() << m.error();
  Model& model = *m.value();
  auto tok = tokenizer::Tokenizer::from_gguf(model.file());
  ASSERT_TRUE(tok.ok()) << tok.error();
  const std::string text = test::read_file("/work/shared/data/tinyshakespeare.txt");
  ASSERT_FALSE(text.empty());
  const char* n_env = std::getenv("BIE_KV_MEASURE_TOKENS");
  const int n_tok = n_env ? std::atoi(n_env) : 2048;
  std::vector<int32_t> ids = tok->encode(text.substr(0, static_cast<size_t>(n_tok) * 8));
  ASSERT_GE(static_cast<int>(ids.size()), n_tok);
  ids.resize(static_cast<size_t>(n_tok));

  const KvGeometry geo = kv::kv_geometry(model.geometry());
  RecordingKvCache rec(geo, n_tok);
  CpuBackend pool(2);
  std::vector<float> logits;
  for (int i = 0; i < n_tok; i += 512) {
    const int n = std::min(512, n_tok - i);
    ASSERT_TRUE(forward_into(model,
                             std::span<const int32_t>(ids.data() + i, static_cast<size_t>(n)), rec,
                             pool, logits)
                    .ok());
  }

  const std::vector<Recipe> recipes = {
      {"f16", {KvType::kF16, 0}, false},
      {"fp8_e4m3", {KvType::kFp8E4M3, 0}, false},
      {"int8", {KvType::kInt8, 0}, false},
      {"int4_asym_g32", {KvType::kInt4Asym, 32}, false},
      {"int4_asym_g64", {KvType::kInt4Asym, 64}, false},
      {"int4_asym_g64 + rotate", {KvType::kInt4Asym, 64}, true},
      {"int4_asym_g32 + rotate", {KvType::kInt4Asym, 32}, true},
      {"int4_channel_t16", {KvType::kInt4Channel, 16}, false},
      {"int4_channel_t16 + rotate", {KvType::kInt4Channel, 16}, true},
  };
  std::printf(
      "model %s: %d layers, %d KV heads, head_dim %d, %d query heads, %d tokens of "
      "tinyshakespeare; queries every 32nd position from %d\n",
      model.geometry().name.c_str(), geo.n_layer, geo.n_head_kv, geo.head_dim, rec.n_head_, n_tok,
      std::min(512, n_tok / 2));
  std::vector<double> tv_regime(recipes.size());
  for (bool regime : {false, true}) {
    std::vector<Errors> errs(recipes.size());
    measure(rec, geo, n_tok, regime, recipes, errs);
    std::printf("\n%s\n", regime ? "regime: block 0 (sinks) and last 128 keys exact, body quantised"
                                 : "all keys quantised");
    std::printf(
        "| K recipe | B/head-token | score RMSE | softmax TV | softmax KL | out rel err | top-1 "
        "key |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
    for (size_t r = 0; r < recipes.size(); ++r) {
      const Errors& e = errs[r];
      std::printf("| %s | %llu | %.4f | %.4f | %.5f | %.4f | %.1f %% |\n", recipes[r].name,
                  static_cast<unsigned long long>(
                      planner::bytes_per_head_token(recipes[r].fmt, geo.head_dim)),
                  std::sqrt(e.score_se / e.score_n), e.tv / e.n_q, e.kl / e.n_q, e.out_rel / e.n_q,
                  100.0 * e.top1_agree / e.n_q);
      if (regime) tv_regime[r] = e.tv / e.n_q;
    }
  }
  // Sanity that keeps this measurement honest: more bits must not be worse.
  EXPECT_LT(tv_regime[0], tv_regime[2]);  // f16 < int8
  EXPECT_LT(tv_regime[2], tv_regime[4]);  // int8 < int4 g64
}

}  // namespace
}  // namespace bie::kv
