// Model::forward runs its tokens on the matmul kernels ForwardOptions::path names, as
// forward_batch does for a BatchSequence of that path: a prompt of up to 4 tokens on kPrefill
// takes the tile kernels, not the matrix-vector ones kAuto would pick for so few tokens. (A
// forward() that dropped the path made `bie run`'s short prompts differ from the engine's.)
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "bie/common/cpu_features.h"
#include "bie/engine/kv_setup.h"
#include "bie/model/model.h"
#include "bie/tokenizer/tokenizer.h"
#include "support/paths.h"

namespace bie {
namespace {

// Qwen2.5-Coder-0.5B with a 64-token f16 cache (trimmed head: LoadOptions::logits_vocab).
struct Qwen05 {
  std::unique_ptr<Model> model;
  KvSetup kv;
  std::vector<int32_t> prompt;  // "def fibonacci(n):", 4 tokens
};

Qwen05 load_qwen05(int32_t logits_vocab = 0) {
  Qwen05 q;
  LoadOptions lo;
  lo.max_batch_tokens = 64;
  lo.logits_vocab = logits_vocab;
  auto model = load_model(test::qwen05_path(), lo);
  EXPECT_TRUE(model.ok()) << model.error();
  if (!model.ok()) return q;
  q.model = std::move(model).value();
  KvEngineOptions o;
  o.kv.dtype = "f16";
  o.max_model_len = 64;
  auto kv = setup_kv_cache(*q.model, o);
  EXPECT_TRUE(kv.ok()) << kv.error();
  auto tok = tokenizer::Tokenizer::from_gguf(q.model->file());
  EXPECT_TRUE(tok.ok()) << tok.error();
  if (!kv.ok() || !tok.ok()) {
    q.model.reset();
    return q;
  }
  q.kv = std::move(kv).value();
  q.prompt = tok->encode("def fibonacci(n):");
  return q;
}

TEST(ModelForward, RunsThePathItIsGiven) {
  // Qwen2.5-Coder-0.5B on the AVX2 kernels: its Q5_0 projections round differently on the tile
  // and matrix-vector kernels, so a wrong path shows in the logits. (On AVX-512 every matrix of
  // this model is repacked and gives prompt and decode tokens the same bits: no power there.)
  BIE_REQUIRE_FILE(test::qwen05_path());
  const Isa saved = active_isa();
  ASSERT_EQ(set_isa(Isa::kAvx2), Isa::kAvx2);
  struct Restore {
    Isa isa;
    ~Restore() { set_isa(isa); }
  } restore{saved};
  Qwen05 q = load_qwen05();
  ASSERT_TRUE(q.model != nullptr);
  Model& m = *q.model;
  auto* kv = &q.kv;
  const std::vector<int32_t>& prompt = q.prompt;
  ASSERT_EQ(prompt.size(), 4u);
  CpuBackend be(2);

  const auto via_forward = [&](MatmulPath path) {
    EXPECT_TRUE(kv->cache->truncate(0).ok());
    ForwardOptions fo;
    fo.path = path;
    auto out = m.forward(prompt, *kv->cache, be, fo);
    EXPECT_TRUE(out.ok()) << out.error();
    return out.ok() ? std::vector<float>(out->begin(), out->end()) : std::vector<float>{};
  };
  const auto via_batch = [&](MatmulPath path) {
    EXPECT_TRUE(kv->cache->truncate(0).ok());
    BatchSequence b;
    b.tokens = prompt;
    b.kv = kv->cache.get();
    b.logits = BatchSequence::Logits::kLast;
    b.path = path;
    auto out = m.forward_batch(std::span<const BatchSequence>(&b, 1), be);
    EXPECT_TRUE(out.ok()) << out.error();
    std::vector<float> v = out.ok() ? std::vector<float>(out->begin(), out->end())
                                    : std::vector<float>{};
    kv->cache->finish_pass();
    return v;
  };
  const std::vector<float> prefill = via_forward(MatmulPath::kPrefill);
  const std::vector<float> decode = via_forward(MatmulPath::kDecode);
  ASSERT_EQ(prefill.size(), static_cast<size_t>(m.geometry().n_vocab));
  EXPECT_EQ(prefill, via_batch(MatmulPath::kPrefill));
  EXPECT_EQ(decode, via_batch(MatmulPath::kDecode));
  // The check has power only if the two kernel families differ here.
  EXPECT_NE(prefill, decode);
}

// A trimmed head (LoadOptions::logits_vocab, a speculative draft's) returns the first columns of
// the full head's logits, bit for bit: its output layer reads a prefix of the same rows.
TEST(ModelForward, TrimmedHeadGivesTheFullHeadsFirstLogits) {
  BIE_REQUIRE_FILE(test::qwen05_path());
  constexpr int32_t kTrim = 4000;
  const auto logits_of = [](int32_t logits_vocab, int32_t* n_logits) {
    Qwen05 q = load_qwen05(logits_vocab);
    if (q.model == nullptr) return std::vector<float>{};
    *n_logits = q.model->n_logits();
    CpuBackend be(2);
    ForwardOptions fo;
    fo.logits_all = true;
    fo.path = MatmulPath::kDecode;
    auto out = q.model->forward(q.prompt, *q.kv.cache, be, fo);
    EXPECT_TRUE(out.ok()) << out.error();
    return out.ok() ? std::vector<float>(out->begin(), out->end()) : std::vector<float>{};
  };
  int32_t n_full = 0;
  int32_t n_trim = 0;
  const std::vector<float> full = logits_of(0, &n_full);
  const std::vector<float> trim = logits_of(kTrim, &n_trim);
  ASSERT_EQ(n_full, 151936);
  ASSERT_EQ(n_trim, kTrim);
  ASSERT_EQ(full.size(), 4u * static_cast<size_t>(n_full));
  ASSERT_EQ(trim.size(), 4u * static_cast<size_t>(kTrim));
  for (size_t row = 0; row < 4; ++row) {
    const std::vector<float> want(full.begin() + static_cast<ptrdiff_t>(row * n_full),
                                  full.begin() + static_cast<ptrdiff_t>(row * n_full + kTrim));
    const std::vector<float> got(trim.begin() + static_cast<ptrdiff_t>(row * kTrim),
                                 trim.begin() + static_cast<ptrdiff_t>((row + 1) * kTrim));
    EXPECT_EQ(got, want) << "row " << row;
  }
}

// Model::logits_of: the logits a trimmed head leaves out, for given ids, from dequantised output
// rows: within the activation quantisation's error of the full head's (which quantises the
// hidden state to 8 bits), far inside the spread of the logits themselves.
TEST(ModelForward, LogitsOfGivesTheFullHeadsLogitsForAnyIds) {
  BIE_REQUIRE_FILE(test::qwen05_path());
  const std::vector<int32_t> ids = {0, 3999, 4000, 50000, 151000, 151935};
  std::vector<float> full_last;
  std::vector<float> got;
  for (const int32_t logits_vocab : {0, 4000}) {
    Qwen05 q = load_qwen05(logits_vocab);
    ASSERT_TRUE(q.model != nullptr);
    Model& m = *q.model;
    CpuBackend be(2);
    EXPECT_FALSE(m.logits_of(ids, be).ok());  // no pass yet
    auto out = m.forward(q.prompt, *q.kv.cache, be);
    ASSERT_TRUE(out.ok()) << out.error();
    if (logits_vocab == 0) {
      full_last.assign(out->begin(), out->end());
    } else {
      auto extra = m.logits_of(ids, be);
      ASSERT_TRUE(extra.ok()) << extra.error();
      got.assign(extra->begin(), extra->end());
      const std::vector<int32_t> bad = {151936};
      EXPECT_FALSE(m.logits_of(bad, be).ok());
    }
  }
  ASSERT_EQ(full_last.size(), 151936u);
  ASSERT_EQ(got.size(), ids.size());
  const auto [lo_it, hi_it] = std::minmax_element(full_last.begin(), full_last.end());
  ASSERT_GT(*hi_it - *lo_it, 10.0f);
  for (size_t k = 0; k < ids.size(); ++k) {
    EXPECT_NEAR(got[k], full_last[static_cast<size_t>(ids[k])], 0.05f) << "id " << ids[k];
  }
}

}  // namespace
}  // namespace bie
