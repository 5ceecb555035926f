// A second backend written from the formulas, for tests: host memory, every dense operation a
// plain loop in double precision over weights dequantised with the scalar quant traits (no SIMD,
// no 8-bit activations, no threads). It implements only the Backend interface and is registered
// nowhere: the model and the host KV stores run on it unchanged (the KV pools stay in host memory,
// supports_paged_kv() is false, attention is the kv/ host path on host_threads()). That the golden
// tests pass on it shows a backend plugs in without touching model/, kv/ or engine/.
#pragma once

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bie/backend/backend.h"
#include "bie/backend/thread_pool.h"
#include "bie/quant/traits.h"

namespace bie::test {

class ReferenceBackend : public Backend {
 public:
  ReferenceBackend() : pool_(1) {}

  [[nodiscard]] std::string name() const override { return "reference"; }
  [[nodiscard]] ThreadPool& host_threads() override { return pool_; }

  [[nodiscard]] Result<std::unique_ptr<DeviceBuffer>> alloc(size_t bytes) override {
    return std::unique_ptr<DeviceBuffer>(std::make_unique<Buffer>(id(), bytes));
  }
  // A copy, not a view: what a device backend does with the weights.
  [[nodiscard]] Result<std::unique_ptr<DeviceBuffer>> upload_weights(
      std::span<const uint8_t> bytes) override {
    auto b = std::make_unique<Buffer>(id(), bytes.size());
    if (!bytes.empty()) std::memcpy(b->host_ptr(), bytes.data(), bytes.size());
    return std::unique_ptr<DeviceBuffer>(std::move(b));
  }
  void upload(const Tensor& dst, const void* src) override {
    if (dst.bytes() != 0) std::memcpy(dst.host(), src, dst.bytes());
  }
  void download(const Tensor& src, void* dst) override {
    if (src.bytes() != 0) std::memcpy(dst, src.host(), src.bytes());
  }
  void synchronize() override {}

  // y[t][o] = sum_i W[o][i] x[t][i], W's rows dequantised by the scalar traits.
  void matmul(const Tensor& w, const Tensor& x, const Tensor& y, MatmulPath /*path*/) override {
    std::vector<float> row(static_cast<size_t>(w.cols));
    const quant::TypeTraits* tr = quant::traits(w.type);
    for (int64_t o = 0; o < w.rows; ++o) {
      tr->to_float(bytes(w) + static_cast<size_t>(o) * w.row_bytes, row.data(), w.cols);
      for (int64_t t = 0; t < x.rows; ++t) {
        const float* xr = f32(x, t);
        double acc = 0.0;
        for (int64_t i = 0; i < w.cols; ++i) acc += static_cast<double>(row[i]) * xr[i];
        f32(y, t)[o] = static_cast<float>(acc);
      }
    }
  }
  void get_rows(const Tensor& table, const Tensor& ids, const Tensor& out, float scale) override {
    const auto* id = static_cast<const int32_t*>(ids.host());
    const quant::TypeTraits* tr = quant::traits(table.type);
    for (int64_t r = 0; r < out.rows; ++r) {
      float* o = f32(out, r);
      tr->to_float(bytes(table) + static_cast<size_t>(id[r]) * table.row_bytes, o, table.cols);
      for (int64_t c = 0; c < table.cols; ++c) o[c] *= scale;
    }
  }
  // out = x / sqrt(mean(x^2) + eps) * w
  void rms_norm(const Tensor& x, const Tensor& w, const Tensor& out, float eps) override {
    const float* wp = f32(w, 0);
    for (int64_t r = 0; r < x.rows; ++r) {
      const float* xr = f32(x, r);
      double ss = 0.0;
      for (int64_t c = 0; c < x.cols; ++c) ss += static_cast<double>(xr[c]) * xr[c];
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.cols) + eps);
      float* o = f32(out, r);
      for (int64_t c = 0; c < x.cols; ++c) o[c] = static_cast<float>(xr[c] * inv * wp[c]);
    }
  }
  void add(const Tensor& x, const Tensor& y) override {
    for (int64_t r = 0; r < x.rows; ++r) {
      const float* yr = f32(y, y.rows == 1 ? 0 : r);  // a one-row y is broadcast (biases)
      float* xr = f32(x, r);
      for (int64_t c = 0; c < x.cols; ++c) xr[c] += yr[c];
    }
  }
  void scale(const Tensor& x, float s) override {
    each(x, [&](float& v, int64_t, int64_t) { v *= s; });
  }
  // gate = silu(gate) * up
  void silu_mul(const Tensor& gate, const Tensor& up) override {
    each(gate, [&](float& g, int64_t r, int64_t c) {
      const double x = g;
      g = static_cast<float>(x / (1.0 + std::exp(-x)) * f32(up, r)[c]);
    });
  }
  // gate = gelu(gate) * up, GELU's tanh form (the one GGUF models with GeGLU are trained with).
  void gelu_mul(const Tensor& gate, const Tensor& up) override {
    each(gate, [&](float& g, int64_t r, int64_t c) {
      const double x = g;
      const double k = std::sqrt(2.0 / M_PI);
      g = static_cast<float>(0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x))) *
                             f32(up, r)[c]);
    });
  }
  // Pair i of position p turns by p * freq_scale * base^(-2i/n_rot) / factor_i; the cache row
  // holds (cos, sin) of every pair.
  void rope_cache(const RopeConfig& rope, const Tensor& pos, const Tensor& cs) override {
    const auto* p = static_cast<const int32_t*>(pos.host());
    const float* factors = rope.freq_factors.empty() ? nullptr : f32(rope.freq_factors, 0);
    for (int64_t t = 0; t < cs.rows; ++t) {
      float* row = f32(cs, t);
      for (int i = 0; i < rope.n_rot / 2; ++i) {
        const double inv_freq =
            std::pow(static_cast<double>(rope.freq_base), -2.0 * i / rope.n_rot) /
            (factors != nullptr ? factors[i] : 1.0);
        const double a = static_cast<double>(p[t]) * rope.freq_scale * inv_freq;
        row[2 * i] = static_cast<float>(std::cos(a));
        row[2 * i + 1] = static_cast<float>(std::sin(a));
      }
    }
  }
  // Rotates pair i of every head: dims (2i, 2i+1), or (i, i + n_rot/2) in the NeoX layout.
  void rope(const RopeConfig& rope, const Tensor& cs, const Tensor& x, int n_heads,
            int head_dim) override {
    const int half = rope.n_rot / 2;
    for (int64_t t = 0; t < x.rows; ++t) {
      const float* row = f32(cs, t);
      for (int h = 0; h < n_heads; ++h) {
        float* v = f32(x, t) + static_cast<int64_t>(h) * head_dim;
        for (int i = 0; i < half; ++i) {
          const int a = rope.neox ? i : 2 * i;
          const int b = rope.neox ? i + half : 2 * i + 1;
          const double c = row[2 * i], s = row[2 * i + 1];
          const double x0 = v[a], x1 = v[b];
          v[a] = static_cast<float>(x0 * c - x1 * s);
          v[b] = static_cast<float>(x0 * s + x1 * c);
        }
      }
    }
  }
  // x = cap * tanh(x / cap)
  void softcap(const Tensor& x, float cap) override {
    each(x, [&](float& v, int64_t, int64_t) {
      v = static_cast<float>(cap * std::tanh(static_cast<double>(v) / cap));
    });
  }

 private:
  class Buffer final : public DeviceBuffer {
   public:
    Buffer(uint64_t backend, size_t bytes)
        : DeviceBuffer(backend, bytes, zeroed((bytes + 63) / 64 * 64 + 64)) {}
    ~Buffer() override { std::free(host_ptr()); }

   private:
    static void* zeroed(size_t n) {  // 64-byte aligned, as the host KV kernels may assume
      void* p = std::aligned_alloc(64, n);
      if (p != nullptr) std::memset(p, 0, n);
      return p;
    }
  };

  static const uint8_t* bytes(const Tensor& t) { return static_cast<const uint8_t*>(t.host()); }
  static float* f32(const Tensor& t, int64_t row) {
    return reinterpret_cast<float*>(static_cast<uint8_t*>(t.host()) +
                                    static_cast<size_t>(row) * t.row_bytes);
  }
  template <class Fn>
  static void each(const Tensor& x, Fn&& fn) {
    for (int64_t r = 0; r < x.rows; ++r) {
      float* p = f32(x, r);
      for (int64_t c = 0; c < x.cols; ++c) fn(p[c], r, c);
    }
  }

  ThreadPool pool_;
};

}  // namespace bie::test
