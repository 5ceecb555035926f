// Model::forward runs its tokens on the matmul kernels ForwardOptions::path names, as
// forward_batch does for a BatchSequence of that path: a prompt of up to 4 tokens on kPrefill
// takes the tile kernels, not the matrix-vector ones kAuto would pick for so few tokens. (A
// forward() that dropped the path made `bie run`'s short prompts differ from the engine's.)
#include <gtest/gtest.h>

#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "bie/engine/kv_setup.h"
#include "bie/model/model.h"
#include "bie/tokenizer/tokenizer.h"
#include "support/paths.h"

namespace bie {
namespace {

TEST(ModelForward, RunsThePathItIsGiven) {
  // Qwen2.5-Coder-0.5B: its Q5_0 projections round differently on the tile and matrix-vector
  // kernels, so a wrong path shows in the logits.
  BIE_REQUIRE_FILE(test::qwen05_path());
  LoadOptions lo;
  lo.max_batch_tokens = 64;
  auto model = load_model(test::qwen05_path(), lo);
  ASSERT_TRUE(model.ok()) << model.error();
  Model& m = **model;
  KvEngineOptions o;
  o.kv.dtype = "f16";
  o.max_model_len = 64;
  auto kv = setup_kv_cache(m, o);
  ASSERT_TRUE(kv.ok()) << kv.error();
  auto tok = tokenizer::Tokenizer::from_gguf(m.file());
  ASSERT_TRUE(tok.ok()) << tok.error();
  const std::vector<int32_t> prompt = tok->encode("def fibonacci(n):");
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

}  // namespace
}  // namespace bie
