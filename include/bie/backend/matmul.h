// CPU matrix multiplication of a (possibly quantised) weight matrix with fp32 activations.
// matmul() owns nothing; MatmulScratch owns the reusable buffers (one per caller thread: it is
// not thread-safe, and must not be shared by concurrent matmul calls).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "bie/backend/matmul_path.h"
#include "bie/backend/thread_pool.h"
#include "bie/quant/types.h"

namespace bie {

// A weight matrix as stored in GGUF: n_out rows of n_in values; row r starts at
// data + r * row_bytes (row_bytes >= quant::row_size(type, n_in)). `packed`, when set, is the same
// matrix repacked by pack_weight; matmul reads it instead of `data` where the active ISA has the
// kernels for it (and `data` otherwise).
struct WeightView {
  quant::GgmlType type;
  int64_t n_in;
  int64_t n_out;
  const void* data;
  size_t row_bytes;
  const void* packed = nullptr;
};

// Buffers for quantised activations and per-thread weight panels. They grow to the largest
// shape seen and are reused, so a warm matmul allocates nothing.
class MatmulScratch {
 public:
  MatmulScratch() = default;
  MatmulScratch(const MatmulScratch&) = delete;
  MatmulScratch& operator=(const MatmulScratch&) = delete;

  // 64-byte aligned, at least `bytes` long; contents unspecified. Pointers stay valid until
  // the next call that grows the same buffer.
  [[nodiscard]] void* activations(size_t bytes);
  [[nodiscard]] void* panel(int thread, size_t bytes);

  // Grows every buffer first (so the parallel part never allocates).
  void reserve(size_t activation_bytes, int n_threads, size_t panel_bytes);

 private:
  struct Buffer {
    struct Free {
      void operator()(void* p) const;
    };
    std::unique_ptr<uint8_t, Free> data;
    size_t size = 0;
    void* ensure(size_t bytes);
  };
  Buffer activations_;
  std::vector<Buffer> panels_;
};

// y[t * n_out + r] = sum_k W[r][k] * x[t * n_in + k] for t < n_tokens; x and y fp32 row-major.
// Activations are first converted to the weight type's vec_dot_type (as ggml does), so results
// track llama.cpp's. note: call only if quant::is_supported(w.type), n_in is a multiple of the
// type's block size, and x/y do not overlap. `path`: see MatmulPath.

void matmul(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool,
            MatmulScratch& scratch, MatmulPath path = MatmulPath::kAuto);

// Weights repacked once for the active ISA's kernels (AVX-512: Q4_K and Q6_K in 16-row panels of
// their own bits). matmul on a repacked matrix gives every token the prefill tiles' bits, for any
// number of tokens and either path, and reads the weights once per call whatever the batch.
// packed_weight_bytes: 0 where there is no packed layout (type, ISA, shape), else the bytes
// pack_weight writes (64-byte aligned dst): the matrix's own size plus at most 63 bytes per 16
// rows.
[[nodiscard]] size_t packed_weight_bytes(const WeightView& w);
void pack_weight(const WeightView& w, void* dst, ThreadPool& pool);

}  // namespace bie
