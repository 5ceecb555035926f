// Model geometry from GGUF headers (synthetic, sparse 40 GB, and the two real models), from
// config.json text, and from the presets, including their published parameter counts.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "bie/gguf/gguf_file.h"
#include "bie/planner/kv_bytes.h"
#include "bie/planner/model_geometry.h"
#include "bie/planner/presets.h"
#include "support/gguf_builder.h"
#include "support/paths.h"

namespace bie::planner {
namespace {

using test::GgufBuilder;

constexpr uint32_t kF32 = 0, kF16 = 1, kQ8_0 = 8;

// A two-layer llama-shaped header; tensors carry the right byte counts (zeros).
GgufBuilder tiny_llama(bool with_output = true) {
  GgufBuilder b;
  b.kv_str("general.architecture", "llama");
  b.kv_str("general.name", "tiny");
  b.kv_u32("llama.block_count", 2);
  b.kv_u32("llama.embedding_length", 64);
  b.kv_u32("llama.feed_forward_length", 128);
  b.kv_u32("llama.attention.head_count", 4);
  b.kv_u32("llama.attention.head_count_kv", 2);
  b.kv_u32("llama.context_length", 256);
  b.kv_u32("llama.vocab_size", 100);
  b.tensor("token_embd.weight", {64, 100}, kQ8_0, std::vector<uint8_t>(2 * 100 * 34));
  if (with_output) b.tensor("output.weight", {64, 100}, kF16, std::vector<uint8_t>(64 * 100 * 2));
  for (int il = 0; il < 2; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    b.tensor(p + "attn_q.weight", {64, 64}, kF16, std::vector<uint8_t>(64 * 64 * 2));
    b.tensor(p + "attn_k.weight", {64, 32}, kF16, std::vector<uint8_t>(64 * 32 * 2));
    b.tensor(p + "attn_norm.weight", {64}, kF32, std::vector<uint8_t>(64 * 4));
  }
  return b;
}

Result<ModelGeometry> from_bytes(const std::vector<uint8_t>& bytes) {
  auto f = gguf::GgufFile::from_memory(bytes.data(), bytes.size());
  if (!f) return Error{f.error()};
  return geometry_from_gguf(*f.value());
}

TEST(GeometryGguf, SyntheticLlamaExactWeights) {
  auto g = from_bytes(tiny_llama().build());
  ASSERT_TRUE(g.ok()) << g.error();
  EXPECT_EQ(g->arch, "llama");
  EXPECT_EQ(g->n_layer, 2);
  EXPECT_EQ(g->n_head, 4);
  EXPECT_EQ(g->head_dim, 16);
  EXPECT_EQ(g->n_ctx_train, 256);
  EXPECT_EQ(g->layers[1], (LayerKv{2, 16, 16, 0}));
  EXPECT_EQ(g->attention_kind(), AttentionKind::kGqa);
  const uint64_t embd = 2 * 100 * 34, out = 64 * 100 * 2, layer = (64 * 64 + 64 * 32) * 2 + 64 * 4;
  EXPECT_EQ(*g->weight_bytes, embd + out + 2 * layer);
  EXPECT_EQ(*g->weight_bytes_active, embd / 100 + out + 2 * layer);  // one embedding row
  EXPECT_FALSE(g->tied_embeddings);
  EXPECT_EQ(kv_bytes_per_token(*g, kKvF16, kKvF16), 2u * 2 * 2 * 16 * 2);

  auto tied = from_bytes(tiny_llama(false).build());
  ASSERT_TRUE(tied.ok());
  EXPECT_TRUE(tied->tied_embeddings);
  EXPECT_EQ(*tied->weight_bytes_active, *tied->weight_bytes);  // the table is the output matrix
}

TEST(GeometryGguf, MissingKeysAndTruncationAreErrors) {
  GgufBuilder b;
  b.kv_str("general.architecture", "llama");
  b.kv_u32("llama.embedding_length", 64);
  auto g = from_bytes(b.build());
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().find("llama.block_count"), std::string::npos) << g.error();

  GgufBuilder none;
  none.kv_u32("x", 1);
  EXPECT_FALSE(from_bytes(none.build()).ok());

  const auto bytes = tiny_llama().build();
  for (size_t cut : {size_t{0}, size_t{10}, bytes.size() / 3, bytes.size() - 1}) {
    EXPECT_FALSE(from_bytes(std::vector<uint8_t>(bytes.begin(), bytes.begin() + cut)).ok()) << cut;
  }
}

TEST(GeometryGguf, MoeAndMlaKeys) {
  GgufBuilder b;
  b.kv_str("general.architecture", "deepseek2");
  b.kv_u32("deepseek2.block_count", 2);
  b.kv_u32("deepseek2.embedding_length", 64);
  b.kv_u32("deepseek2.attention.head_count", 4);
  b.kv_u32("deepseek2.attention.key_length", 24);
  b.kv_u32("deepseek2.attention.value_length", 16);
  b.kv_u32("deepseek2.attention.kv_lora_rank", 32);
  b.kv_u32("deepseek2.rope.dimension_count", 8);
  b.kv_u32("deepseek2.expert_count", 4);
  b.kv_u32("deepseek2.expert_used_count", 1);
  b.tensor("token_embd.weight", {64, 10}, kF32, std::vector<uint8_t>(64 * 10 * 4));
  b.tensor("output.weight", {64, 10}, kF32, std::vector<uint8_t>(64 * 10 * 4));
  b.tensor("blk.0.ffn_up_exps.weight", {64, 8, 4}, kF32, std::vector<uint8_t>(64 * 8 * 4 * 4));
  auto g = from_bytes(b.build());
  ASSERT_TRUE(g.ok()) << g.error();
  EXPECT_TRUE(g->mla);
  EXPECT_EQ(g->attention_kind(), AttentionKind::kMla);
  EXPECT_EQ(g->layers[0], (LayerKv{1, 40, 0, 0}));  // latent 32 + rope 8, no V
  EXPECT_EQ(kv_bytes_per_token(*g, kKvF16, kKvF16), 2u * 40 * 2);
  EXPECT_EQ(*g->weight_bytes_active, 64u * 4 + 64 * 10 * 4 + 64 * 8 * 4);  // 1 of 4 experts

  GgufBuilder bad;
  bad.kv_str("general.architecture", "qwen3moe");
  bad.kv_u32("qwen3moe.block_count", 1);
  bad.kv_u32("qwen3moe.embedding_length", 8);
  bad.kv_u32("qwen3moe.attention.head_count", 2);
  bad.kv_u32("qwen3moe.expert_count", 4);
  bad.kv_u32("qwen3moe.expert_used_count", 5);
  bad.tensor("token_embd.weight", {8, 2}, kF32, std::vector<uint8_t>(64));
  EXPECT_FALSE(from_bytes(bad.build()).ok());
}

TEST(GeometryGguf, FortyGigabyteFileInMilliseconds) {
  // A header declaring 40 GB of tensors over a sparse file: reading the geometry must not touch
  // the data (it would take seconds and 40 GB of page cache).
  const uint64_t n_rows = 40ull * 1000 * 1000 * 1000 / (4096 * 2);
  GgufBuilder b;
  b.kv_str("general.architecture", "llama");
  b.kv_u32("llama.block_count", 1);
  b.kv_u32("llama.embedding_length", 4096);
  b.kv_u32("llama.attention.head_count", 32);
  b.tensor("token_embd.weight", {4096, static_cast<int64_t>(n_rows)}, kF16, {});
  auto bytes = b.build();
  const auto path = std::filesystem::temp_directory_path() / "bie_planner_sparse_40g.gguf";
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  }
  std::filesystem::resize_file(path, bytes.size() + n_rows * 4096 * 2);
  const auto t0 = std::chrono::steady_clock::now();
  auto g = geometry_from_gguf_path(path.string());
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::filesystem::remove(path);
  ASSERT_TRUE(g.ok()) << g.error();
  EXPECT_EQ(*g->weight_bytes, n_rows * 4096 * 2);
  EXPECT_GT(*g->weight_bytes, 39'000'000'000ull);
  EXPECT_LT(ms, 100.0);
}

TEST(GeometryGguf, OpenErrorsNameTheFile) {
  auto g = geometry_from_gguf_path("/nonexistent/model.gguf");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().find("/nonexistent/model.gguf"), std::string::npos);
}

// ---- real models ---------------------------------------------------------------------------

ModelGeometry real(const std::string& path) {
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << test::missing_file_message(path);
    return {};
  }
  auto g = geometry_from_gguf_path(path);
  EXPECT_TRUE(g.ok()) << g.error();
  return g.ok() ? g.value() : ModelGeometry{};
}

TEST(GeometryReal, SmolLM2) {
  BIE_REQUIRE_FILE(test::smollm2_path());
  const ModelGeometry g = real(test::smollm2_path());
  ASSERT_EQ(g.n_layer, 30);
  EXPECT_EQ(g.n_head, 9);
  EXPECT_EQ(g.n_head_kv(), 3);
  EXPECT_EQ(g.head_dim, 64);
  EXPECT_EQ(g.n_ctx_train, 8192);
  EXPECT_EQ(g.n_swa_layers(), 0);
  EXPECT_TRUE(g.tied_embeddings);
  EXPECT_EQ(g.n_params, 134515008.0);     // sum of tensor elements
  EXPECT_EQ(*g.weight_bytes, 96576768u);  // sum of tensor bytes (q4_1 + q8_0 + f32)
  // The planner's prediction for the engine's contiguous f16 cache at the trained context:
  // 2 (K,V) * 30 layers * 3 heads * 64 * 2 B = 23040 B/token; x 8192 = 180 MiB.
  EXPECT_EQ(kv_bytes_per_token(g, kKvF16, kKvF16), 23040u);
  EXPECT_EQ(contiguous_kv_bytes(g, kKvF16, kKvF16, 8192, 1), 180ull << 20);
  // The config.json preset describes the same KV shape and parameter count.
  auto p = preset_geometry("smollm2-135m");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->layers, g.layers);
  EXPECT_NEAR(p->n_params / g.n_params, 1.0, 0.001);
}

TEST(GeometryReal, Gemma3SlidingWindowPatternAsLlamaCpp) {
  BIE_REQUIRE_FILE(test::gemma3_path());
  const ModelGeometry g = real(test::gemma3_path());
  ASSERT_EQ(g.n_layer, 18);
  EXPECT_EQ(g.arch, "gemma3");
  EXPECT_EQ(g.head_dim, 256);
  EXPECT_EQ(g.n_head_kv(), 1);
  EXPECT_EQ(g.attention_kind(), AttentionKind::kMqa);
  for (int64_t il = 0; il < 18; ++il) {
    const bool global = il == 5 || il == 11 || il == 17;
    EXPECT_EQ(g.layers[il].window, global ? 0 : 512) << "layer " << il;
  }
  EXPECT_TRUE(g.tied_embeddings);
  EXPECT_EQ(*g.weight_bytes, *g.weight_bytes_active);
  auto p = preset_geometry("gemma-3-270m");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->layers, g.layers);
  EXPECT_NEAR(p->n_params / g.n_params, 1.0, 0.01);
  // Hybrid well below flat: at 32k the 15 local layers hold 512 tokens, not 32768.
  const uint64_t flat = contiguous_kv_bytes(g, kKvF16, kKvF16, 32768, 1);
  const uint64_t swa = kv_bytes_unpaged(g, kKvF16, kKvF16, 32768);
  EXPECT_EQ(swa, (3ull * 32768 + 15ull * 512) * 2 * 256 * 2);
  EXPECT_LT(static_cast<double>(swa), 0.2 * static_cast<double>(flat));
}

// ---- config.json --------------------------------------------------------------------------

TEST(GeometryConfig, FieldsDefaultsAndErrors) {
  auto g = geometry_from_hf_config(
      R"({"model_type":"llama","hidden_size":256,"intermediate_size":512,"num_hidden_layers":4,
          "num_attention_heads":8,"vocab_size":1000})",
      "t");
  ASSERT_TRUE(g.ok()) << g.error();
  EXPECT_EQ(g->n_head_kv(), 8);  // no num_key_value_heads: MHA
  EXPECT_EQ(g->head_dim, 32);
  EXPECT_EQ(g->attention_kind(), AttentionKind::kMha);
  EXPECT_EQ(g->n_ctx_train, 0);

  auto missing = geometry_from_hf_config(R"({"hidden_size":256,"num_attention_heads":8})", "t");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error(), "config.json: missing \"num_hidden_layers\"");
  auto no_vocab = geometry_from_hf_config(
      R"({"hidden_size":256,"num_attention_heads":8,"num_hidden_layers":2})", "t");
  ASSERT_FALSE(no_vocab.ok());
  EXPECT_NE(no_vocab.error().find("vocab_size"), std::string::npos);
  EXPECT_FALSE(geometry_from_hf_config("{not json", "t").ok());
  EXPECT_FALSE(geometry_from_hf_config("[1,2]", "t").ok());
  EXPECT_FALSE(
      geometry_from_hf_config(
          R"({"hidden_size":-5,"num_attention_heads":8,"num_hidden_layers":2,"vocab_size":9,
                       "intermediate_size":1})",
          "t")
          .ok());
  EXPECT_FALSE(geometry_from_hf_config(
                   R"({"hidden_size":64,"num_attention_heads":8,"num_key_value_heads":3,
                       "num_hidden_layers":2,"vocab_size":9,"intermediate_size":1})",
                   "t")
                   .ok());
  EXPECT_FALSE(geometry_from_hf_config(
                   R"({"hidden_size":"64","num_attention_heads":8,"num_hidden_layers":2,
                       "vocab_size":9,"intermediate_size":1})",
                   "t")
                   .ok());
  auto zero_dim = geometry_from_hf_config(
      R"({"hidden_size":4,"num_attention_heads":8,"num_hidden_layers":2,"vocab_size":9,
          "intermediate_size":1})",
      "t");
  ASSERT_FALSE(zero_dim.ok());  // head_dim = 4 / 8 = 0
  EXPECT_NE(zero_dim.error().find("head_dim"), std::string::npos) << zero_dim.error();
  EXPECT_FALSE(geometry_from_hf_config_file("/nonexistent/config.json").ok());
}

TEST(GeometryConfig, SlidingWindowVariants) {
  const std::string base =
      R"("hidden_size":64,"intermediate_size":128,"num_hidden_layers":4,"num_attention_heads":4,
         "vocab_size":10)";
  auto all = geometry_from_hf_config(
      "{\"model_type\":\"mistral\",\"sliding_window\":32," + base + "}", "t");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->n_swa_layers(), 4);  // Mistral v0.1: every layer local
  auto off = geometry_from_hf_config(
      "{\"model_type\":\"qwen2\",\"use_sliding_window\":false,\"sliding_window\":32," + base + "}",
      "t");
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->n_swa_layers(), 0);
  auto listed = geometry_from_hf_config(
      "{\"sliding_window\":32,\"layer_types\":[\"sliding_attention\",\"full_attention\","
      "\"sliding_attention\",\"full_attention\"]," +
          base + "}",
      "t");
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->layers[0].window, 32);
  EXPECT_EQ(listed->layers[1].window, 0);
  auto gemma2 = geometry_from_hf_config(
      "{\"model_type\":\"gemma2\",\"sliding_window\":32," + base + "}", "t");
  ASSERT_TRUE(gemma2.ok());
  EXPECT_EQ(gemma2->layers[0].window, 32);  // even layers local, as llama.cpp's pattern 2
  EXPECT_EQ(gemma2->layers[1].window, 0);
  EXPECT_FALSE(geometry_from_hf_config(
                   "{\"sliding_window\":32,\"layer_types\":[\"full_attention\"]," + base + "}", "t")
                   .ok());
}

// Each class default of the architecture table, seen through the parameter count and the
// layer pattern of one small config that differs only in model_type (Llama: none of them).
TEST(GeometryConfig, ArchitectureClassDefaults) {
  const std::string base =
      R"("hidden_size":64,"intermediate_size":128,"num_hidden_layers":6,"num_attention_heads":4,
         "num_key_value_heads":2,"vocab_size":10,"sliding_window":16)";
  const auto geo = [&](const std::string& type) {
    auto g = geometry_from_hf_config("{\"model_type\":\"" + type + "\"," + base + "}", "t");
    EXPECT_TRUE(g.ok()) << type;
    return *g;
  };
  const ModelGeometry llama = geo("llama");
  const double E = 64, L = 6, d = 16, kv = 2 * d, q = 4 * d;
  const double embd = 10 * E;
  // Qwen 3: + q and k per-head norm weights in every layer.
  EXPECT_DOUBLE_EQ(geo("qwen3").n_params - llama.n_params, L * 2 * d);
  EXPECT_DOUBLE_EQ(geo("qwen3_moe").n_params - llama.n_params, L * 2 * d);  // a prefix row
  // Qwen 2: q/k/v biases hard-wired.
  EXPECT_DOUBLE_EQ(geo("qwen2").n_params - llama.n_params, L * (q + 2 * kv));
  // Gemma 2: two more norms per layer, tied embeddings, local/global period 2.
  const ModelGeometry g2 = geo("gemma2");
  EXPECT_TRUE(g2.tied_embeddings);
  EXPECT_FALSE(llama.tied_embeddings);
  EXPECT_DOUBLE_EQ(g2.n_params - llama.n_params, L * 2 * E - embd);
  EXPECT_EQ(g2.n_swa_layers(), 3);
  // Gemma 3: the same plus q/k norms, period 6; Cohere 2: period 4; Llama: every layer local
  // (a bare sliding_window, Mistral v0.1 style).
  const ModelGeometry g3 = geo("gemma3_text");
  EXPECT_DOUBLE_EQ(g3.n_params - llama.n_params, L * (2 * E + 2 * d) - embd);
  EXPECT_EQ(g3.n_swa_layers(), 5);
  EXPECT_EQ(geo("cohere2").n_swa_layers(), 5);  // layers 0-2, 4 and 5 of 6
  EXPECT_EQ(llama.n_swa_layers(), 6);
  EXPECT_EQ(arch_facts("mistral"), nullptr);
  EXPECT_EQ(arch_facts("gemma3")->swa_period, 6);
  EXPECT_FALSE(arch_facts("gemma3n")->qk_norm);  // the prefix row: only the period carries over
}

// ---- presets ------------------------------------------------------------------------------

TEST(Presets, ParameterCountsMatchPublishedFigures) {
  for (const ModelPreset& p : model_presets()) {
    auto g = preset_geometry(p.name);
    ASSERT_TRUE(g.ok()) << p.name << ": " << g.error();
    EXPECT_NEAR(g->n_params / p.published_params, 1.0, 0.02) << p.name << " " << g->n_params;
    // Published "active" counts include the whole embedding table; ours is what one decode step
    // reads, which is a single row of it when the output matrix is separate.
    const double embd_rest =
        g->tied_embeddings ? 0.0 : g->n_params_embd - static_cast<double>(g->n_embd);
    EXPECT_NEAR((g->n_params_active + embd_rest) / p.published_params_active, 1.0, 0.02)
        << p.name << " " << g->n_params_active;
    EXPECT_FALSE(p.source.empty());
  }
  // The BRIEF's parameter totals, tighter.
  EXPECT_NEAR(preset_geometry("qwen2.5-32b")->n_params, 32.76e9, 0.01e9);
  EXPECT_NEAR(preset_geometry("llama-3-70b")->n_params, 70.55e9, 0.01e9);
  EXPECT_NEAR(preset_geometry("llama-3-8b")->n_params, 8.03e9, 0.005e9);
  EXPECT_NEAR(preset_geometry("deepseek-v3")->n_params, 671e9, 2e9);
  EXPECT_FALSE(preset_geometry("llama-9-9000b").ok());
  EXPECT_TRUE(preset_geometry("LLaMA-3-8B").ok());
}

TEST(Presets, AttentionKinds) {
  EXPECT_EQ(preset_geometry("llama-3-8b")->attention_kind(), AttentionKind::kGqa);
  EXPECT_EQ(preset_geometry("deepseek-v3")->attention_kind(), AttentionKind::kMla);
  EXPECT_EQ(preset_geometry("gemma-3-270m")->attention_kind(), AttentionKind::kMqa);
  const ModelGeometry q3 = preset_geometry("qwen3-30b-a3b").value();
  EXPECT_TRUE(q3.is_moe());
  EXPECT_EQ(q3.moe.n_expert, 128);
  EXPECT_EQ(q3.moe.n_expert_used, 8);
  EXPECT_EQ(kv_bytes_per_token(q3, kKvF16, kKvF16), 2u * 48 * 4 * 128 * 2);
}

}  // namespace
}  // namespace bie::planner
