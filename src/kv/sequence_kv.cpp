#include "bie/kv/sequence_kv.h"

#include <fmt/format.h>

#include "bie/backend/thread_pool.h"

namespace bie {

bool SequenceKv::can_append(int64_t n) const {
  const kv::BlockManager& m = store_.manager();
  return n >= 0 && computed_ + n <= capacity_ && m.has_sequence(seq_) &&
         m.num_tokens(seq_) >= computed_ + n;
}

Status SequenceKv::append(int64_t n) {
  if (!can_append(n)) {
    return Error{fmt::format("sequence {}: positions [{}, {}) are not allocated", seq_, computed_,
                             computed_ + n)};
  }
  computed_ += n;
  return {};
}

void SequenceKv::attend(int il, int64_t pos0, int64_t n, const float* q, int n_head, float scale,
                        float* out, Backend& backend, int64_t window) {
  store_.attend(seq_, il, pos0, n, q, n_head, scale, out, backend.host_threads(), window);
  after_attend(il, pos0, n);
}

Status SequenceKv::attention(int il, int64_t pos0, const Tensor& q, int n_head, float scale,
                             const Tensor& out, Backend& backend, int64_t window) {
  if (Status st = store_.attention(seq_, il, pos0, q, n_head, scale, out, backend, window); !st) {
    return st;
  }
  after_attend(il, pos0, q.rows);
  return {};
}

void SequenceKv::after_attend(int il, int64_t pos0, int64_t n) {
  if (migrate_after_pass_ && il == store_.geometry().n_layer - 1 && pos0 + n == computed_ &&
      (store_.layout().mixed() || store_.has_local_groups())) {
    if (Status s = store_.migrate_exits(seq_, computed_); !s) migration_deferred_ = true;
  }
}

Status SequenceKv::truncate(int64_t n) {
  if (n >= computed_) return {};
  return Error{"SequenceKv: rollback goes through the scheduler"};
}

}  // namespace bie
