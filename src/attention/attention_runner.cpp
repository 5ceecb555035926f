#include "bie/attention/attention_runner.h"

#include <algorithm>
#include <limits>
#include <memory>

namespace bie::attention {

namespace {

// Whether b's blocks are read the same way as the group's a: the same pools of the same backend,
// the same layer of their group.
bool same_pools(const kv::PagedKvLayer& a, const kv::PagedKvLayer& b) {
  return a.backend == b.backend && a.pools.data() == b.pools.data() &&
         a.pools.size() == b.pools.size() && a.layer_in_group == b.layer_in_group &&
         a.n_layers_in_group == b.n_layers_in_group && a.n_head_kv == b.n_head_kv &&
         a.head_dim == b.head_dim && a.block_size == b.block_size && a.rotate_keys == b.rotate_keys;
}

}  // namespace

Status AttentionRunner::run(std::span<const AttnSequence> seqs, int il, const Tensor& q,
                            const Tensor& out, int n_head, float scale, int64_t window,
                            Backend& backend) {
  query_start_.clear();
  for (const AttnSequence& s : seqs) {
    const std::optional<kv::PagedKvLayer> layer = s.kv->paged_layer(il, s.pos0 + s.n);
    const int64_t group_end =
        query_start_.empty() ? 0 : group_row0_ + static_cast<int64_t>(query_start_.back());
    const bool joins =
        layer && !query_start_.empty() && same_pools(group_, *layer) && s.row0 == group_end;
    if (!joins && !query_start_.empty()) {
      if (Status st = flush(q, out, n_head, scale, window, backend); !st) return st;
    }
    if (!layer) {  // a cache that attends itself
      if (Status st = s.kv->attention(il, s.pos0, q.slice_rows(s.row0, s.n), n_head, scale,
                                      out.slice_rows(s.row0, s.n), backend, window);
          !st) {
        return st;
      }
      continue;
    }
    if (query_start_.empty()) {  // a new group
      group_ = *layer;
      group_row0_ = s.row0;
      query_start_.assign(1, 0);
      q_pos0_.clear();
      table_start_.assign(1, 0);
      table_.clear();
    }
    // Copied now: the span is the cache's buffer, valid until its next call.
    table_.insert(table_.end(), layer->blocks.begin(), layer->blocks.end());
    table_start_.push_back(static_cast<int32_t>(table_.size()));
    q_pos0_.push_back(s.pos0);
    query_start_.push_back(query_start_.back() + static_cast<int32_t>(s.n));
  }
  if (query_start_.empty()) return {};
  return flush(q, out, n_head, scale, window, backend);
}

Status AttentionRunner::flush(const Tensor& q, const Tensor& out, int n_head, float scale,
                              int64_t window, Backend& backend) {
  const int64_t rows = query_start_.back();
  AttnMetadata m;
  m.q = q.slice_rows(group_row0_, rows);
  m.out = out.slice_rows(group_row0_, rows);
  m.layer_in_group = group_.layer_in_group;
  m.n_layers_in_group = group_.n_layers_in_group;
  m.n_head = n_head;
  m.n_head_kv = group_.n_head_kv;
  m.head_dim = group_.head_dim;
  m.block_size = group_.block_size;
  m.scale = scale;
  m.window = window;
  m.rotate_keys = group_.rotate_keys;
  m.pools = group_.pools;
  m.query_start = query_start_;
  m.q_pos0 = q_pos0_;
  m.block_table_start = table_start_;
  m.block_table = table_;
  if (group_.backend != &backend) backend.synchronize();
  const Status st = group_.backend->paged_attention(m);
  query_start_.clear();
  return st;
}

void attend(KvCache& kv, int il, int64_t pos0, int64_t n, const float* q, int n_head, float scale,
            float* out, Backend& backend, int64_t window) {
  const int64_t q_dim = static_cast<int64_t>(n_head) * kv.geometry().head_dim;
  const std::optional<kv::PagedKvLayer> layer = kv.paged_layer(il, pos0 + n);
  if (!layer) {
    kv.attend(il, pos0, n, q, n_head, scale, out, backend, window);
    return;
  }
  Backend& be = *layer->backend;
  const size_t bytes = static_cast<size_t>(n * q_dim) * sizeof(float);
  auto qb = be.alloc(bytes);
  auto ob = be.alloc(bytes);
  Status st = !qb ? Status{Error{qb.error()}} : !ob ? Status{Error{ob.error()}} : Status{};
  if (st) {
    const Tensor qt = tensor_of(**qb, quant::GgmlType::F32, n, q_dim);
    const Tensor ot = tensor_of(**ob, quant::GgmlType::F32, n, q_dim);
    be.upload(qt, q);
    AttentionRunner runner;
    const AttnSequence seq{&kv, 0, n, pos0};
    st = runner.run({&seq, 1}, il, qt, ot, n_head, scale, window, be);
    if (st) be.download(ot, out);
    if (st) st = be.status();
  }
  if (!st) std::fill(out, out + n * q_dim, std::numeric_limits<float>::quiet_NaN());
}

}  // namespace bie::attention
