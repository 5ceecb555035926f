// TEMPORARY naive matmul (lead's stand-in until the quant branch's tiled kernels land).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "bie/backend/thread_pool.h"
#include "bie/quant/types.h"

namespace bie {

struct WeightView {
  quant::GgmlType type = quant::GgmlType::F32;
  int64_t n_in = 0;
  int64_t n_out = 0;
  const void* data = nullptr;
  size_t row_bytes = 0;
};

class MatmulScratch {
 public:
  std::vector<uint8_t> act;
};

void matmul(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool,
            MatmulScratch& scratch);

}  // namespace bie
