#include "bie/kv/sequence_kv.h"

#include <fmt/format.h>

namespace bie {

bool SequenceKv::can_append(int64_t n) const {
  const kv::BlockManager& m = store_.coordinator().manager();
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

void SequenceKv::finish_pass() {
  if (migrate_after_pass_ && (store_.layout().mixed() || store_.coordinator().has_local_groups())) {
    // A failure (body pool full) leaves the exits FP16: correct data, retried after the next pass.
    (void)store_.finish_pass(seq_, computed_);
  }
}

Status SequenceKv::truncate(int64_t n) {
  if (n >= computed_) return {};
  return Error{"SequenceKv: rollback goes through the scheduler"};
}

}  // namespace bie
