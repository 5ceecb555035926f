// CpuBackend: the Backend on this machine's cores. Owns the compute ThreadPool and the matmul
// scratch; buffers are 64-byte aligned host memory, weights are views of the mmapped file. Where
// the active ISA has kernels for a repacked layout (AVX-512: Q4_K and Q6_K), a weight matrix is
// repacked (pack_weight, the file's size) when the model offers it (prepare_weight, at bind) or
// at its first matmul, and the view releases the matrix's pages of the file: the weights stay
// held once, and every later matmul reads the copy. Every
// operation runs to completion before it returns (synchronize() is a no-op).
// Row-wise operations fan out over the pool when they have enough rows, the others run inline.
// The KV data-path operations are not implemented here: the CPU KV storage executes them on its
// host pools in kv/ (Backend::supports_paged_kv() is false).
#pragma once

#include <memory>

#include "bie/backend/backend.h"
#include "bie/backend/matmul.h"
#include "bie/backend/thread_pool.h"

namespace bie {

class CpuBackend final : public Backend {
 public:
  // n_threads <= 0: default_thread_count().
  explicit CpuBackend(int n_threads = 0);
  ~CpuBackend() override;

  [[nodiscard]] std::string name() const override { return "cpu"; }
  [[nodiscard]] ThreadPool& host_threads() override { return pool_; }

  [[nodiscard]] Result<std::unique_ptr<DeviceBuffer>> alloc(size_t bytes) override;
  [[nodiscard]] Result<std::unique_ptr<DeviceBuffer>> upload_weights(
      std::span<const uint8_t> bytes) override;
  // Repacks w now (see above) rather than at its first matmul.
  void prepare_weight(const Tensor& w) override;
  void upload(const Tensor& dst, const void* src) override;
  void download(const Tensor& src, void* dst) override;
  void synchronize() override {}

  void matmul(const Tensor& w, const Tensor& x, const Tensor& y, MatmulPath path) override;
  void get_rows(const Tensor& table, const Tensor& ids, const Tensor& out, float scale) override;
  void rms_norm(const Tensor& x, const Tensor& w, const Tensor& out, float eps) override;
  void add(const Tensor& x, const Tensor& y) override;
  void scale(const Tensor& x, float s) override;
  void silu_mul(const Tensor& gate, const Tensor& up) override;
  void gelu_mul(const Tensor& gate, const Tensor& up) override;
  void rope_cache(const RopeConfig& rope, const Tensor& pos, const Tensor& cs) override;
  void rope(const RopeConfig& rope, const Tensor& cs, const Tensor& x, int n_heads,
            int head_dim) override;
  void softcap(const Tensor& x, float cap) override;

 private:
  // Runs fn(row) for every row in [0, rows), over the pool when the job is large enough.
  template <class Fn>
  void for_rows(int64_t rows, int64_t cols, Fn&& fn);
  // The view of weight matrix w that matmul reads: its repacked copy where it has one.
  WeightView weight_view(const Tensor& w);

  ThreadPool pool_;
  MatmulScratch scratch_;
};

}  // namespace bie
