// Synthetic models and synthetic depth: `bie synth`'s writer produces a GGUF our loader loads and
// runs (exact names, shapes, types; realistic weight scale; marked synthetic), the copied
// tokenizer is the source's plus placeholders; the synthetic KV fill leaves the cache at the depth
// with exactly the planner's blocks; a context too long for the budget is refused naming the
// largest one that fits.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "backend/cpu/cpu_backend.h"
#include "bie/backend/thread_pool.h"
#include "support/generate.h"
#include "bie/engine/kv_setup.h"
#include "bie/engine/synth_model.h"
#include "bie/engine/synthetic_kv.h"
#include "bie/gguf/gguf_file.h"
#include "bie/gguf/gguf_writer.h"
#include "bie/model/model.h"
#include "bie/planner/kv_bytes.h"
#include "bie/planner/kv_layout_flags.h"
#include "bie/planner/presets.h"
#include "bie/quant/fp16.h"
#include "bie/quant/traits.h"
#include "bie/tokenizer/tokenizer.h"
#include "support/paths.h"

namespace bie {
namespace {

// A test-only geometry whose widths are multiples of Q4_K's 256-value blocks.
planner::ModelGeometry tiny_geometry(int64_t n_vocab) {
  planner::ModelGeometry g;
  g.name = "tiny";
  g.arch = "llama";
  g.n_embd = 256;
  g.n_layer = 2;
  g.n_head = 4;
  g.head_dim = 64;
  g.n_ff = 512;
  g.n_vocab = n_vocab;
  g.n_ctx_train = 4096;
  g.layers.assign(2, planner::LayerKv{2, 64, 64, 0});
  return g;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / name).string();
}

// Every metadata type round-trips through the writer and the reader; tensor data lands at the
// aligned offsets the reader computes, chunk by chunk.
TEST(GgufWriter, RoundTripsMetadataAndStreamsTensorData) {
  const std::string path = temp_path("bie_test_writer.gguf");
  gguf::GgufWriter w(64);
  w.add_u32("a.u32", 7);
  w.add_i32("a.i32", -3);
  w.add_f32("a.f32", 1.5f);
  w.add_bool("a.bool", true);
  w.add_string("a.str", "héllo");
  auto arr = std::make_shared<gguf::Array>();
  arr->elem_type = gguf::ValueType::kString;
  arr->items = {gguf::Value(std::string("x")), gguf::Value(std::string("yz"))};
  w.add_value("a.arr", gguf::ValueType::kArray, std::shared_ptr<const gguf::Array>(arr));
  w.add_value("a.u64", gguf::ValueType::kUint64, gguf::Value(uint64_t{1} << 40));
  ASSERT_TRUE(w.add_tensor("t.f32", {3}, 0).ok());
  ASSERT_TRUE(w.add_tensor("t.q8", {64, 2}, static_cast<uint32_t>(quant::GgmlType::Q8_0)).ok());
  EXPECT_FALSE(w.add_tensor("t.bad", {33}, static_cast<uint32_t>(quant::GgmlType::Q8_0)).ok());
  int calls = 0;
  const auto fill = [&](size_t i, const gguf::TensorSpec& t, uint64_t off,
                        std::span<uint8_t> out) -> Status {
    ++calls;
    for (size_t k = 0; k < out.size(); ++k) out[k] = static_cast<uint8_t>(i * 100 + off + k);
    EXPECT_EQ(off % (i == 0 ? 4 : 34), 0u) << t.name;  // whole blocks per chunk
    return {};
  };
  ASSERT_TRUE(w.write(path, fill, /*chunk_bytes=*/40).ok());
  EXPECT_EQ(calls, 1 + 4);  // 12 bytes in one chunk; 136 bytes in 34-byte chunks
  EXPECT_EQ(std::filesystem::file_size(path), w.file_bytes());

  auto f = gguf::GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.error();
  EXPECT_EQ((*f)->alignment(), 64u);
  EXPECT_EQ((*f)->get_uint("a.u32"), std::optional<uint64_t>(7));
  EXPECT_EQ((*f)->get_int("a.i32"), std::optional<int64_t>(-3));
  EXPECT_EQ((*f)->get_float("a.f32"), std::optional<double>(1.5));
  EXPECT_EQ((*f)->get_bool("a.bool"), std::optional<bool>(true));
  EXPECT_EQ((*f)->get_string("a.str"), std::optional<std::string_view>("héllo"));
  EXPECT_EQ((*f)->get_uint("a.u64"), std::optional<uint64_t>(uint64_t{1} << 40));
  const gguf::Array* a = (*f)->get_array("a.arr");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->items.size(), 2u);
  EXPECT_EQ(std::get<std::string>(a->items[1]), "yz");
  const gguf::TensorInfo* q = (*f)->find_tensor("t.q8");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->n_bytes, 136u);
  EXPECT_EQ(q->offset % 64, 0u);
  const uint8_t* d = (*f)->tensor_data(*q);
  for (size_t k = 0; k < 136; ++k) ASSERT_EQ(d[k], static_cast<uint8_t>(100 + k)) << k;
  EXPECT_EQ((*f)->tensor_data(*(*f)->find_tensor("t.f32"))[5], 5);
  std::filesystem::remove(path);
}

TEST(Synth, WritesALoadableModelOfExactShapesMarkedSynthetic) {
  const std::string path = temp_path("bie_test_synth_tiny.gguf");
  SynthOptions o;
  o.geometry = tiny_geometry(1000);
  o.label = "tiny-test";
  uint64_t last_done = 0;
  o.progress = [&](uint64_t done, uint64_t) { last_done = done; };
  auto r = write_synthetic_model(path, o);
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->file_bytes, std::filesystem::file_size(path));
  EXPECT_EQ(last_done, r->weight_bytes);
  EXPECT_EQ(r->n_tensors, 3 + 2 * 9);

  auto f = gguf::GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.error();
  EXPECT_EQ((*f)->get_bool(kSyntheticKey), std::optional<bool>(true));
  EXPECT_NE(std::string((*f)->get_string("general.name").value()).find("synthetic"),
            std::string::npos);
  const gguf::TensorInfo* q = (*f)->find_tensor("blk.1.attn_k.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->ne[0], 256);
  EXPECT_EQ(q->ne[1], 128);
  EXPECT_EQ(q->type, static_cast<uint32_t>(quant::GgmlType::Q4_K));

  // The planner reads back the geometry it was given.
  auto g = planner::geometry_from_gguf(**f);
  ASSERT_TRUE(g.ok()) << g.error();
  EXPECT_EQ(g->n_embd, 256);
  EXPECT_EQ(g->n_ff, 512);
  EXPECT_EQ(g->n_vocab, 1000);
  EXPECT_EQ(g->layers, o.geometry.layers);
  EXPECT_EQ(*g->weight_bytes, r->weight_bytes);

  // Weights: mean ~0, std ~0.02.
  const gguf::TensorInfo* w = (*f)->find_tensor("blk.0.ffn_up.weight");
  std::vector<float> x(static_cast<size_t>(w->n_elements()));
  quant::traits(quant::GgmlType::Q4_K)->to_float((*f)->tensor_data(*w), x.data(), w->n_elements());
  double sum = 0, sq = 0;
  for (float v : x) sum += v, sq += static_cast<double>(v) * v;
  const double mean = sum / static_cast<double>(x.size());
  const double sd = std::sqrt(sq / static_cast<double>(x.size()) - mean * mean);
  EXPECT_NEAR(mean, 0.0, 1e-3);
  EXPECT_NEAR(sd, 0.02, 0.002);

  // It loads and runs a forward pass with finite logits.
  auto m = load_model(path);
  ASSERT_TRUE(m.ok()) << m.error();
  EXPECT_EQ((*m)->geometry().n_vocab, 1000);
  EXPECT_EQ((*m)->weight_bytes(), r->weight_bytes);
  KvEngineOptions ko;
  ko.kv.dtype = "int4_asym";
  ko.max_model_len = 256;
  ko.kv_cache_memory = 64ull << 20;
  auto kv = setup_kv_cache(**m, ko);
  ASSERT_TRUE(kv.ok()) << kv.error();
  CpuBackend pool(1);
  std::vector<float> logits;
  const std::vector<int32_t> prompt = {1, 2, 3, 999};
  ASSERT_TRUE(prefill(**m, *kv->cache, pool, prompt, 4, 1, logits).ok());
  ASSERT_EQ(logits.size(), 1000u);
  for (float l : logits) ASSERT_TRUE(std::isfinite(l));
  std::filesystem::remove(path);
}

TEST(Synth, CopiesARealTokenizerPaddedToTheVocabulary) {
  BIE_REQUIRE_FILE(test::smollm2_path());
  const std::string path = temp_path("bie_test_synth_tok.gguf");
  SynthOptions o;
  o.geometry = tiny_geometry(49152 + 256);
  o.label = "tiny-test";
  o.tokenizer_from = test::smollm2_path();
  auto r = write_synthetic_model(path, o);
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->tokenizer_tokens, 49152);
  EXPECT_EQ(r->placeholder_tokens, 256);

  auto src = gguf::GgufFile::open(test::smollm2_path());
  auto dst = gguf::GgufFile::open(path);
  ASSERT_TRUE(src.ok() && dst.ok());
  auto ts = tokenizer::Tokenizer::from_gguf(**src);
  auto td = tokenizer::Tokenizer::from_gguf(**dst);
  ASSERT_TRUE(ts.ok() && td.ok()) << (td.ok() ? "" : td.error());
  const std::string text = "The headline, measured: 64k tokens in 8 GiB.";
  EXPECT_EQ(ts->encode(text), td->encode(text));
  EXPECT_EQ(td->decode(td->encode(text)), text);

  SynthOptions small = o;
  small.geometry = tiny_geometry(1000);  // fewer rows than the tokenizer has tokens
  auto bad = write_synthetic_model(path, small);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("more than the model's vocabulary"), std::string::npos);
  std::filesystem::remove(path);
}

TEST(Synth, RefusesGeometriesItCannotWrite) {
  auto ds = planner::preset_geometry("deepseek-v3");
  ASSERT_TRUE(ds.ok());
  SynthOptions o;
  o.geometry = *ds;
  o.label = "deepseek-v3";
  EXPECT_FALSE(write_synthetic_model(temp_path("bie_never.gguf"), o).ok());
  o.geometry = tiny_geometry(1000);
  o.geometry.n_embd = 300;  // not whole Q4_K blocks
  auto r = write_synthetic_model(temp_path("bie_never.gguf"), o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("whole number"), std::string::npos) << r.error();
  std::filesystem::remove(temp_path("bie_never.gguf"));
}

TEST(SyntheticKv, FillsToDepthWithThePlannersBlocks) {
  const planner::ModelGeometry g = tiny_geometry(1000);
  for (const char* dtype : {"f16", "int8", "int4_asym", "int4_asym_g64"}) {
    SCOPED_TRACE(dtype);
    planner::KvLayoutFlags flags;
    flags.dtype = dtype;
    auto layout = planner::resolve_kv_layout(flags);
    ASSERT_TRUE(layout.ok());
    PagedKvCacheConfig c;
    c.geometry = KvGeometry{2, 2, 64, {}};
    c.layout = *layout;
    c.max_tokens = 2000;
    auto kv = PagedKvCache::create(c);
    ASSERT_TRUE(kv.ok()) << kv.error();
    const int64_t depth = 1000;
    SyntheticKvOptions so;
    so.chunk = 96;  // not a multiple of the block size
    int64_t progress = 0;
    so.progress = [&](int64_t done, int64_t) { progress = done; };
    ASSERT_TRUE(fill_kv_synthetic(**kv, depth, so).ok());
    EXPECT_EQ(progress, depth);
    EXPECT_EQ((*kv)->n_tokens(), depth);
    ASSERT_TRUE((*kv)->check_integrity().ok());
    const int64_t B = layout->block_size;  // 64 for per-channel keys (int8, int4_asym), else 16
    const std::string d = dtype;
    EXPECT_EQ(B, d == "int8" || d == "int4_asym" ? 64 : 16);
    const int64_t blocks = (depth + B - 1) / B;
    EXPECT_EQ(static_cast<int64_t>((*kv)->table().size()), blocks);
    EXPECT_EQ(kv_held_bytes(**kv), planner::kv_sequence_bytes(g, *layout, depth));
    if (layout->mixed()) {
      // Sink block + the blocks touching the 128-token window stay FP16, the rest is body.
      const int64_t fp16 = (*kv)->manager().pool(kv::PoolKind::kFp16).num_active();
      const int64_t body = (*kv)->manager().pool(kv::PoolKind::kBody).num_active();
      EXPECT_EQ(fp16 + body, blocks);
      EXPECT_GE(fp16, 1 + 128 / B);
      EXPECT_LE(fp16, 1 + 128 / B + 1);
    }
    // The cache can still decode on top of it, and refuses to go past its pools.
    EXPECT_FALSE(fill_kv_synthetic(**kv, 1001, so).ok());
  }
}

TEST(SyntheticKv, KeysHavePersistentOutlierChannels) {
  PagedKvCacheConfig c;
  c.geometry = KvGeometry{1, 1, 64, {}};
  c.layout = planner::resolve_kv_layout({}).value();  // f16: rows read back exactly
  c.max_tokens = 512;
  auto kv = PagedKvCache::create(c);
  ASSERT_TRUE(kv.ok());
  SyntheticKvOptions so;
  so.outlier_channels = 2;
  ASSERT_TRUE(fill_kv_synthetic(**kv, 512, so).ok());
  // Per-channel RMS of K over the 512 tokens: two channels stand 10-50x above the median.
  std::vector<double> ss(64, 0.0);
  for (const kv::BlockTableEntry& e : (*kv)->table()) {
    const auto* k = reinterpret_cast<const uint16_t*>((*kv)->block_storage(e));  // [16][64] K
    for (int t = 0; t < 16; ++t)
      for (int ch = 0; ch < 64; ++ch) {
        const double x = quant::fp16_to_fp32(k[t * 64 + ch]);
        ss[static_cast<size_t>(ch)] += x * x;
      }
  }
  std::vector<double> sorted = ss;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[32];
  int outliers = 0;
  for (double s : ss) outliers += std::sqrt(s / median) > 8.0;
  EXPECT_GE(outliers, 1);
  EXPECT_LE(outliers, 2);
}

TEST(KvSetupRefusal, TooLongAContextNamesTheLargestThatFits) {
  auto g = planner::preset_geometry("llama-3-8b");
  ASSERT_TRUE(g.ok());
  const uint64_t weights = 4'540'000'000;  // ~Q4_K
  KvEngineOptions o;
  o.kv.dtype = "f16";
  o.max_model_len = 65536;
  o.device_memory = 8ull << 30;
  o.gpu_memory_utilization = 0.9;
  auto r = plan_kv_setup(*g, weights, 8192, o);
  ASSERT_FALSE(r.ok());
  o.max_model_len = 1024;
  auto fits = plan_kv_setup(*g, weights, 8192, o);
  ASSERT_TRUE(fits.ok()) << fits.error();
  const int64_t n = fits->tokens_fit;
  EXPECT_GT(n, 16000);
  EXPECT_LT(n, 32768);
  EXPECT_NE(r.error().find(fmt::format("the largest context that fits is {} tokens", n)),
            std::string::npos)
      << r.error();
  // The engine takes exactly that context, and not one block more.
  o.max_model_len = n;
  EXPECT_TRUE(plan_kv_setup(*g, weights, 8192, o).ok());
  o.max_model_len = n + 16;
  EXPECT_FALSE(plan_kv_setup(*g, weights, 8192, o).ok());
  // The 4-bit sink+window regime holds 64k in the same budget.
  o.kv.dtype = "int4_asym";
  o.max_model_len = 65536;
  auto int4 = plan_kv_setup(*g, weights, 8192, o);
  ASSERT_TRUE(int4.ok()) << int4.error();
  EXPECT_GE(int4->tokens_fit, 65536);
}

}  // namespace
}  // namespace bie
