// The llama-family forward pass against a naive double-precision reference on tiny random
// models: both rope layouts, GQA, QKV bias, tied and separate outputs, chunked prefill.
#include <gtest/gtest.h>

#include <filesystem>

#include "backend/cpu/cpu_backend.h"
#include "support/generate.h"
#include "bie/model/model.h"
#include "support/contiguous_kv_cache.h"
#include "support/reference_backend.h"
#include "support/tiny_llama.h"

namespace bie {
namespace {

// K/V are stored in fp16 and queries/softmax weights rounded to fp16 before their dots (as
// llama.cpp's f16 cache does): relative error ~1e-3 per element, accumulating over two layers to
// about 0.5 % of the largest logit. A wrong rope, mask or GQA mapping is off by tens of percent.
constexpr double kLogitRelTol = 1e-2;

std::string write_tmp(test::TinyLlama& m, const std::string& tag) {
  const std::string path = std::filesystem::temp_directory_path() / ("bie_tiny_" + tag + ".gguf");
  m.gguf().write(path);
  return path;
}

void check_against_reference(test::TinyLlama& tiny, const std::string& tag, int chunk) {
  const std::string path = write_tmp(tiny, tag);
  LoadOptions lo;
  lo.max_batch_tokens = chunk;
  auto model = load_model(path, lo);
  ASSERT_TRUE(model.ok()) << model.error();
  const std::vector<int> toks = {3, 17, 5, 39, 0, 22, 8, 8, 31, 2, 11};
  const auto ref = tiny.reference_logits(toks);
  ContiguousKvCache kv(kv::kv_geometry((*model)->geometry()), 64);
  CpuBackend pool(2);
  std::vector<float> logits;
  // Feed in chunks of `chunk` tokens with logits for all.
  for (size_t off = 0; off < toks.size(); off += chunk) {
    const size_t len = std::min(toks.size() - off, static_cast<size_t>(chunk));
    std::vector<int32_t> part(toks.begin() + off, toks.begin() + off + len);
    ForwardOptions fo;
    fo.logits_all = true;
    ASSERT_TRUE(forward_into(**model, part, kv, pool, logits, fo).ok());
    for (size_t i = 0; i < len; ++i) {
      double scale = 0.0;
      for (double r : ref[off + i]) scale = std::max(scale, std::fabs(r));
      for (int v = 0; v < tiny.n_vocab; ++v) {
        ASSERT_NEAR(logits[i * tiny.n_vocab + v], ref[off + i][v], kLogitRelTol * scale)
            << tag << " token " << off + i << " vocab " << v;
      }
    }
  }
  EXPECT_EQ(kv.n_tokens(), static_cast<int64_t>(toks.size()));
}

TEST(ModelSynthetic, LlamaMatchesReferenceOneShot) {
  test::TinyLlama t;
  check_against_reference(t, "llama1", 16);
}

TEST(ModelSynthetic, LlamaMatchesReferenceTokenByToken) {
  test::TinyLlama t;
  check_against_reference(t, "llama2", 1);
}

TEST(ModelSynthetic, LlamaMatchesReferenceInChunks) {
  test::TinyLlama t;
  t.tied = false;
  check_against_reference(t, "llama3", 4);
}

TEST(ModelSynthetic, Qwen2BiasAndNeoxRope) {
  test::TinyLlama t;
  t.arch = "qwen2";
  check_against_reference(t, "qwen2", 5);
}

TEST(ModelSynthetic, MultiQueryAttention) {
  test::TinyLlama t;
  t.n_head_kv = 1;
  check_against_reference(t, "mqa", 3);
}

TEST(ModelSynthetic, UnknownArchitectureIsAClearError) {
  test::TinyLlama t;
  auto g = t.gguf();
  test::GgufBuilder b;
  b.kv_str("general.architecture", "mamba9");
  const std::string path = std::filesystem::temp_directory_path() / "bie_unknown_arch.gguf";
  b.write(path);
  auto m = load_model(path);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().find("unsupported architecture 'mamba9'"), std::string::npos) << m.error();
}

TEST(ModelSynthetic, UncomputableTensorTypeIsAClearError) {
  test::TinyLlama t;
  t.make_weights();
  auto g = t.gguf();
  // Replace the file with one whose attn_q is iq2_xxs (type 16): 66 bytes per 256 values.
  test::GgufBuilder b;
  b.kv_str("general.architecture", "llama");
  b.kv_u32("llama.block_count", 1);
  b.kv_u32("llama.embedding_length", 256);
  b.kv_u32("llama.feed_forward_length", 256);
  b.kv_u32("llama.attention.head_count", 4);
  b.tensor_f32("token_embd.weight", {256, 4}, std::vector<float>(1024, 0.0f));
  b.tensor_f32("output_norm.weight", {256}, std::vector<float>(256, 1.0f));
  b.tensor_f32("blk.0.attn_norm.weight", {256}, std::vector<float>(256, 1.0f));
  b.tensor("blk.0.attn_q.weight", {256, 256}, 16, std::vector<uint8_t>(66 * 256));
  const std::string path = std::filesystem::temp_directory_path() / "bie_iq2.gguf";
  b.write(path);
  auto m = load_model(path);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().find("blk.0.attn_q.weight' has type iq2_xxs"), std::string::npos)
      << m.error();
}

// A backend without a kernel for some of the model's weight types refuses the model when it
// binds (before any pass), naming the type, the count and the way out.
TEST(ModelSynthetic, WeightTypeTheBackendCannotRunIsRefusedAtBind) {
  class NoF32 final : public test::ReferenceBackend {
   public:
    [[nodiscard]] bool supports_weight_type(quant::GgmlType t) const override {
      return t != quant::GgmlType::F32;
    }
  };
  test::TinyLlama t;
  auto m = load_model(write_tmp(t, "no_f32"));
  ASSERT_TRUE(m.ok()) << m.error();
  NoF32 be;
  const Status st = (*m)->bind(be);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().find("21 weight tensors of this model are f32, for which the reference "
                            "backend has no kernel; run it with --device cpu"),
            std::string::npos)
      << st.error();
  test::ReferenceBackend all;
  EXPECT_TRUE((*m)->bind(all).ok());
  m->reset();
}

TEST(ModelSynthetic, MissingTensorAndBadTokenAreErrors) {
  test::TinyLlama t;
  t.make_weights();
  auto g = t.gguf();
  const std::string path = write_tmp(t, "ok");
  auto m = load_model(path);
  ASSERT_TRUE(m.ok());
  ContiguousKvCache kv(kv::kv_geometry((*m)->geometry()), 8);
  CpuBackend pool(1);
  std::vector<float> logits;
  const int32_t bad[] = {1, 999};
  Status s = forward_into(**m, bad, kv, pool, logits);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().find("token id 999"), std::string::npos);
  EXPECT_EQ(kv.n_tokens(), 0);  // nothing appended on error
  const int32_t many[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  Status full = forward_into(**m, many, kv, pool, logits);
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.error().find("context full"), std::string::npos) << full.error();
}

}  // namespace
}  // namespace bie
