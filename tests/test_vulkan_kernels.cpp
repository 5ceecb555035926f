// Every Vulkan kernel against the CPU's scalar reference, on lavapipe in CI (tiny, odd shapes:
// lavapipe is slow). Weights are quantised by the scalar trait table, uploaded in their GGUF block
// layout, and the GPU's products are held to an fp64 dot over the scalar dequantisation; the
// elementwise ops are held to the CPU backend; paged attention to an fp64 softmax over the fp16
// K/V that kv_write stored.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/vulkan/vulkan_backend.h"
#include "bie/backend/backend.h"
#include "bie/backend/device.h"
#include "bie/planner/kv_format.h"
#include "bie/quant/fp16.h"
#include "bie/quant/traits.h"
#include "support/lavapipe.h"

namespace bie {
namespace {

using quant::GgmlType;

// fp32 accumulation of n products in any order: |error| <= n * 2^-24 * sum |products| (the
// classic gamma_n bound, with a factor 2 for the GPU's fused multiply-adds and reductions).
double f32_sum_bound(int64_t n, double abs_sum) {
  return 2.0 * static_cast<double>(n + 2) * std::ldexp(1.0, -24) * abs_sum + 1e-30;
}
// Elementwise transcendental ops (exp, tanh) on the GPU: Vulkan allows a few ulps.
constexpr float kTranscendentalRelTol = 2e-6f;
// GELU is computed on fp16-rounded values: the GPU's fp16 rounding may differ by one fp16 step.
constexpr float kGeluRelTol = 2e-3f;
// Attention outputs (weighted means of fp16 values of magnitude ~1, fp32 softmax).
constexpr double kAttnAbsTol = 2e-5;

VulkanBackend& gpu() {
  return test::shared_vulkan_backend();
}

Backend& cpu() {
  static std::unique_ptr<Backend> be = create_backend(BackendConfig{"cpu", 1}).value();
  return *be;
}

// Device tensors made from host data; the buffers live as long as the holder.
struct Holder {
  explicit Holder(Backend& b) : be(b) {}
  Backend& be;
  std::vector<std::unique_ptr<DeviceBuffer>> bufs;
  Tensor f32(const std::vector<float>& v, int64_t rows, int64_t cols) {
    bufs.push_back(be.alloc(v.size() * 4).value());
    Tensor t = tensor_of(*bufs.back(), GgmlType::F32, rows, cols);
    be.upload(t, v.data());
    return t;
  }
  Tensor i32(const std::vector<int32_t>& v) {
    bufs.push_back(be.alloc(v.size() * 4).value());
    Tensor t = tensor_of(*bufs.back(), GgmlType::I32, 1, static_cast<int64_t>(v.size()));
    be.upload(t, v.data());
    return t;
  }
  Tensor zeros(int64_t rows, int64_t cols) {
    return f32(std::vector<float>(static_cast<size_t>(rows * cols), 0.0f), rows, cols);
  }
  std::vector<float> read(const Tensor& t) {
    std::vector<float> v(t.bytes() / 4);
    be.download(t, v.data());
    return v;
  }
};

std::vector<float> randn(size_t n, uint32_t seed, float sd = 1.0f, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(mean, sd);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

struct QuantMatrix {
  GgmlType type;
  int64_t n_in, n_out;
  size_t row_bytes;
  std::vector<uint8_t> bytes;  // 2 padding rows first (the weight is a row slice, offset != 0)
  std::vector<float> deq;      // [n_out, n_in] scalar dequantisation
};

QuantMatrix make_matrix(GgmlType type, int64_t n_in, int64_t n_out, uint32_t seed) {
  const quant::TypeTraits* t = quant::traits_scalar(type);
  QuantMatrix m{type, n_in, n_out, quant::row_size(type, n_in), {}, {}};
  m.bytes.assign(m.row_bytes * static_cast<size_t>(n_out + 2), 0xA5);
  m.deq.resize(static_cast<size_t>(n_in * n_out));
  for (int64_t r = 0; r < n_out; ++r) {
    // Some rows off-centre so the min terms (Q4_1, Q5_1, K-quants) matter.
    std::vector<float> row = randn(static_cast<size_t>(n_in), seed + static_cast<uint32_t>(r), 1.0f,
                                   r % 3 == 0 ? 0.7f : 0.0f);
    uint8_t* dst = m.bytes.data() + m.row_bytes * static_cast<size_t>(r + 2);
    t->from_float(row.data(), dst, n_in);
    t->to_float(dst, m.deq.data() + r * n_in, n_in);
  }
  return m;
}

struct TypeCase {
  GgmlType type;
  int64_t n_in;  // two or three blocks, odd for the unblocked types
};
const TypeCase kTypes[] = {
    {GgmlType::F32, 67},   {GgmlType::F16, 67},   {GgmlType::BF16, 67},  {GgmlType::Q8_0, 96},
    {GgmlType::Q4_0, 96},  {GgmlType::Q4_1, 96},  {GgmlType::Q5_0, 96},  {GgmlType::Q5_1, 96},
    {GgmlType::Q4_K, 512}, {GgmlType::Q5_K, 512}, {GgmlType::Q6_K, 512},
};

class VulkanMatmul : public ::testing::TestWithParam<TypeCase> {};

void check_matmul(const TypeCase& c, int64_t n_tokens, MatmulPath path, VulkanBackend& be = gpu()) {
  const int64_t n_out = 37;
  QuantMatrix m = make_matrix(c.type, c.n_in, n_out, 11);
  Holder h{be};
  auto wb = be.upload_weights(m.bytes);
  ASSERT_TRUE(wb.ok()) << wb.error();
  Tensor w{wb->get(), 0, c.type, n_out + 2, c.n_in, m.row_bytes};
  w = w.slice_rows(2, n_out);
  std::vector<float> xv = randn(static_cast<size_t>(c.n_in * n_tokens), 5, 2.0f);
  Tensor x = h.f32(xv, n_tokens, c.n_in);
  Tensor y = h.zeros(n_tokens, n_out);
  be.matmul(w, x, y, path);
  std::vector<float> got = h.read(y);
  ASSERT_TRUE(be.status().ok()) << be.status().error();
  int bad = 0;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t r = 0; r < n_out; ++r) {
      double ref = 0, abs_sum = 0;
      for (int64_t k = 0; k < c.n_in; ++k) {
        const double p = static_cast<double>(m.deq[r * c.n_in + k]) * xv[t * c.n_in + k];
        ref += p;
        abs_sum += std::fabs(p);
      }
      const double err = std::fabs(got[t * n_out + r] - ref);
      if (err > f32_sum_bound(c.n_in, abs_sum) && ++bad < 5) {
        ADD_FAILURE() << quant::type_name(c.type) << " t=" << t << " r=" << r << " got "
                      << got[t * n_out + r] << " want " << ref;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST_P(VulkanMatmul, MatVecDecodeMatchesScalarReference) {
  check_matmul(GetParam(), 11, MatmulPath::kDecode);  // two groups of 8 tokens, the second partial
}

TEST_P(VulkanMatmul, MatVecOfElevenTokensIsBitIdenticalToEachTokenAlone) {
  // Decode batch invariance on the device: a token's bits do not depend on the tokens batched
  // with it (here two groups of the kernel's 8 tokens per workgroup, the second partial).
  const TypeCase c = GetParam();
  const int64_t n_out = 37, n_tok = 11;
  QuantMatrix m = make_matrix(c.type, c.n_in, n_out, 17);
  Holder h{gpu()};
  auto wb = gpu().upload_weights(m.bytes);
  ASSERT_TRUE(wb.ok()) << wb.error();
  const Tensor w =
      Tensor{wb->get(), 0, c.type, n_out + 2, c.n_in, m.row_bytes}.slice_rows(2, n_out);
  const std::vector<float> xv = randn(static_cast<size_t>(c.n_in * n_tok), 9, 2.0f);
  const Tensor x = h.f32(xv, n_tok, c.n_in);
  const Tensor y = h.zeros(n_tok, n_out);
  gpu().matmul(w, x, y, MatmulPath::kDecode);
  const std::vector<float> all = h.read(y);
  for (int64_t t = 0; t < n_tok; ++t) {
    const Tensor y1 = h.zeros(1, n_out);
    gpu().matmul(w, x.slice_rows(t, 1), y1, MatmulPath::kDecode);
    const std::vector<float> one = h.read(y1);
    ASSERT_TRUE(gpu().status().ok()) << gpu().status().error();
    for (int64_t r = 0; r < n_out; ++r) {
      ASSERT_EQ(std::memcmp(&one[r], &all[t * n_out + r], 4), 0)
          << quant::type_name(c.type) << " token " << t << " row " << r << ": " << one[r]
          << " alone, " << all[t * n_out + r] << " in the batch";
    }
  }
}

TEST_P(VulkanMatmul, TiledPrefillMatchesScalarReference) {
  check_matmul(GetParam(), 33, MatmulPath::kPrefill);  // two token tiles, the second of one
}

TEST_P(VulkanMatmul, EmbeddingRowsMatchScalarDequantisation) {
  const TypeCase c = GetParam();
  QuantMatrix m = make_matrix(c.type, c.n_in, 9, 3);
  Holder h{gpu()};
  auto wb = gpu().upload_weights(m.bytes);
  ASSERT_TRUE(wb.ok());
  Tensor table = Tensor{wb->get(), 0, c.type, 11, c.n_in, m.row_bytes}.slice_rows(2, 9);
  const std::vector<int32_t> ids = {5, 0, 8, 5};
  Tensor idt = h.i32(ids);
  Tensor out = h.zeros(4, c.n_in);
  gpu().get_rows(table, idt, out, 0.5f);
  std::vector<float> got = h.read(out);
  ASSERT_TRUE(gpu().status().ok()) << gpu().status().error();
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int64_t k = 0; k < c.n_in; ++k) {
      const float want = m.deq[ids[i] * c.n_in + k] * 0.5f;
      ASSERT_NEAR(got[i * c.n_in + k], want, 1e-6f * (std::fabs(want) + 1e-3f))
          << quant::type_name(c.type) << " id " << ids[i] << " k " << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllWeightTypes, VulkanMatmul, ::testing::ValuesIn(kTypes),
                         [](const auto& info) {
                           return std::string(quant::type_name(info.param.type));
                         });

// A weight larger than one shader binding (Gemma 3's embedding on lavapipe's 128 MiB limit) is
// bound as windows of rows; here the limit is forced down to a few rows per window.
TEST(VulkanMatmul, WeightsLargerThanOneBindingAreSplitIntoWindows) {
  VulkanBackendOptions o;
  o.device_index = test::lavapipe_index();
  o.max_weight_window_bytes = 1024;
  auto be = VulkanBackend::create(o);
  ASSERT_TRUE(be.ok()) << be.error();
  for (const TypeCase& c : {TypeCase{GgmlType::Q4_K, 512}, TypeCase{GgmlType::Q5_0, 96}}) {
    check_matmul(c, 2, MatmulPath::kDecode, **be);
    check_matmul(c, 5, MatmulPath::kPrefill, **be);
  }
  // Embedding rows one window each.
  QuantMatrix m = make_matrix(GgmlType::Q6_K, 512, 9, 3);
  Holder h{**be};
  auto wb = (*be)->upload_weights(m.bytes);
  Tensor table = Tensor{wb->get(), 0, GgmlType::Q6_K, 11, 512, m.row_bytes}.slice_rows(2, 9);
  Tensor out = h.zeros(3, 512);
  (*be)->get_rows(table, h.i32({8, 0, 4}), out, 1.0f);
  std::vector<float> got = h.read(out);
  ASSERT_TRUE((*be)->status().ok()) << (*be)->status().error();
  const int ids[] = {8, 0, 4};
  for (int i = 0; i < 3; ++i) {
    for (int k = 0; k < 512; ++k) ASSERT_NEAR(got[i * 512 + k], m.deq[ids[i] * 512 + k], 1e-6f);
  }
}

TEST(VulkanMatmul, RefusesTypesWithoutAKernel) {
  VulkanBackendOptions o;
  o.device_index = test::lavapipe_index();
  auto be = VulkanBackend::create(o);
  ASSERT_TRUE(be.ok());
  Holder h{**be};
  std::vector<uint8_t> bytes(84 * 2, 0);
  auto wb = (*be)->upload_weights(bytes);
  Tensor w{wb->get(), 0, GgmlType::Q2_K, 1, 256, 84};
  Tensor x = h.zeros(1, 256), y = h.zeros(1, 1);
  (*be)->matmul(w, x, y, MatmulPath::kDecode);
  ASSERT_FALSE((*be)->status().ok());
  EXPECT_NE((*be)->status().error().find("q2_K"), std::string::npos) << (*be)->status().error();
}

// ---- elementwise ops: the Vulkan backend against the CPU backend --------------------------------

struct Pair {
  Holder g = Holder(gpu());
  Holder c = Holder(cpu());
};

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float rel,
                  float abs, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= abs + rel * std::fabs(want[i])) && ++bad < 5) {
      ADD_FAILURE() << what << " [" << i << "] got " << got[i] << " want " << want[i];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

TEST(VulkanOps, RmsNormRowsAndPerHead) {
  Pair p;
  const int64_t rows = 5, heads = 3, d = 64;
  std::vector<float> xv = randn(rows * heads * d, 1, 3.0f), wv = randn(heads * d, 2);
  std::vector<float> wh(wv.begin(), wv.begin() + d);
  for (int per_head = 0; per_head < 2; ++per_head) {
    Tensor xg = p.g.f32(xv, rows, heads * d), xc = p.c.f32(xv, rows, heads * d);
    Tensor wg = per_head ? p.g.f32(wh, 1, d) : p.g.f32(wv, 1, heads * d);
    Tensor wc = per_head ? p.c.f32(wh, 1, d) : p.c.f32(wv, 1, heads * d);
    if (per_head) {  // Gemma / Qwen3 q/k norm: [n, h * d] seen as [n * h, d], in place
      gpu().rms_norm(xg.reshape(rows * heads, d), wg, xg.reshape(rows * heads, d), 1e-6f);
      cpu().rms_norm(xc.reshape(rows * heads, d), wc, xc.reshape(rows * heads, d), 1e-6f);
      expect_close(p.g.read(xg), p.c.read(xc), 1e-5f, 1e-6f, "per-head rms_norm");
    } else {
      Tensor og = p.g.zeros(rows, heads * d), oc = p.c.zeros(rows, heads * d);
      gpu().rms_norm(xg, wg, og, 1e-5f);
      cpu().rms_norm(xc, wc, oc, 1e-5f);
      expect_close(p.g.read(og), p.c.read(oc), 1e-5f, 1e-6f, "rms_norm");
    }
  }
  ASSERT_TRUE(gpu().status().ok()) << gpu().status().error();
}

TEST(VulkanOps, AddBroadcastScaleSoftcap) {
  Pair p;
  const int64_t rows = 7, cols = 67;
  std::vector<float> xv = randn(rows * cols, 3, 20.0f), yv = randn(rows * cols, 4),
                     bias = randn(cols, 5);
  Tensor xg = p.g.f32(xv, rows, cols), xc = p.c.f32(xv, rows, cols);
  gpu().add(xg, p.g.f32(yv, rows, cols));
  cpu().add(xc, p.c.f32(yv, rows, cols));
  gpu().add(xg, p.g.f32(bias, 1, cols));  // one row broadcast (a bias)
  cpu().add(xc, p.c.f32(bias, 1, cols));
  expect_close(p.g.read(xg), p.c.read(xc), 0.0f, 0.0f, "add");
  gpu().scale(xg, 0.37f);
  cpu().scale(xc, 0.37f);
  expect_close(p.g.read(xg), p.c.read(xc), 0.0f, 0.0f, "scale");
  // Rows 2..5 only (a slice: offset and stride in the push constants).
  gpu().softcap(xg.slice_rows(2, 4), 5.0f);
  cpu().softcap(xc.slice_rows(2, 4), 5.0f);
  expect_close(p.g.read(xg), p.c.read(xc), kTranscendentalRelTol, 1e-6f, "softcap");
  ASSERT_TRUE(gpu().status().ok()) << gpu().status().error();
}

TEST(VulkanOps, SiluMulAndGeluMul) {
  Pair p;
  const int64_t rows = 3, cols = 301;
  std::vector<float> gv = randn(rows * cols, 6, 4.0f), uv = randn(rows * cols, 7);
  gv[0] = -12.0f;  // GELU's clamps
  gv[1] = 11.0f;
  for (int gelu = 0; gelu < 2; ++gelu) {
    Tensor gg = p.g.f32(gv, rows, cols), gc = p.c.f32(gv, rows, cols);
    Tensor ug = p.g.f32(uv, rows, cols), uc = p.c.f32(uv, rows, cols);
    if (gelu) {
      gpu().gelu_mul(gg, ug);
      cpu().gelu_mul(gc, uc);
      expect_close(p.g.read(gg), p.c.read(gc), kGeluRelTol, 1e-6f, "gelu_mul");
    } else {
      gpu().silu_mul(gg, ug);
      cpu().silu_mul(gc, uc);
      expect_close(p.g.read(gg), p.c.read(gc), kTranscendentalRelTol, 1e-6f, "silu_mul");
    }
  }
  ASSERT_TRUE(gpu().status().ok()) << gpu().status().error();
}

TEST(VulkanOps, RopeBothLayoutsPartialRotationAndFreqFactors) {
  const std::vector<int32_t> pos = {0, 1, 7, 100, 4097};
  const int64_t n = 5;
  const int heads = 3, d = 64;
  for (int neox = 0; neox < 2; ++neox) {
    for (int n_rot : {64, 32}) {
      for (int ff = 0; ff < 2; ++ff) {
        Pair p;
        std::vector<float> xv = randn(n * heads * d, 8);
        std::vector<float> fv(n_rot / 2);
        for (int i = 0; i < n_rot / 2; ++i) fv[i] = 1.0f + 0.25f * static_cast<float>(i % 5);
        RopeConfig rg{n_rot, 500000.0f, 1.0f, neox == 1, {}};
        RopeConfig rc = rg;
        if (ff) {
          rg.freq_factors = p.g.f32(fv, 1, n_rot / 2);
          rc.freq_factors = p.c.f32(fv, 1, n_rot / 2);
        }
        Tensor xg = p.g.f32(xv, n, heads * d), xc = p.c.f32(xv, n, heads * d);
        Tensor csg = p.g.zeros(n, n_rot), csc = p.c.zeros(n, n_rot);
        gpu().rope_cache(rg, p.g.i32(pos), csg);
        cpu().rope_cache(rc, p.c.i32(pos), csc);
        expect_close(p.g.read(csg), p.c.read(csc), 0.0f, 0.0f, "rope_cache");
        gpu().rope(rg, csg, xg, heads, d);
        cpu().rope(rc, csc, xc, heads, d);
        expect_close(p.g.read(xg), p.c.read(xc), 1e-6f, 1e-6f, neox ? "rope neox" : "rope");
      }
    }
  }
  ASSERT_TRUE(gpu().status().ok()) << gpu().status().error();
}

// ---- paged attention over fp16 KV pools -----------------------------------------------------

struct AttnCase {
  int n_head = 4, n_head_kv = 2, head_dim = 32, block_size = 4;
  int n_layers = 2, layer = 1;  // the second layer of the group: tiles at a layer offset
  int n_blocks = 7;
};

// The fp16 pool layout of backend.h's KvPoolDesc, computed independently of the shader: byte
// offset of K (or V) element (block, layer, head, row, dim).
size_t kv_byte(const AttnCase& c, bool v, int block, int head, int row, int dim) {
  const size_t tile = static_cast<size_t>(c.block_size) * c.head_dim * 2;
  const size_t layer_bytes = static_cast<size_t>(c.n_head_kv) * 2 * tile;
  const size_t block_bytes = layer_bytes * c.n_layers;
  return block * block_bytes + c.layer * layer_bytes + (v ? c.n_head_kv * tile : 0) + head * tile +
         (static_cast<size_t>(row) * c.head_dim + dim) * 2;
}

TEST(VulkanAttention, KvWriteCopyBlocksAndPagedAttentionMatchFp64Reference) {
  const AttnCase c;
  VulkanBackend& be = gpu();
  Holder h{be};
  const size_t tile = static_cast<size_t>(c.block_size) * c.head_dim * 2;
  const size_t block_bytes = tile * 2 * c.n_head_kv * c.n_layers;
  auto pool_buf = be.alloc(block_bytes * c.n_blocks);
  ASSERT_TRUE(pool_buf.ok());
  KvPoolDesc pool;
  pool.memory = Tensor{
      pool_buf->get(), 0, GgmlType::I8, c.n_blocks, static_cast<int64_t>(block_bytes), block_bytes};
  pool.k_type = pool.v_type = static_cast<uint8_t>(planner::KvType::kF16);
  pool.k_tile_bytes = pool.v_tile_bytes = tile;
  const KvPoolDesc pools[] = {pool};

  // Two sequences: A holds positions 0..7 in blocks {3, 1}, B positions 0..9 in {0, 5, 2}.
  const std::vector<std::vector<int32_t>> tables = {{3, 1}, {0, 5, 2}};
  const int64_t lens[] = {8, 10};
  const int kvw = c.n_head_kv * c.head_dim;
  std::vector<std::vector<float>> K(2), V(2);
  std::vector<KvSlot> slots;
  std::vector<float> kall, vall;
  for (int s = 0; s < 2; ++s) {
    K[s] = randn(lens[s] * kvw, 20 + s);
    V[s] = randn(lens[s] * kvw, 30 + s);
    for (int64_t j = 0; j < lens[s]; ++j) {
      slots.push_back({{0, tables[s][j / c.block_size]}, static_cast<int32_t>(j % c.block_size)});
    }
    kall.insert(kall.end(), K[s].begin(), K[s].end());
    vall.insert(vall.end(), V[s].begin(), V[s].end());
  }
  const auto n_rows = static_cast<int64_t>(slots.size());
  KvWriteMetadata wm;
  wm.k = h.f32(kall, n_rows, kvw);
  wm.v = h.f32(vall, n_rows, kvw);
  wm.layer_in_group = c.layer;
  wm.n_head_kv = c.n_head_kv;
  wm.head_dim = c.head_dim;
  wm.block_size = c.block_size;
  wm.pools = pools;
  wm.slots = slots;
  ASSERT_TRUE(be.kv_write(wm).ok()) << be.status().error();

  // The stored halves sit where the layout says (independent of the shader's index math).
  std::vector<uint8_t> bytes(block_bytes * c.n_blocks);
  be.download(pool.memory, bytes.data());
  auto half_at = [&](size_t off) {
    uint16_t hb;
    std::memcpy(&hb, bytes.data() + off, 2);
    return quant::fp16_to_fp32(hb);
  };
  auto f16 = [](float x) { return quant::fp16_to_fp32(quant::fp32_to_fp16(x)); };
  for (int s = 0; s < 2; ++s) {
    for (int64_t j = 0; j < lens[s]; ++j) {
      for (int hh = 0; hh < c.n_head_kv; ++hh) {
        for (int dd = 0; dd < c.head_dim; dd += 7) {
          const int blk = tables[s][j / c.block_size], row = static_cast<int>(j % c.block_size);
          ASSERT_EQ(half_at(kv_byte(c, false, blk, hh, row, dd)),
                    f16(K[s][j * kvw + hh * c.head_dim + dd]));
          ASSERT_EQ(half_at(kv_byte(c, true, blk, hh, row, dd)),
                    f16(V[s][j * kvw + hh * c.head_dim + dd]));
        }
      }
    }
  }

  // Queries: A prefills positions 5..7 (3 rows), B decodes position 9.
  const int qw = c.n_head * c.head_dim;
  const std::vector<int64_t> q_pos0 = {5, 9};
  const std::vector<int32_t> query_start = {0, 3, 4};
  std::vector<KvBlockRef> table;
  std::vector<int32_t> table_start = {0};
  for (const auto& t : tables) {
    for (int32_t b : t) table.push_back({0, b});
    table_start.push_back(static_cast<int32_t>(table.size()));
  }
  const std::vector<float> qv = randn(4 * qw, 40);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  for (int64_t window : {int64_t{0}, int64_t{3}}) {
    AttnMetadata am;
    am.q = h.f32(qv, 4, qw);
    am.out = h.zeros(4, qw);
    am.layer_in_group = c.layer;
    am.n_layers_in_group = c.n_layers;
    am.n_head = c.n_head;
    am.n_head_kv = c.n_head_kv;
    am.head_dim = c.head_dim;
    am.block_size = c.block_size;
    am.scale = scale;
    am.window = window;
    am.pools = pools;
    am.query_start = query_start;
    am.q_pos0 = q_pos0;
    am.block_table_start = table_start;
    am.block_table = table;
    ASSERT_TRUE(be.paged_attention(am).ok()) << be.status().error();
    const std::vector<float> got = h.read(am.out);
    for (int s = 0; s < 2; ++s) {
      for (int32_t t = query_start[s]; t < query_start[s + 1]; ++t) {
        const int64_t pos = q_pos0[s] + (t - query_start[s]);
        const int64_t first = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
        for (int qh = 0; qh < c.n_head; ++qh) {
          const int kvh = qh / (c.n_head / c.n_head_kv);
          std::vector<double> sc;
          double mx = -1e300;
          for (int64_t j = first; j <= pos; ++j) {
            double dot = 0;
            for (int dd = 0; dd < c.head_dim; ++dd) {
              dot += static_cast<double>(f16(qv[t * qw + qh * c.head_dim + dd])) *
                     f16(K[s][j * kvw + kvh * c.head_dim + dd]);
            }
            sc.push_back(dot * scale);
            mx = std::max(mx, sc.back());
          }
          double l = 0;
          for (double& x : sc) l += (x = std::exp(x - mx));
          for (int dd = 0; dd < c.head_dim; ++dd) {
            double o = 0;
            for (int64_t j = first; j <= pos; ++j) {
              o += sc[j - first] * f16(V[s][j * kvw + kvh * c.head_dim + dd]);
            }
            ASSERT_NEAR(got[t * qw + qh * c.head_dim + dd], o / l, kAttnAbsTol)
                << "seq " << s << " token " << t << " head " << qh << " dim " << dd << " window "
                << window;
          }
        }
      }
    }
  }

  // Copy-on-write: block 3 (A's first) into free block 4, byte for byte.
  const KvBlockCopy cp[] = {{{0, 3}, {0, 4}}};
  ASSERT_TRUE(be.copy_blocks(pools, cp).ok());
  std::vector<uint8_t> after(bytes.size());
  be.download(pool.memory, after.data());
  EXPECT_EQ(
      0, std::memcmp(after.data() + 4 * block_bytes, bytes.data() + 3 * block_bytes, block_bytes));
  EXPECT_EQ(0, std::memcmp(after.data(), bytes.data(), 4 * block_bytes));  // others untouched
}

// A per-channel pool whose descriptor names no tile length cannot be laid out: refused with the
// geometry, never read out of bounds (tests/test_vulkan_kv_formats.cpp holds the well-formed
// pools to the CPU's bytes).
TEST(VulkanAttention, RefusesAPerChannelPoolWithoutATileLength) {
  Holder h{gpu()};
  auto buf = gpu().alloc(4096);
  KvPoolDesc pool;
  pool.memory = Tensor{buf->get(), 0, GgmlType::I8, 1, 4096, 4096};
  pool.k_type = static_cast<uint8_t>(planner::KvType::kInt4Channel);
  const KvPoolDesc pools[] = {pool};
  const KvSlot slot[] = {{{0, 0}, 0}};
  KvWriteMetadata wm;
  wm.k = h.zeros(1, 64);
  wm.v = h.zeros(1, 64);
  wm.n_head_kv = 1;
  wm.head_dim = 64;
  wm.pools = pools;
  wm.slots = slot;
  Status s = gpu().kv_write(wm);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().find("a per-channel KV tile of 0 tokens"), std::string::npos) << s.error();
}

}  // namespace
}  // namespace bie
