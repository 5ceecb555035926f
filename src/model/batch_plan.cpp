#include "model/batch_plan.h"

#include <fmt/format.h>

#include <algorithm>

namespace bie::model_loader {

void BatchPlan::add_rows(int64_t row0, int64_t n, MatmulPath path) {
  if (n <= 0) return;
  if (!segments_.empty() && segments_.back().path == path &&
      segments_.back().row0 + segments_.back().n == row0) {
    segments_.back().n += n;
  } else {
    segments_.push_back({row0, n, path});
  }
}

Status BatchPlan::prepare(std::span<const BatchSequence> seqs, int32_t n_vocab, int32_t max_batch) {
  int64_t n = 0;
  for (const BatchSequence& bs : seqs) {
    if (bs.kv == nullptr || bs.tokens.empty()) return Error{"forward() called with no tokens"};
    n += static_cast<int64_t>(bs.tokens.size());
    for (int32_t t : bs.tokens) {
      if (t < 0 || t >= n_vocab) {
        return Error{fmt::format("token id {} is outside the vocabulary [0, {})", t, n_vocab)};
      }
    }
    if (!bs.kv->can_append(static_cast<int64_t>(bs.tokens.size()))) {
      // The cache's own message (a failed append changes nothing).
      Status st = bs.kv->append(static_cast<int64_t>(bs.tokens.size()));
      return st ? Error{fmt::format("KV cache cannot take {} more tokens", bs.tokens.size())} : st;
    }
  }
  if (n == 0) return Error{"forward() called with no tokens"};
  if (n > max_batch) {
    return Error{fmt::format("batch of {} tokens exceeds the workspace of {}", n, max_batch)};
  }
  const auto n_seq = seqs.size();
  seq_row_.resize(n_seq);
  seq_pos_.resize(n_seq);
  tok_.resize(static_cast<size_t>(n));
  pos_.resize(static_cast<size_t>(n));
  pos32_.resize(static_cast<size_t>(n));
  out_rows_.clear();
  out_paths_.clear();
  segments_.clear();
  int64_t row = 0;
  for (size_t s = 0; s < n_seq; ++s) {
    const BatchSequence& bs = seqs[s];
    const auto ns = static_cast<int64_t>(bs.tokens.size());
    seq_row_[s] = row;
    seq_pos_[s] = bs.kv->n_tokens();
    // Tokens [0, np) on the prompt path, the rest on the decode path (or all on bs.path).
    const int64_t np = bs.decode_from < 0 ? ns : std::min(bs.decode_from, ns);
    const MatmulPath first = bs.decode_from < 0 ? bs.path : MatmulPath::kPrefill;
    add_rows(row, np, first);
    add_rows(row + np, ns - np, MatmulPath::kDecode);
    for (int64_t i = 0; i < ns; ++i) {
      tok_[static_cast<size_t>(row + i)] = bs.tokens[static_cast<size_t>(i)];
      pos_[static_cast<size_t>(row + i)] = seq_pos_[s] + i;
      pos32_[static_cast<size_t>(row + i)] = static_cast<int32_t>(seq_pos_[s] + i);
      if (bs.logits == BatchSequence::Logits::kAll ||
          (bs.logits == BatchSequence::Logits::kLast && i == ns - 1)) {
        out_rows_.push_back(row + i);
        out_paths_.push_back(i < np ? first : MatmulPath::kDecode);
      }
    }
    row += ns;
  }
  for (size_t s = 0; s < n_seq; ++s) {
    if (Status st = seqs[s].kv->append(static_cast<int64_t>(seqs[s].tokens.size())); !st) {
      return st;  // unreachable after can_append
    }
  }
  return {};
}

void BatchPlan::mm(Backend& be, const Tensor& w, const Tensor& x, const Tensor& y) const {
  for (const Segment& sg : segments_) {
    be.matmul(w, x.slice_rows(sg.row0, sg.n), y.slice_rows(sg.row0, sg.n), sg.path);
  }
}

void BatchPlan::mm_out(Backend& be, const Tensor& w, const Tensor& xn, const Tensor& logits) const {
  const auto n_out = static_cast<int64_t>(out_rows_.size());
  // Runs of equal paths in one call.
  for (int64_t i = 0; i < n_out;) {
    const MatmulPath path = out_paths_[static_cast<size_t>(i)];
    int64_t j = i + 1;
    while (j < n_out && out_paths_[static_cast<size_t>(j)] == path) ++j;
    be.matmul(w, xn.slice_rows(i, j - i), logits.slice_rows(i, j - i), path);
    i = j;
  }
}

}  // namespace bie::model_loader
