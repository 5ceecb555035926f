// CpuBackend: the Backend on this machine's cores. Owns the compute ThreadPool and the matmul
// scratch; buffers are 64-byte aligned host memory, weights are views of the mmapped file. Where
// the active ISA has kernels for a repacked layout (AVX-512: Q4_K, Q6_K and the 32-value
// formats), a weight matrix is repacked (pack_weight, the file's size) when the model offers it
// (prepare_weight, at bind) or at its first matmul, and the view releases the matrix's pages of
// the file: the weights stay held once, and every later matmul reads the copy. Every operation
// runs to completion before it returns (synchronize() is a no-op).
// Row-wise operations fan out over the pool when they have enough rows, the others run inline.
// KV pools are reserved address space (reserve: PROT_NONE, MAP_NORESERVE) committed block by
// block as the pools fill; the KV data path (cpu_kv.cpp) runs the KV format codecs
// (kv_format.h) and the paged attention kernels (attention_runner.h) on them.
#pragma once

#include <memory>

#include "backend/cpu/paged_attention_runner.h"
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

  // ---- KV data path (cpu_kv.cpp) ----------------------------------------------------------------
  [[nodiscard]] bool reserves_on_demand() const override { return true; }
  [[nodiscard]] Result<std::unique_ptr<DeviceBuffer>> reserve(size_t bytes) override;
  [[nodiscard]] bool supports_paged_kv() const override { return true; }
  // Every format with kernels (kv::kv_format_supported; the pool's group is checked by the store).
  [[nodiscard]] bool supports_kv_types(uint8_t k_type, uint8_t v_type) const override;
  [[nodiscard]] Status paged_attention(const AttnMetadata& meta) override;
  [[nodiscard]] Status kv_write(const KvWriteMetadata& meta) override;
  [[nodiscard]] Status copy_blocks(std::span<const KvPoolDesc> pools,
                                   std::span<const KvBlockCopy> copies) override;
  [[nodiscard]] Status quantise_blocks(std::span<const KvPoolDesc> pools,
                                       std::span<const KvBlockQuantise> moves,
                                       int n_layers_in_group, int n_head_kv, int head_dim,
                                       int block_size) override;

 private:
  // Runs fn(row) for every row in [0, rows), over the pool when the job is large enough.
  template <class Fn>
  void for_rows(int64_t rows, int64_t cols, Fn&& fn);
  // The view of weight matrix w that matmul reads: its repacked copy where it has one.
  WeightView weight_view(const Tensor& w);

  ThreadPool pool_;
  MatmulScratch scratch_;
  attention::PagedAttentionRunner attention_;
  std::vector<kv::KvBlockView> pool_views_;  // per pool of a paged_attention call (tiles unset)
  std::vector<kv::KvBlockView> views_;       // one sequence's blocks, rebuilt per paged_attention
  std::vector<float> rows_;  // [block_size, head_dim] staging of kv_write / quantise
};

}  // namespace bie
