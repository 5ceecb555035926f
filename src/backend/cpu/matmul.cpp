#include "bie/backend/matmul.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstdlib>
#include <new>

#include "backend/cpu/matmul_kernels.h"
#include "bie/common/cpu_features.h"
#include "bie/quant/traits.h"

namespace bie {

namespace {

constexpr size_t kAlign = 64;
// Below this many tokens the tiles' repacking costs more than it saves: dot row by row.
constexpr int64_t kMinTileTokens = 2;
// Rows per inner chunk of the row-by-row path (their weights stay in L1 across the tokens).
constexpr int64_t kRowChunk = 16;
// Rows per work chunk of the tiled path: a multiple of every tile plan's rows_per_panel (4, 8,
// 16) and a whole cache line of each token's y.
constexpr int64_t kTileChunkRows = 16;

struct RowDotJob {
  const WeightView* w;
  const quant::TypeTraits* tr;
  const uint8_t* acts;
  size_t act_row_bytes;
  int64_t n_tokens;
  float* y;
};

void row_dot_range(const RowDotJob& job, int64_t r0, int64_t r1) {
  const WeightView& w = *job.w;
  const auto* base = static_cast<const uint8_t*>(w.data);
  for (int64_t c0 = r0; c0 < r1; c0 += kRowChunk) {
    const int64_t c1 = std::min(r1, c0 + kRowChunk);
    for (int64_t t = 0; t < job.n_tokens; ++t) {
      const uint8_t* a = job.acts + static_cast<size_t>(t) * job.act_row_bytes;
      float* yt = job.y + t * w.n_out;
      for (int64_t r = c0; r < c1; ++r) {
        yt[r] = job.tr->vec_dot(w.n_in, base + static_cast<size_t>(r) * w.row_bytes, a);
      }
    }
  }
}

// Even split of [0, n) in units of `unit` among n_threads; returns this thread's [begin, end).
std::pair<int64_t, int64_t> split(int64_t n, int64_t unit, int ith, int nth) {
  const int64_t units = (n + unit - 1) / unit;
  const int64_t b = units * ith / nth * unit;
  const int64_t e = std::min(n, units * (ith + 1) / nth * unit);
  return {std::min(b, n), e};
}

// Rows per work chunk of the matvec path: about kMatvecChunkBytes of weights (big enough that
// the prefetcher streams, small enough to rebalance when one thread is preempted), at least 4
// chunks per thread, in units of kRowChunk (whole cache lines of y).
constexpr size_t kMatvecChunkBytes = 512 * 1024;
int64_t matvec_chunk_rows(const WeightView& w, int n_threads) {
  const int64_t by_bytes = static_cast<int64_t>(kMatvecChunkBytes / w.row_bytes);
  const int64_t by_count = (w.n_out + 4 * n_threads - 1) / (4 * n_threads);
  const int64_t rows = std::max<int64_t>(kRowChunk, std::min(by_bytes, by_count));
  return (rows + kRowChunk - 1) / kRowChunk * kRowChunk;
}

// fn(t0, t1) over the tokens [0, n): inline when n <= inline_max (a few rows are not worth
// waking the pool), else split evenly over the pool's threads.
template <class Fn>
void for_token_ranges(ThreadPool& pool, int64_t n, int64_t inline_max, const Fn& fn) {
  if (n <= inline_max) {
    fn(int64_t{0}, n);
    return;
  }
  const Fn* f = &fn;
  pool.run_on_all([f, n](int ith, int nt) {
    const auto [t0, t1] = split(n, 1, ith, nt);
    if (t0 < t1) (*f)(t0, t1);
  });
}

// fn(r0, r1, part) over the rows [0, n_rows) in chunks of `chunk` rows that the threads take as
// they come free (part: the thread's index), so a thread slowed by another process does not hold
// the call back. Which thread computes a row does not change its bits.
template <class Fn>
void for_row_chunks(ThreadPool& pool, int64_t n_rows, int64_t chunk, const Fn& fn) {
  struct State {
    std::atomic<int64_t> next{0};
    int64_t n_rows;
    int64_t chunk;
    const Fn* fn;
  } st{{0}, n_rows, chunk, &fn};
  State* sp = &st;
  pool.run_on_all([sp](int part, int) {
    for (;;) {
      const int64_t r0 = sp->next.fetch_add(sp->chunk, std::memory_order_relaxed);
      if (r0 >= sp->n_rows) break;
      (*sp->fn)(r0, std::min(sp->n_rows, r0 + sp->chunk), part);
    }
  });
}

}  // namespace

void MatmulScratch::Buffer::Free::operator()(void* p) const {
  ::operator delete(p, std::align_val_t(kAlign));
}

void* MatmulScratch::Buffer::ensure(size_t bytes) {
  if (bytes > size || !data) {
    const size_t n = std::max<size_t>((bytes + kAlign - 1) / kAlign * kAlign, kAlign);
    data.reset(static_cast<uint8_t*>(::operator new(n, std::align_val_t(kAlign))));
    size = n;
  }
  return data.get();
}

void* MatmulScratch::activations(size_t bytes) {
  return activations_.ensure(bytes);
}

void* MatmulScratch::panel(int thread, size_t bytes) {
  if (static_cast<size_t>(thread) >= panels_.size())
    panels_.resize(static_cast<size_t>(thread) + 1);
  return panels_[static_cast<size_t>(thread)].ensure(bytes);
}

void MatmulScratch::reserve(size_t activation_bytes, int n_threads, size_t panel_bytes) {
  (void)activations(activation_bytes);
  if (panel_bytes > 0) {
    for (int i = 0; i < n_threads; ++i) (void)panel(i, panel_bytes);
  }
}

namespace {

// The matrix-vector kernels of the active ISA for a weight type (plan.supported is false when
// it has none): AVX-512 where the machine has it and the type has such kernels, else AVX2.
struct MatvecOps {
  cpu::MatvecPlan plan;
  void (*prepare)(quant::GgmlType, int64_t, const float*, uint8_t*) = nullptr;
  void (*rows)(const WeightView&, const uint8_t*, size_t, int64_t, int64_t, int64_t,
               float*) = nullptr;
};

MatvecOps matvec_ops(const WeightView& w) {
  if (has_avx512()) {
    const cpu::MatvecPlan p = cpu::avx512_matvec_plan(w.type, w.n_in);
    if (p.supported) return {p, cpu::avx512_matvec_prepare, cpu::avx512_matvec_rows};
  }
  if (has_avx2()) {
    const cpu::MatvecPlan p = cpu::avx2_matvec_plan(w.type, w.n_in);
    if (p.supported) return {p, cpu::avx2_matvec_prepare, cpu::avx2_matvec_rows};
  }
  return {};
}

// Matrix-vector kernels over any number of tokens, the weights read once per call: threads take
// chunks of rows, and each chunk (small enough to stay in L2) is dotted with every group of up
// to plan.max_tokens tokens before the next chunk is read. A token's sums do not depend on its
// group (the kernels build each (row, token) sum in one fixed order), so its bits do not depend
// on the batch. False if the type has no matvec kernels.
bool matvec_path(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool,
                 MatmulScratch& scratch) {
  const MatvecOps ops = matvec_ops(w);
  if (!ops.plan.supported) return false;
  const size_t arb = ops.plan.act_row_bytes;
  const int nth = pool.size();
  auto* acts = static_cast<uint8_t*>(scratch.activations(arb * static_cast<size_t>(n_tokens)));
  for_token_ranges(pool, n_tokens, cpu::kMaxMatvecTokens, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      ops.prepare(w.type, w.n_in, x + t * w.n_in, acts + static_cast<size_t>(t) * arb);
    }
  });
  const int64_t group = ops.plan.max_tokens;
  for_row_chunks(pool, w.n_out, matvec_chunk_rows(w, nth), [&](int64_t r0, int64_t r1, int) {
    for (int64_t t = 0; t < n_tokens; t += group) {
      ops.rows(w, acts + static_cast<size_t>(t) * arb, arb, std::min(group, n_tokens - t), r0, r1,
               y + t * w.n_out);
    }
  });
  return true;
}

// Tiled kernels (weight panels repacked per call). False if the type has none.
bool tile_path(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool,
               MatmulScratch& scratch) {
  if (!has_avx2()) return false;
  // AVX-512 tiles where the machine and the type have them (the AVX2 tiles' bits, faster).
  const bool wide = has_avx512() && cpu::avx512_tile_plan(w.type, w.n_in).supported;
  const cpu::TilePlan plan =
      wide ? cpu::avx512_tile_plan(w.type, w.n_in) : cpu::avx2_tile_plan(w.type, w.n_in);
  if (!plan.supported) return false;
  assert(kTileChunkRows % plan.rows_per_panel == 0);
  const int nth = pool.size();
  scratch.reserve(plan.act_row_bytes * static_cast<size_t>(n_tokens), nth, plan.panel_bytes);
  auto* acts = static_cast<uint8_t*>(scratch.activations(0));
  for_token_ranges(pool, n_tokens, 0, [&](int64_t t0, int64_t t1) {
    if (wide) {
      cpu::avx512_prepare_acts(w.type, w.n_in, x, t0, t1, acts);
    } else {
      cpu::avx2_prepare_acts(w.type, w.n_in, x, t0, t1, acts);
    }
  });
  // A chunk is whole panels and whole 64-byte lines of y.
  for_row_chunks(pool, w.n_out, kTileChunkRows, [&](int64_t r0, int64_t r1, int part) {
    auto* panel = static_cast<uint8_t*>(scratch.panel(part, 0));
    if (wide) {
      cpu::avx512_tile_rows(w, acts, plan.act_row_bytes, n_tokens, r0, r1, y, panel);
    } else {
      cpu::avx2_tile_rows(w, acts, plan.act_row_bytes, n_tokens, r0, r1, y, panel);
    }
  });
  return true;
}

// Kernels over a repacked matrix (w.packed): activations as the AVX-512 tiles prepare them, then
// threads take chunks of whole panels as they come free. A few tokens take chunks of about
// kMatvecChunkBytes (the weights stream, as on the matvec path); more take one panel at a time
// (each panel dotted with every token before the next is read). False where the active ISA has
// no kernels for the packed layout.
bool packed_path(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool,
                 MatmulScratch& scratch) {
  if (w.packed == nullptr || !has_avx512()) return false;
  const cpu::TilePlan plan = cpu::avx512_tile_plan(w.type, w.n_in);
  assert(plan.supported);
  const size_t arb = plan.act_row_bytes;
  const bool expand = n_tokens > cpu::kPackedInPlaceTokens;
  scratch.reserve(arb * static_cast<size_t>(n_tokens), pool.size(), expand ? plan.panel_bytes : 0);
  auto* acts = static_cast<uint8_t*>(scratch.activations(0));
  for_token_ranges(pool, n_tokens, cpu::kMaxMatvecTokens, [&](int64_t t0, int64_t t1) {
    cpu::avx512_prepare_acts(w.type, w.n_in, x, t0, t1, acts);
  });
  const int64_t chunk = n_tokens <= cpu::kMaxMatvecTokensAvx512
                            ? matvec_chunk_rows(w, pool.size())
                            : int64_t{cpu::kPackedPanelRows};
  static_assert(kRowChunk % cpu::kPackedPanelRows == 0);
  for_row_chunks(pool, w.n_out, chunk, [&](int64_t r0, int64_t r1, int part) {
    auto* panel = expand ? static_cast<uint8_t*>(scratch.panel(part, 0)) : nullptr;
    cpu::avx512_packed_rows(w, acts, arb, n_tokens, r0, r1, y, panel);
  });
  return true;
}

// Row-by-row path: activations in vec_dot_type, one vec_dot per (row, token). Every token's
// sums are independent of n_tokens.
void row_dot_path(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool,
                  MatmulScratch& scratch) {
  const quant::TypeTraits* tr = quant::traits(w.type);
  const quant::TypeTraits* at = quant::traits(tr->vec_dot_type);
  const size_t act_row_bytes = quant::row_size(tr->vec_dot_type, w.n_in);
  const uint8_t* acts = reinterpret_cast<const uint8_t*>(x);
  if (tr->vec_dot_type != quant::GgmlType::F32) {
    auto* buf =
        static_cast<uint8_t*>(scratch.activations(act_row_bytes * static_cast<size_t>(n_tokens)));
    for_token_ranges(pool, n_tokens, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        at->from_float(x + t * w.n_in, buf + static_cast<size_t>(t) * act_row_bytes, w.n_in);
      }
    });
    acts = buf;
  }
  const RowDotJob job{&w, tr, acts, act_row_bytes, n_tokens, y};
  const RowDotJob* jp = &job;
  pool.run_on_all([jp](int ith, int nt) {
    const auto [r0, r1] = split(jp->w->n_out, kRowChunk, ith, nt);
    if (r0 < r1) row_dot_range(*jp, r0, r1);
  });
}

}  // namespace

void matmul(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool,
            MatmulScratch& scratch, MatmulPath path) {
  if (n_tokens <= 0 || w.n_out <= 0) return;
  [[maybe_unused]] const quant::TypeTraits* tr = quant::traits(w.type);
  assert(tr != nullptr && tr->vec_dot != nullptr);
  assert(w.n_in % tr->block_size == 0);
  assert(w.row_bytes >= quant::row_size(w.type, w.n_in));
  if (packed_path(w, x, n_tokens, y, pool, scratch)) return;
  switch (path) {
    case MatmulPath::kDecode:
      if (matvec_path(w, x, n_tokens, y, pool, scratch)) return;
      break;
    case MatmulPath::kPrefill:
      if (tile_path(w, x, n_tokens, y, pool, scratch)) return;
      break;
    case MatmulPath::kAuto:
      if (n_tokens <= cpu::kMaxMatvecTokens && matvec_path(w, x, n_tokens, y, pool, scratch))
        return;
      if (n_tokens >= kMinTileTokens && tile_path(w, x, n_tokens, y, pool, scratch)) return;
      break;
  }
  row_dot_path(w, x, n_tokens, y, pool, scratch);
}

size_t packed_weight_bytes(const WeightView& w) {
  if (!has_avx512() || !cpu::avx512_tile_plan(w.type, w.n_in).supported) return 0;
  return cpu::avx512_packed_bytes(w.type, w.n_in, w.n_out);
}

void pack_weight(const WeightView& w, void* dst, ThreadPool& pool) {
  assert(packed_weight_bytes(w) > 0);
  const int64_t panels = (w.n_out + cpu::kPackedPanelRows - 1) / cpu::kPackedPanelRows;
  auto* out = static_cast<uint8_t*>(dst);
  pool.parallel_for(panels, [&](int64_t p0, int64_t p1, int) {
    cpu::avx512_pack_panels(w, p0, p1, out);
  });
}

}  // namespace bie
