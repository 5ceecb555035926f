#include "bie/backend/matmul.h"

#include "bie/quant/traits.h"

namespace bie {

void matmul(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool,
            MatmulScratch& scratch) {
  const quant::TypeTraits* tr = quant::traits(w.type);
  const quant::TypeTraits* at = quant::traits(tr->vec_dot_type);
  const size_t arow = quant::row_size(tr->vec_dot_type, w.n_in);
  scratch.act.resize(arow * static_cast<size_t>(n_tokens));
  for (int64_t t = 0; t < n_tokens; ++t) at->from_float(x + t * w.n_in, scratch.act.data() + t * arow, w.n_in);
  pool.parallel_for(w.n_out, [&](int64_t b, int64_t e, int) {
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t r = b; r < e; ++r) {
        y[t * w.n_out + r] = tr->vec_dot(w.n_in, static_cast<const uint8_t*>(w.data) + r * w.row_bytes,
                                         scratch.act.data() + t * arow);
      }
    }
  }, 16);
}

}  // namespace bie
