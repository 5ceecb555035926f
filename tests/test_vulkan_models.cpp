// The shipped models' real weights on the Vulkan device (lavapipe in CI): every 2-D weight tensor
// of SmolLM2 (Q4_1, Q8_0) and Gemma 3 (Q4_K, Q5_0, Q6_K, Q8_0) is uploaded once in its GGUF
// layout, the device's memory grows by exactly those bytes (from the allocations), and the first
// and last rows of each tensor are multiplied on the GPU (decode and prefill kernels) and held to
// an fp64 dot over the scalar dequantisation. Gemma 3's 171 MiB embedding is larger than
// lavapipe's 128 MiB binding limit, so its last rows go through the windowed binding.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "backend/vulkan/vulkan_backend.h"
#include "bie/gguf/gguf_file.h"
#include "bie/quant/traits.h"
#include "support/lavapipe.h"
#include "support/paths.h"

namespace bie {
namespace {

using quant::GgmlType;

double f32_sum_bound(int64_t n, double abs_sum) {
  return 2.0 * static_cast<double>(n + 2) * std::ldexp(1.0, -24) * abs_sum + 1e-30;
}

void check_model(const std::string& path) {
  auto file = gguf::GgufFile::open(path);
  ASSERT_TRUE(file.ok()) << file.error();
  const gguf::GgufFile& f = **file;
  VulkanBackendOptions o;
  o.device_index = test::lavapipe_index();
  auto be = VulkanBackend::create(o);
  ASSERT_TRUE(be.ok()) << be.error();
  VulkanBackend& gpu = **be;

  const uint64_t base = gpu.device().allocated_bytes();
  uint64_t file_bytes = 0;
  int n_tensors = 0, n_checked = 0;
  std::vector<std::unique_ptr<DeviceBuffer>> weights;
  for (const gguf::TensorInfo& t : f.tensors()) {
    if (t.n_dims != 2) continue;
    const auto type = static_cast<GgmlType>(t.type);
    auto w = gpu.upload_weights({f.tensor_data(t), t.n_bytes});
    ASSERT_TRUE(w.ok()) << t.name << ": " << w.error();
    weights.push_back(std::move(*w));
    file_bytes += t.n_bytes;
    ++n_tensors;

    const int64_t n_in = t.ne[0], n_out = t.ne[1];
    const size_t row_bytes = quant::row_size(type, n_in);
    const Tensor full{weights.back().get(), 0, type, n_out, n_in, row_bytes};
    const quant::TypeTraits* tr = quant::traits_scalar(type);
    ASSERT_NE(tr, nullptr) << t.name;
    std::mt19937 rng(static_cast<uint32_t>(n_tensors));
    std::normal_distribution<float> dist(0.0f, 1.0f);
    const int64_t n_tok = 2;
    std::vector<float> xv(static_cast<size_t>(n_in * n_tok));
    for (float& v : xv) v = dist(rng);
    auto xb = gpu.alloc(xv.size() * 4);
    ASSERT_TRUE(xb.ok());
    Tensor x = tensor_of(**xb, GgmlType::F32, n_tok, n_in);
    gpu.upload(x, xv.data());
    const int64_t rows = std::min<int64_t>(16, n_out);
    for (int64_t r0 : {int64_t{0}, n_out - rows}) {
      const Tensor w = full.slice_rows(r0, rows);
      std::vector<float> deq(static_cast<size_t>(rows * n_in));
      for (int64_t r = 0; r < rows; ++r) {
        tr->to_float(f.tensor_data(t) + static_cast<size_t>(r0 + r) * row_bytes, &deq[r * n_in],
                     n_in);
      }
      for (MatmulPath path : {MatmulPath::kDecode, MatmulPath::kPrefill}) {
        auto yb = gpu.alloc(static_cast<size_t>(rows * n_tok) * 4);
        ASSERT_TRUE(yb.ok());
        Tensor y = tensor_of(**yb, GgmlType::F32, n_tok, rows);
        gpu.matmul(w, x, y, path);
        std::vector<float> got(static_cast<size_t>(rows * n_tok));
        gpu.download(y, got.data());
        ASSERT_TRUE(gpu.status().ok()) << t.name << ": " << gpu.status().error();
        for (int64_t tk = 0; tk < n_tok; ++tk) {
          for (int64_t r = 0; r < rows; ++r) {
            double ref = 0, abs_sum = 0;
            for (int64_t k = 0; k < n_in; ++k) {
              const double p = static_cast<double>(deq[r * n_in + k]) * xv[tk * n_in + k];
              ref += p;
              abs_sum += std::fabs(p);
            }
            ASSERT_NEAR(got[tk * rows + r], ref, f32_sum_bound(n_in, abs_sum))
                << t.name << " (" << quant::type_name(type) << ") row " << r0 + r
                << (path == MatmulPath::kDecode ? " decode" : " prefill");
          }
        }
      }
    }
    ++n_checked;
  }
  EXPECT_GT(n_checked, 10);
  // Weights on the device: exactly the file's bytes, each tensor rounded up to the driver's
  // allocation granularity (measured from the allocations, not from a plan).
  const uint64_t on_device = gpu.device().allocated_bytes() - base;
  EXPECT_GE(on_device, file_bytes);
  EXPECT_LE(on_device, file_bytes + static_cast<uint64_t>(n_tensors) * 4096 + (uint64_t{1} << 20))
      << "weights took more device memory than their file bytes";
}

TEST(VulkanModels, SmolLM2WeightsOnTheDeviceMatchTheScalarReference) {
  BIE_REQUIRE_FILE(test::smollm2_path());
  check_model(test::smollm2_path());
}

TEST(VulkanModels, Gemma3WeightsOnTheDeviceMatchTheScalarReference) {
  BIE_REQUIRE_FILE(test::gemma3_path());
  check_model(test::gemma3_path());
}

// Gemma 3's tied embedding (262,144 rows, larger than one binding on lavapipe) on the device.
class Gemma3Embedding : public ::testing::Test {
 protected:
  void SetUp() override {
    BIE_REQUIRE_FILE(test::gemma3_path());
    auto file = gguf::GgufFile::open(test::gemma3_path());
    ASSERT_TRUE(file.ok()) << file.error();
    file_ = std::move(file).value();
    t_ = file_->find_tensor("token_embd.weight");
    ASSERT_NE(t_, nullptr);
    type = static_cast<GgmlType>(t_->type);
    n_in = t_->ne[0];
    n_out = t_->ne[1];
    row_bytes = quant::row_size(type, n_in);
    VulkanBackendOptions o;
    o.device_index = test::lavapipe_index();
    auto be = VulkanBackend::create(o);
    ASSERT_TRUE(be.ok()) << be.error();
    be_ = std::move(be).value();
    ASSERT_GT(static_cast<uint64_t>(n_out) * row_bytes, be_->device().max_binding_bytes());
    auto wb = be_->upload_weights({file_->tensor_data(*t_), t_->n_bytes});
    ASSERT_TRUE(wb.ok()) << wb.error();
    wb_ = std::move(wb).value();
    w = Tensor{wb_.get(), 0, type, n_out, n_in, row_bytes};
  }
  void TearDown() override {
    wb_.reset();
    be_.reset();
  }
  // Row r of the table, dequantised by the scalar reference.
  std::vector<float> row(int64_t r) const {
    std::vector<float> deq(static_cast<size_t>(n_in));
    quant::traits_scalar(type)->to_float(
        file_->tensor_data(*t_) + static_cast<size_t>(r) * row_bytes, deq.data(), n_in);
    return deq;
  }
  std::unique_ptr<gguf::GgufFile> file_;
  const gguf::TensorInfo* t_ = nullptr;
  std::unique_ptr<VulkanBackend> be_;
  std::unique_ptr<DeviceBuffer> wb_;
  GgmlType type = GgmlType::F32;
  int64_t n_in = 0, n_out = 0;
  size_t row_bytes = 0;
  Tensor w;
};

// The whole tied embedding of Gemma 3 as the output layer (262,144 rows, several binding
// windows on lavapipe), rows sampled across every window, decode and prefill kernels, one and
// five tokens.
TEST_F(Gemma3Embedding, OutputLayerAcrossBindingWindowsMatchesTheScalarReference) {
  VulkanBackend& gpu = *be_;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (const int64_t n_tok : {int64_t{1}, int64_t{5}}) {
    std::vector<float> xv(static_cast<size_t>(n_in * n_tok));
    for (float& v : xv) v = dist(rng);
    auto xb = gpu.alloc(xv.size() * 4);
    auto yb = gpu.alloc(static_cast<size_t>(n_out * n_tok) * 4);
    ASSERT_TRUE(xb.ok() && yb.ok());
    const Tensor x = tensor_of(**xb, GgmlType::F32, n_tok, n_in);
    const Tensor y = tensor_of(**yb, GgmlType::F32, n_tok, n_out);
    gpu.upload(x, xv.data());
    for (MatmulPath path : {MatmulPath::kDecode, MatmulPath::kPrefill}) {
      gpu.matmul(w, x, y, path);
      std::vector<float> got(static_cast<size_t>(n_out * n_tok));
      gpu.download(y, got.data());
      ASSERT_TRUE(gpu.status().ok()) << gpu.status().error();
      for (int64_t r = 0; r < n_out; r += 4099) {
        const std::vector<float> deq = row(r);
        for (int64_t tk = 0; tk < n_tok; ++tk) {
          double ref = 0, abs_sum = 0;
          for (int64_t k = 0; k < n_in; ++k) {
            const double p = static_cast<double>(deq[static_cast<size_t>(k)]) * xv[tk * n_in + k];
            ref += p;
            abs_sum += std::fabs(p);
          }
          ASSERT_NEAR(got[tk * n_out + r], ref, f32_sum_bound(n_in, abs_sum))
              << "row " << r << " token " << tk << " of " << n_tok
              << (path == MatmulPath::kDecode ? " decode" : " prefill");
        }
      }
    }
  }
}

// Gemma 3's embedding rows gathered through per-row binding windows (the table is larger than
// one binding), scaled as the decoder scales them.
TEST_F(Gemma3Embedding, RowsAcrossBindingWindowsMatchTheScalarReference) {
  VulkanBackend& gpu = *be_;
  const std::vector<int32_t> ids = {2, 262143, 106, 150000, 2, 7, 200001};
  const auto n = static_cast<int64_t>(ids.size());
  auto ib = gpu.alloc(ids.size() * 4);
  auto ob = gpu.alloc(static_cast<size_t>(n * n_in) * 4);
  ASSERT_TRUE(ib.ok() && ob.ok());
  const Tensor idt = tensor_of(**ib, GgmlType::I32, n, 1);
  const Tensor out = tensor_of(**ob, GgmlType::F32, n, n_in);
  gpu.upload(idt, ids.data());
  gpu.get_rows(w, idt, out, 25.3f);
  std::vector<float> got(static_cast<size_t>(n * n_in));
  gpu.download(out, got.data());
  ASSERT_TRUE(gpu.status().ok()) << gpu.status().error();
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<float> deq = row(ids[static_cast<size_t>(i)]);
    for (int64_t k = 0; k < n_in; ++k) {
      const float want = deq[static_cast<size_t>(k)] * 25.3f;
      ASSERT_NEAR(got[i * n_in + k], want, 1e-5f * (std::fabs(want) + 1e-3f))
          << "id " << ids[static_cast<size_t>(i)] << " k " << k;
    }
  }
}

}  // namespace
}  // namespace bie
