// BatchPlan: the bookkeeping of one forward_batch() pass that every architecture shares — checks
// the sequences, appends their tokens to their caches, lays their tokens out as activation rows
// (with each row's position and matmul kernel path) and picks the rows that get logits. The
// architectures own only the arithmetic. Not thread-safe (one per model, engine thread).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "bie/backend/backend.h"
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
  // Every row's token id and position (I32, for the backend's id and position tensors).
  [[nodiscard]] const std::vector<int32_t>& tokens() const { return tok_; }
  [[nodiscard]] const std::vector<int32_t>& positions() const { return pos32_; }
  // Sequence s's first activation row and the position of its first token.
  [[nodiscard]] int64_t seq_row(size_t s) const { return seq_row_[s]; }
  [[nodiscard]] int64_t seq_pos(size_t s) const { return seq_pos_[s]; }
  // Rows that get logits, in output order.
  [[nodiscard]] const std::vector<int64_t>& out_rows() const { return out_rows_; }

  // y[rows] = W x[rows] for every row, one matmul per run of rows sharing a kernel path.
  void mm(Backend& be, const Tensor& w, const Tensor& x, const Tensor& y) const;
  // logits[i] = W xn[i] for the i-th logits row (xn holds out_rows().size() rows), each with its
  // token's kernel path.
  void mm_out(Backend& be, const Tensor& w, const Tensor& xn, const Tensor& logits) const;

 private:
  struct Segment {
    int64_t row0, n;
    MatmulPath path;
  };
  void add_rows(int64_t row0, int64_t n, MatmulPath path);

  std::vector<int32_t> tok_;           // [n] token ids of the whole batch
  std::vector<int64_t> pos_;           // [n] position of each token in its sequence
  std::vector<int32_t> pos32_;         // the same as I32
  std::vector<int64_t> seq_row_;       // [n_seq] first activation row of each sequence
  std::vector<int64_t> seq_pos_;       // [n_seq] first position of each sequence
  std::vector<int64_t> out_rows_;      // activation rows that get logits, in output order
  std::vector<MatmulPath> out_paths_;  // the kernel path of each of those rows' tokens
  std::vector<Segment> segments_;      // consecutive rows sharing a matmul path
};

}  // namespace bie::model_loader
