// PagedKvCache on SmolLM2-135M: the all-f16 paged cache against the contiguous cache and
// llama.cpp on the golden prompts, and the quantised regimes' logit deltas against f16, held at
// their measured values plus a stated margin.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "bie/kv/paged_kv_cache.h"
#include "bie/model/model.h"
#include "bie/tokenizer/tokenizer.h"
#include "support/contiguous_kv_cache.h"
#include "support/generate.h"
#include "support/paths.h"

namespace bie {
namespace {

class PagedSmolLM2 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::ifstream f(test::source_dir() + "/tests/golden/smollm2/logits.json");
    if (f) golden_ = new nlohmann::json(nlohmann::json::parse(f));
    auto m = load_model(test::smollm2_path());
    if (m.ok()) model_ = std::move(m).value().release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete golden_;
    model_ = nullptr;
    golden_ = nullptr;
  }
  void SetUp() override {
    BIE_REQUIRE_FILE(test::smollm2_path());
    ASSERT_NE(model_, nullptr) << "SmolLM2 missing (run `make models`)";
    ASSERT_NE(golden_, nullptr) << "tests/golden/smollm2/logits.json missing";
  }
  static std::unique_ptr<PagedKvCache> paged(const char* k, const char* v, int window,
                                             int64_t max_tokens) {
    PagedKvCacheConfig c;
    c.geometry = kv::kv_geometry(model_->geometry());
    c.layout.k = planner::parse_kv_format(k).value();
    c.layout.v = planner::parse_kv_format(v).value();
    c.layout.window_tokens = window;
    c.max_tokens = max_tokens;
    auto r = PagedKvCache::create(c);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error());
    return r.ok() ? std::move(r).value() : nullptr;
  }
  static Model* model_;
  static nlohmann::json* golden_;
};
Model* PagedSmolLM2::model_ = nullptr;
nlohmann::json* PagedSmolLM2::golden_ = nullptr;

// Largest |a - b| over the 10 highest logits of a.
double top10_delta(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<int> idx(a.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int>(i);
  std::partial_sort(idx.begin(), idx.begin() + 10, idx.end(), [&](int x, int y) {
    return a[static_cast<size_t>(x)] > a[static_cast<size_t>(y)];
  });
  double d = 0.0;
  for (int i = 0; i < 10; ++i) {
    const size_t j = static_cast<size_t>(idx[static_cast<size_t>(i)]);
    d = std::max(d, static_cast<double>(std::fabs(a[j] - b[j])));
  }
  return d;
}

TEST_F(PagedSmolLM2, F16PagedCloseToContiguousOnGoldenPrompts) {
  CpuBackend pool(2);
  double worst = 0.0;
  for (const auto& p : (*golden_)["prompts"]) {
    const auto ids = p["prompt_ids"].get<std::vector<int32_t>>();
    ContiguousKvCache ref(kv::kv_geometry(model_->geometry()), 256);
    auto kv = paged("f16", "f16", 128, 256);
    ASSERT_NE(kv, nullptr);
    auto a = prompt_logits(*model_, ref, pool, ids, 64);
    auto b = prompt_logits(*model_, *kv, pool, ids, 64);
    ASSERT_TRUE(a.ok() && b.ok());
    const double d = top10_delta(*a, *b);
    worst = std::max(worst, d);
    // Online softmax (fp32 weights) vs dense_attention's two-pass softmax with fp16-rounded
    // probabilities: SmolLM2 amplifies that rounding noise to top-10 deltas of 0.16-0.58
    // (measured); the bar is llama.cpp's.
    EXPECT_LE(d, 0.6) << p["name"];
    // Golden top-10 ids too, against llama.cpp's bar (test_model_golden.cpp).
    for (const auto& e : p["top_logits"]) {
      EXPECT_NEAR((*b)[e[0].get<size_t>()], e[1].get<double>(), 0.6) << p["name"];
    }
    EXPECT_TRUE(kv->check_integrity().ok());
  }
  std::printf("paged f16 vs contiguous, worst top-10 logit delta: %.6f\n", worst);
}

// Quantised bodies vs paged f16: the golden prompts with a 16-token window (so prompts past 24
// tokens have a body), and 512 tokens of Shakespeare with the default regime (sink 8, window 128).
TEST_F(PagedSmolLM2, QuantisedBodiesVsF16) {
  CpuBackend pool(2);
  auto tok = tokenizer::Tokenizer::from_gguf(model_->file());
  ASSERT_TRUE(tok.ok());
  const std::string text =
      test::read_file(test::source_dir() + "/../shared/data/tinyshakespeare.txt").substr(0, 4000);
  std::vector<int32_t> shakespeare;
  for (auto t : tok->encode(text)) shakespeare.push_back(static_cast<int32_t>(t));
  ASSERT_GE(shakespeare.size(), 512u);
  shakespeare.resize(512);
  // Bars on the worst top-10 delta (golden prompts and the 512 tokens): the larger of the
  // measured values plus 25%, so a regression of the quantisers or of the window routing fails.
  // BIE is deterministic for a given ISA, so the margin covers only the scalar/AVX2 paths.
  // In the 4-bit regimes this worst case is set by which codes of later layers flip, so any
  // change of arithmetic moves it: measured 2026-12-07 with int4_asym V summed in row order
  // (fp32 weights), in pairs (fp32 weights: an ulp-level change) and in pairs with bf16 weights
  // (the kernels' arithmetic since then, docs/kv-formats.md), golden / 512 tokens:
  // int4_channel K 0.194 / 0.149, 0.135 / 0.326, 0.204 / 0.313; int4_asym K 0.741 / 0.326,
  // 0.675 / 0.531, 0.485 / 0.971. The mean measures did not move with them (docs/kv-quality.md);
  // int8 (0.121 / 0.124) does not use those kernels.
  struct Case {
    const char* k;
    const char* v;
    double bound;
  };
  for (const Case& c : {Case{"int8", "int8", 0.16}, Case{"int4_channel_t16", "int4_asym_g64", 0.41},
                        Case{"int4_asym_g64", "int4_asym_g64", 1.22}}) {
    double worst_golden = 0.0;
    int agree = 0, n = 0;
    for (const auto& p : (*golden_)["prompts"]) {
      const auto ids = p["prompt_ids"].get<std::vector<int32_t>>();
      auto f16 = paged("f16", "f16", 16, 256);
      auto q = paged(c.k, c.v, 16, 256);
      auto a = prompt_logits(*model_, *f16, pool, ids, 64);
      auto b = prompt_logits(*model_, *q, pool, ids, 64);
      ASSERT_TRUE(a.ok() && b.ok());
      worst_golden = std::max(worst_golden, top10_delta(*a, *b));
      agree += argmax(a->data(), static_cast<int>(a->size())) ==
               argmax(b->data(), static_cast<int>(b->size()));
      ++n;
      EXPECT_TRUE(q->check_integrity().ok());
    }
    auto f16 = paged("f16", "f16", 128, 512);
    auto q = paged(c.k, c.v, 128, 512);
    auto a = prompt_logits(*model_, *f16, pool, shakespeare, 512);
    auto b = prompt_logits(*model_, *q, pool, shakespeare, 512);
    ASSERT_TRUE(a.ok() && b.ok());
    const double d512 = top10_delta(*a, *b);
    std::printf(
        "  K %s / V %s: golden prompts (window 16) worst top-10 delta %.4f, top-1 %d/%d; "
        "512 Shakespeare tokens (window 128) top-10 delta %.4f\n",
        c.k, c.v, worst_golden, agree, n, d512);
    EXPECT_LT(worst_golden, c.bound) << c.k;
    EXPECT_LT(d512, c.bound) << c.k;
    // Measured: the same top-1 token as f16 on all 10 golden prompts in every regime.
    EXPECT_EQ(agree, n) << c.k << " / " << c.v << ": top-1 differs from f16";
  }
}

}  // namespace
}  // namespace bie
