#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "bie/gguf/gguf_file.h"
#include "support/gguf_builder.h"
#include "support/paths.h"

namespace bie::gguf {
namespace {

using test::GgufBuilder;

Result<std::unique_ptr<GgufFile>> parse(const std::vector<uint8_t>& b) {
  return GgufFile::from_memory(b.data(), b.size());
}

std::vector<uint8_t> sample_file() {
  GgufBuilder g;
  g.kv_str("general.architecture", "llama");
  g.kv_u32("llama.block_count", 2);
  g.kv_f32("llama.rope.freq_base", 10000.0f);
  g.kv_bool("tokenizer.ggml.add_bos_token", true);
  g.kv_str_array("tokenizer.ggml.tokens", {"a", "b", "<s>"});
  g.kv_i32_array("tokenizer.ggml.token_type", {1, 1, 3});
  g.kv_u64("big", 1ull << 40);
  // Nested array: [[1, 2], [3]] of int32.
  std::vector<uint8_t> nested;
  GgufBuilder::put_u32(nested, 9);  // elem type array
  GgufBuilder::put_u64(nested, 2);
  GgufBuilder::put_u32(nested, 5);
  GgufBuilder::put_u64(nested, 2);
  for (int32_t v : {1, 2}) GgufBuilder::put_raw(nested, &v, 4);
  GgufBuilder::put_u32(nested, 5);
  GgufBuilder::put_u64(nested, 1);
  int32_t three = 3;
  GgufBuilder::put_raw(nested, &three, 4);
  g.kv_raw("nested", 9, nested);
  g.tensor_f32("w", {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  g.tensor_f32("b", {3}, {9, 10, 11});
  return g.build();
}

TEST(Gguf, ParsesEveryValueTypeAndTensors) {
  const auto bytes = sample_file();
  auto f = parse(bytes);
  ASSERT_TRUE(f.ok()) << f.error();
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.architecture(), "llama");
  EXPECT_EQ(g.get_uint("llama.block_count"), 2u);
  EXPECT_FLOAT_EQ(*g.get_float("llama.rope.freq_base"), 10000.0f);
  EXPECT_EQ(g.get_bool("tokenizer.ggml.add_bos_token"), true);
  EXPECT_EQ(g.get_uint("big"), 1ull << 40);
  EXPECT_FALSE(g.get_string("llama.block_count").has_value());
  const Array* toks = g.get_array("tokenizer.ggml.tokens");
  ASSERT_NE(toks, nullptr);
  ASSERT_EQ(toks->items.size(), 3u);
  EXPECT_EQ(std::get<std::string>(toks->items[2]), "<s>");
  const Array* nested = g.get_array("nested");
  ASSERT_NE(nested, nullptr);
  ASSERT_EQ(nested->items.size(), 2u);
  const auto& inner = std::get<std::shared_ptr<const Array>>(nested->items[0]);
  EXPECT_EQ(std::get<int32_t>(inner->items[1]), 2);
  ASSERT_EQ(g.tensors().size(), 2u);
  const TensorInfo* w = g.find_tensor("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->ne[0], 4);
  EXPECT_EQ(w->ne[1], 2);
  EXPECT_EQ(w->n_bytes, 32u);
  float f7;
  std::memcpy(&f7, g.tensor_data(*w) + 6 * 4, 4);
  EXPECT_EQ(f7, 7.0f);
  EXPECT_EQ(g.tensor_data(*g.find_tensor("b"))[0], bytes[g.data_offset() + 32]);
}

TEST(Gguf, AcceptsVersion2) {
  GgufBuilder g(2);
  g.kv_str("general.architecture", "llama");
  auto f = parse(g.build());
  ASSERT_TRUE(f.ok()) << f.error();
  EXPECT_EQ((*f)->version(), 2u);
}

void expect_error(const std::vector<uint8_t>& bytes, const std::string& needle) {
  auto f = parse(bytes);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().find(needle), std::string::npos) << "error was: " << f.error();
}

TEST(Gguf, RejectsBadHeaders) {
  expect_error({}, "not a GGUF file");
  expect_error({'G', 'G', 'U', 'X', 3, 0, 0, 0}, "bad magic");
  GgufBuilder v1(1);
  expect_error(v1.build(), "version 1");
  GgufBuilder v9(9);
  expect_error(v9.build(), "unsupported GGUF version 9");
  auto be = GgufBuilder(3).build();
  be[4] = 0;
  be[7] = 3;  // version 3 written big-endian
  expect_error(be, "big-endian");
}

TEST(Gguf, RejectsHostileCountsWithoutAllocating) {
  {  // metadata count far beyond the file
    std::vector<uint8_t> b;
    GgufBuilder::put_u32(b, 0x46554747);
    GgufBuilder::put_u32(b, 3);
    GgufBuilder::put_u64(b, 0);
    GgufBuilder::put_u64(b, ~0ull);
    expect_error(b, "metadata count");
  }
  {  // array claiming 2^60 elements
    GgufBuilder g;
    std::vector<uint8_t> p;
    GgufBuilder::put_u32(p, 4);
    GgufBuilder::put_u64(p, 1ull << 60);
    g.kv_raw("huge", 9, p);
    expect_error(g.build(), "cannot fit");
  }
  {  // string claiming 2^62 bytes
    GgufBuilder g;
    std::vector<uint8_t> p;
    GgufBuilder::put_u64(p, 1ull << 62);
    g.kv_raw("s", 8, p);
    expect_error(g.build(), "exceeds the limit");
  }
  {  // arrays nested 100 deep
    GgufBuilder g;
    std::vector<uint8_t> p;
    for (int i = 0; i < 100; ++i) {
      GgufBuilder::put_u32(p, 9);
      GgufBuilder::put_u64(p, 1);
    }
    g.kv_raw("deep", 9, p);
    expect_error(g.build(), "nested deeper");
  }
  {  // unknown value type
    GgufBuilder g;
    g.kv_raw("x", 77, {});
    expect_error(g.build(), "unknown value type 77");
  }
}

TEST(Gguf, RejectsBadTensors) {
  {
    GgufBuilder g;
    g.tensor("t", {1, 1, 1, 1, 1}, 0, std::vector<uint8_t>(4));
    expect_error(g.build(), "5 dimensions");
  }
  {
    GgufBuilder g;
    g.tensor("t", {32}, 99, std::vector<uint8_t>(32));
    expect_error(g.build(), "unknown tensor type id 99");
  }
  {
    GgufBuilder g;
    g.tensor("t", {16}, 2, std::vector<uint8_t>(18));  // q4_0 needs multiples of 32
    expect_error(g.build(), "not a multiple");
  }
  {
    GgufBuilder g;
    g.tensor("t", {1ll << 40, 1ll << 40}, 0, {});
    expect_error(g.build(), "invalid");
  }
  {
    GgufBuilder g;
    g.tensor("t", {1024}, 0, std::vector<uint8_t>(16));  // data shorter than 4 KiB
    expect_error(g.build(), "extends past the end");
  }
  {
    GgufBuilder g;
    g.tensor_f32("t", {1}, {1});
    g.tensor_f32("t", {1}, {1});
    expect_error(g.build(), "duplicate tensor name");
  }
  {
    GgufBuilder g;
    g.kv_u32("k", 1);
    g.kv_u32("k", 2);
    expect_error(g.build(), "duplicate metadata key");
  }
  {
    GgufBuilder g;
    g.kv_u32("general.alignment", 24);
    expect_error(g.build(), "power of two");
  }
}

// Every prefix of a small valid file is rejected with a message, never accepted or crashed on.
TEST(Gguf, EveryTruncationOfSyntheticFileIsAnError) {
  const auto bytes = sample_file();
  size_t last_tensor_end = bytes.size();
  for (size_t n = 0; n < last_tensor_end; ++n) {
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(n));
    auto f = parse(prefix);
    EXPECT_FALSE(f.ok()) << "prefix of " << n << " bytes was accepted";
    if (!f.ok()) {
      EXPECT_FALSE(f.error().empty());
    }
  }
}

// Seeded mutation loop: flip bytes, splice in extreme integers; the parser must return either a
// file or an error and never crash (run under ASan/UBSan by `make test-asan`).
TEST(Gguf, SeededMutationFuzzSynthetic) {
  const auto base = sample_file();
  std::mt19937_64 rng(1234);
  int accepted = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    auto b = base;
    const int n_mut = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < n_mut; ++m) {
      const size_t pos = rng() % b.size();
      switch (rng() % 4) {
        case 0:
          b[pos] = static_cast<uint8_t>(rng());
          break;
        case 1:
          b[pos] ^= static_cast<uint8_t>(1u << (rng() % 8));
          break;
        case 2: {
          const uint64_t extreme[] = {0, 1, 0xFF, 0xFFFFFFFFull, ~0ull, 1ull << 63, 1ull << 32};
          const uint64_t v = extreme[rng() % 7];
          const size_t n = std::min<size_t>(8, b.size() - pos);
          std::memcpy(b.data() + pos, &v, n);
          break;
        }
        default:
          b.resize(pos);
          break;
      }
      if (b.empty()) break;
    }
    auto f = parse(b);
    if (f.ok()) {
      ++accepted;
      for (const auto& t : (*f)->tensors()) {
        ASSERT_LE((*f)->data_offset() + t.offset + t.n_bytes, b.size());
      }
    }
  }
  EXPECT_LT(accepted, 20000);  // the mutations do reach the checks
}

class GgufRealFile : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = test::smollm2_path();
    BIE_REQUIRE_FILE(path_);
    bytes_ = test::read_file(path_);
  }
  std::string path_;
  std::string bytes_;
};

TEST_F(GgufRealFile, SmolLM2Header) {
  auto f = GgufFile::open(path_);
  ASSERT_TRUE(f.ok()) << f.error();
  const GgufFile& g = **f;
  EXPECT_EQ(g.architecture(), "llama");
  EXPECT_EQ(g.get_uint("llama.block_count"), 30u);
  EXPECT_EQ(g.get_uint("llama.embedding_length"), 576u);
  EXPECT_EQ(g.get_uint("llama.attention.head_count"), 9u);
  EXPECT_EQ(g.get_uint("llama.attention.head_count_kv"), 3u);
  ASSERT_NE(g.get_array("tokenizer.ggml.tokens"), nullptr);
  EXPECT_EQ(g.get_array("tokenizer.ggml.tokens")->items.size(), 49152u);
  EXPECT_EQ(g.tensors().size(), 272u);  // 30 layers x 9 + token_embd + output_norm
}

TEST_F(GgufRealFile, TruncationsAreErrors) {
  auto full = GgufFile::from_memory(bytes_.data(), bytes_.size());
  ASSERT_TRUE(full.ok());
  const uint64_t data_offset = (*full)->data_offset();
  uint64_t end_of_tensors = 0;
  for (const auto& t : (*full)->tensors()) {
    end_of_tensors = std::max(end_of_tensors, data_offset + t.offset + t.n_bytes);
  }
  std::mt19937_64 rng(7);
  std::vector<uint64_t> cuts = {
      0, 3, 4, 8, 16, 24, data_offset - 1, data_offset, end_of_tensors - 1};
  for (int i = 0; i < 150; ++i) cuts.push_back(rng() % data_offset);
  for (int i = 0; i < 50; ++i) cuts.push_back(data_offset + rng() % (end_of_tensors - data_offset));
  for (uint64_t n : cuts) {
    auto f = GgufFile::from_memory(bytes_.data(), n);
    EXPECT_FALSE(f.ok()) << "truncated at " << n << " was accepted";
  }
}

TEST_F(GgufRealFile, SeededMutationsOfRealHeader) {
  auto full = GgufFile::from_memory(bytes_.data(), bytes_.size());
  ASSERT_TRUE(full.ok());
  // Mutate a copy of the header + first bytes of data; keep the parse cheap by cutting data.
  std::mt19937_64 rng(99);
  const size_t header = (*full)->data_offset();
  std::string b = bytes_;
  for (int iter = 0; iter < 60; ++iter) {
    std::vector<size_t> touched;
    for (int m = 0; m < 8; ++m) {
      const size_t pos = rng() % header;
      touched.push_back(pos);
      b[pos] = static_cast<char>(rng());
    }
    auto f = GgufFile::from_memory(b.data(), b.size());
    if (f.ok()) {
      for (const auto& t : (*f)->tensors()) {
        ASSERT_LE((*f)->data_offset() + t.offset + t.n_bytes, b.size());
      }
    }
    for (size_t pos : touched) b[pos] = bytes_[pos];  // restore for the next iteration
  }
}

TEST(Gguf, OpenReportsMissingFile) {
  auto f = GgufFile::open("/nonexistent/model.gguf");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().find("cannot open model file '/nonexistent/model.gguf'"), std::string::npos);
}

}  // namespace
}  // namespace bie::gguf
