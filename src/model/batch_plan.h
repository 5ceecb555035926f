// BatchPlan: the bookkeeping of one forward_batch() pass that every architecture shares — checks
// the sequences, appends their tokens to their caches, lays their tokens out as activation rows
// (with each row's position and matmul kernel path) and picks the rows that get logits. The
// architectures own only the arithmetic. Not thread-safe (one per model, engine thread).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "bie/backend/matmul.h"
#include "bie/backend/thread_pool.h"
#include "bie/common/result.h"
#include "bie/model/model.h"

namespace bie::model_loader {

class BatchPlan {
 public:
  // Checks every sequence (tokens in [0, n_vocab), room in its cache, the total within
  // max_batch), then appends each one's tokens to its cache and lays the rows out. On error
  // nothing is appended to any cache.
  [[nodiscard]] Status prepare(std::span<const BatchSequence> seqs, int32_t n_vocab,
                               int32_t max_batch);

  [[nodiscard]] int64_t n_tokens() const { return static_cast<int64_t>(tok_.size()); }
  [[nodiscard]] int32_t token(int64_t row) const { return tok_[static_cast<size_t>(row)]; }
  [[nodiscard]] int64_t pos(int64_t row) const { return pos_[static_cast<size_t>(row)]; }
  // Sequence s's first activation row and the position of its first token.
  [[nodiscard]] int64_t seq_row(size_t s) const { return seq_row_[s]; }
  [[nodiscard]] int64_t seq_pos(size_t s) const { return seq_pos_[s]; }
  // Rows that get logits, in output order.
  [[nodiscard]] const std::vector<int64_t>& out_rows() const { return out_rows_; }

  // y[rows] = W x[rows] for every row, one matmul per run of rows sharing a kernel path.
  void mm(const WeightView& w, const float* x, float* y, ThreadPool& pool,
          MatmulScratch& scratch) const;
  // logits[i] = W xn[i] for the i-th logits row (xn holds out_rows().size() rows), each with its
  // token's kernel path.
  void mm_out(const WeightView& w, const float* xn, float* logits, ThreadPool& pool,
              MatmulScratch& scratch) const;

 private:
  struct Segment {
    int64_t row0, n;
    MatmulPath path;
  };
  void add_rows(int64_t row0, int64_t n, MatmulPath path);

  std::vector<int32_t> tok_;           // [n] token ids of the whole batch
  std::vector<int64_t> pos_;           // [n] position of each token in its sequence
  std::vector<int64_t> seq_row_;       // [n_seq] first activation row of each sequence
  std::vector<int64_t> seq_pos_;       // [n_seq] first position of each sequence
  std::vector<int64_t> out_rows_;      // activation rows that get logits, in output order
  std::vector<MatmulPath> out_paths_;  // the kernel path of each of those rows' tokens
  std::vector<Segment> segments_;      // consecutive rows sharing a matmul path
};

// Runs fn(token_index) for i in [0, n), over the pool when there are enough of them.
template <class Fn>
void for_each_token(ThreadPool& pool, int64_t n, Fn&& fn) {
  if (n < 4) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) fn(i);
  });
}

}  // namespace bie::model_loader
