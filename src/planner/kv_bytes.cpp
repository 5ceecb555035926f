#include "bie/planner/kv_bytes.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>

namespace bie::planner {

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

uint64_t head_token_bytes(const LayerKv& l, KvFormat k, KvFormat v) {
  return static_cast<uint64_t>(l.n_head_kv) *
         (bytes_per_head_token(k, l.head_dim_k) + bytes_per_head_token(v, l.head_dim_v));
}

// Peak over all lengths up to n of a per-length quantity f that satisfies f(m + B) >= f(m): the
// maximum then lies among the last B lengths (docs/planner.md, "Peaks").
template <class F>
auto peak_over_lengths(int64_t n, int block_size, F f) {
  auto best = f(n);
  for (int64_t m = std::max<int64_t>(1, n - block_size + 1); m < n; ++m)
    best = std::max(best, f(m));
  return best;
}

}  // namespace

Status check_kv_layout(const ModelGeometry& g, const KvLayout& layout) {
  if (layout.block_size < 1 || layout.block_size > 4096) {
    return Error{fmt::format("paged block size must be in 1..4096, got {}", layout.block_size)};
  }
  if (layout.sink_tokens < 0 || layout.sink_tokens > (1 << 20)) {
    return Error{fmt::format("sink tokens must be in 0..1048576, got {}", layout.sink_tokens)};
  }
  if (layout.window_tokens < 0 || layout.window_tokens > (1 << 20)) {
    return Error{fmt::format("window tokens must be in 0..1048576, got {}", layout.window_tokens)};
  }
  if (!layout.per_layer.empty() && layout.per_layer.size() != g.layers.size()) {
    return Error{fmt::format("the KV layer map has {} layers, the model {}",
                             layout.per_layer.size(), g.layers.size())};
  }
  for (size_t il = 0; il < g.layers.size(); ++il) {
    const LayerKv& l = g.layers[il];
    const KvLayerFormats b = layout.body(il);
    const std::string where =
        layout.per_layer.empty() ? std::string{} : fmt::format(" (layer {} of the map)", il);
    if (!layout.per_layer.empty() && !uses_fp16_sink_window(b.k) && !uses_fp16_sink_window(b.v)) {
      return Error{fmt::format(
          "KV layer map, layer {}: k={} v={} quantises neither K nor V; a mapped layer keeps at "
          "least one of them in a quantised format (the FP16 sinks and window are kept anyway)",
          il, kv_format_name(b.k), kv_format_name(b.v))};
    }
    for (KvFormat f : {b.k, b.v}) {
      if (is_per_channel(f) && layout.block_size % f.group != 0) {
        return Error{fmt::format("{}{}: its token group must divide the block size {}",
                                 kv_format_name(f), where, layout.block_size)};
      }
    }
    if (auto s = check_kv_format(b.k, l.head_dim_k); !s) {
      return Error{"K cache" + where + ": " + s.error()};
    }
    if (auto s = check_kv_format(b.v, l.head_dim_v); !s) {
      return Error{"V cache" + where + ": " + s.error()};
    }
  }
  return {};
}

bool KvLayout::has_per_channel() const {
  if (per_layer.empty()) return is_per_channel(k) || is_per_channel(v);
  return std::any_of(per_layer.begin(), per_layer.end(), [](const KvLayerFormats& b) {
    return is_per_channel(b.k) || is_per_channel(b.v);
  });
}

int64_t KvLayout::prefill_chunk_cap() const {
  if (!mixed()) return 0;
  const int64_t b = std::max(1, block_size);
  return std::max<int64_t>(b, window_tokens / 2 / b * b);
}

uint64_t kv_bytes_per_token(const ModelGeometry& g, const KvLayout& layout) {
  uint64_t sum = 0;
  for (size_t il = 0; il < g.layers.size(); ++il) {
    const KvLayerFormats b = layout.body(il);
    sum += head_token_bytes(g.layers[il], b.k, b.v);
  }
  return sum;
}

double kv_body_bits_per_value(const ModelGeometry& g, const KvLayout& layout) {
  uint64_t values = 0;
  for (const LayerKv& l : g.layers) {
    values +=
        static_cast<uint64_t>(l.n_head_kv) * static_cast<uint64_t>(l.head_dim_k + l.head_dim_v);
  }
  return values == 0 ? 0.0
                     : 8.0 * static_cast<double>(kv_bytes_per_token(g, layout)) /
                           static_cast<double>(values);
}

uint64_t kv_bytes_per_token(const ModelGeometry& g, KvFormat k, KvFormat v) {
  uint64_t sum = 0;
  for (const LayerKv& l : g.layers) sum += head_token_bytes(l, k, v);
  return sum;
}

uint64_t contiguous_kv_bytes(const ModelGeometry& g, KvFormat k, KvFormat v, int64_t n_ctx,
                             int64_t n_seq) {
  assert(n_ctx >= 0 && n_seq >= 0);
  return kv_bytes_per_token(g, k, v) * static_cast<uint64_t>(n_ctx) * static_cast<uint64_t>(n_seq);
}

uint64_t kv_bytes_unpaged(const ModelGeometry& g, KvFormat k, KvFormat v, int64_t n_tokens) {
  uint64_t sum = 0;
  for (const LayerKv& l : g.layers) {
    const int64_t kept = l.window > 0 ? std::min(n_tokens, l.window) : n_tokens;
    sum += head_token_bytes(l, k, v) * static_cast<uint64_t>(kept);
  }
  return sum;
}

namespace {

// The index in `groups` of the group layer il belongs to (same shape, window and body formats),
// or groups.size().
size_t find_layer_group(const std::vector<KvLayerGroup>& groups, const ModelGeometry& g,
                        const KvLayout& layout, size_t il) {
  const LayerKv& l = g.layers[il];
  const KvLayerFormats b = layout.body(il);
  const auto it = std::find_if(groups.begin(), groups.end(), [&](const KvLayerGroup& grp) {
    return grp.shape == l && grp.body == b;
  });
  return static_cast<size_t>(it - groups.begin());
}

}  // namespace

std::vector<KvLayerGroup> kv_layer_groups(const ModelGeometry& g, const KvLayout& layout) {
  std::vector<KvLayerGroup> groups;
  for (size_t il = 0; il < g.layers.size(); ++il) {
    const LayerKv& l = g.layers[il];
    if (l.n_head_kv == 0) continue;  // a layer without attention stores nothing
    const size_t gi = find_layer_group(groups, g, layout, il);
    if (gi == groups.size()) {
      groups.push_back({l, 1, layout.body(il)});
    } else {
      ++groups[gi].n_layers;
    }
  }
  return groups;
}

size_t kv_layer_group_of(const std::vector<KvLayerGroup>& groups, const ModelGeometry& g,
                         const KvLayout& layout, size_t il) {
  const size_t gi = find_layer_group(groups, g, layout, il);
  assert(gi < groups.size());
  return gi;
}

uint64_t kv_group_block_bytes(const KvLayerGroup& grp, KvFormat k, KvFormat v, int block_size) {
  return static_cast<uint64_t>(block_size) * static_cast<uint64_t>(grp.n_layers) *
         head_token_bytes(grp.shape, k, v);
}

uint64_t kv_group_body_block_bytes(const KvLayerGroup& grp, int block_size) {
  return kv_group_block_bytes(grp, grp.body.k, grp.body.v, block_size);
}

uint64_t block_bytes(const ModelGeometry& g, KvFormat k, KvFormat v, int block_size) {
  return static_cast<uint64_t>(block_size) * kv_bytes_per_token(g, k, v);
}

KvBlockCount kv_block_count(const KvLayout& layout, int64_t n, int64_t window) {
  if (n <= 0) return {};
  const int64_t B = layout.block_size;
  const int64_t nb = ceil_div(n, B);
  const int64_t first_kept = window > 0 ? std::max<int64_t>(0, n - window) / B : 0;
  const int64_t kept = nb - first_kept;
  if (!layout.mixed()) return {0, kept};
  // Local layers never attend to the sinks, so they keep none.
  const int64_t sink_blocks = window > 0 ? 0 : std::min(nb, ceil_div(layout.sink_tokens, B));
  const int64_t win_first =
      layout.window_tokens > 0 ? std::max<int64_t>(0, n - layout.window_tokens) / B : nb;
  const int64_t in_window = nb - std::max(first_kept, win_first);
  const int64_t sinks_outside_window =
      std::max<int64_t>(0, std::min(sink_blocks, win_first) - first_kept);
  const int64_t fp16 = in_window + sinks_outside_window;
  return {fp16, kept - fp16};
}

uint64_t kv_sequence_bytes(const ModelGeometry& g, const KvLayout& layout, int64_t n_tokens) {
  uint64_t sum = 0;
  for (const KvLayerGroup& grp : kv_layer_groups(g, layout)) {
    const KvBlockCount c = kv_block_count(layout, n_tokens, grp.shape.window);
    sum += static_cast<uint64_t>(c.fp16) *
           kv_group_block_bytes(grp, kKvF16, kKvF16, layout.block_size);
    sum += static_cast<uint64_t>(c.body) * kv_group_body_block_bytes(grp, layout.block_size);
  }
  return sum;
}

uint64_t kv_fp16_overhead_bytes(const ModelGeometry& g, const KvLayout& layout) {
  if (!layout.mixed()) return 0;
  // Far enough out that the sinks, the FP16 window and every sliding window are disjoint.
  const int64_t B = layout.block_size;
  const int64_t n = (ceil_div(layout.sink_tokens, B) + ceil_div(layout.window_tokens, B) + 2) * B +
                    g.max_window() + 4 * B;
  return peak_over_lengths(n, layout.block_size, [&](int64_t m) {
    uint64_t extra = 0;
    for (const KvLayerGroup& grp : kv_layer_groups(g, layout)) {
      const uint64_t f16 = kv_group_block_bytes(grp, kKvF16, kKvF16, layout.block_size);
      const uint64_t body = kv_group_body_block_bytes(grp, layout.block_size);
      const KvBlockCount c = kv_block_count(layout, m, grp.shape.window);
      extra += static_cast<uint64_t>(c.fp16) * (f16 > body ? f16 - body : 0);
    }
    return extra;
  });
}

int64_t kv_max_tokens(const ModelGeometry& g, const KvLayout& layout, uint64_t budget_bytes,
                      int64_t n_seqs, int64_t limit, int64_t chunk_tokens) {
  assert(n_seqs >= 1);
  // The pools a sequence of n tokens needs (what the engine reserves): each pool sized for its
  // own peak over every shorter length. The FP16 pool peaks where the window straddles one more
  // block than at n, so this can be one FP16 block more than the peak of kv_sequence_bytes.
  const auto fits = [&](int64_t n) {
    return kv_pool_plan(g, layout, n, 1, chunk_tokens).total_bytes() <=
           budget_bytes / static_cast<uint64_t>(n_seqs);
  };
  if (limit < 1 || !fits(1)) return 0;
  int64_t lo = 1;  // fits
  int64_t hi = limit;
  if (fits(hi)) return hi;
  while (hi - lo > 1) {  // invariant: fits(lo), !fits(hi)
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

uint64_t KvPoolPlan::total_bytes() const {
  uint64_t sum = 0;
  for (const KvGroupPool& p : groups) sum += p.bytes();
  return sum;
}

KvPoolPlan kv_pool_plan(const ModelGeometry& g, const KvLayout& layout, int64_t max_model_len,
                        int64_t max_num_seqs, int64_t chunk_tokens) {
  KvPoolPlan plan;
  for (const KvLayerGroup& grp : kv_layer_groups(g, layout)) {
    KvGroupPool p;
    p.group = grp;
    p.fp16_block_bytes = kv_group_block_bytes(grp, kKvF16, kKvF16, layout.block_size);
    p.body_block_bytes = kv_group_body_block_bytes(grp, layout.block_size);
    const auto count = [&](int64_t m) { return kv_block_count(layout, m, grp.shape.window); };
    const int64_t fp16 = peak_over_lengths(max_model_len, layout.block_size,
                                           [&](int64_t m) { return count(m).fp16; });
    const int64_t body = peak_over_lengths(max_model_len, layout.block_size,
                                           [&](int64_t m) { return count(m).body; });
    p.fp16_blocks = fp16 * max_num_seqs;
    p.body_blocks = body * max_num_seqs;
    if (grp.shape.window > 0 && chunk_tokens > 0) {
      const int64_t B = layout.block_size;
      p.body_blocks += (chunk_tokens + B - 1) / B + max_num_seqs;
      if (layout.mixed()) p.fp16_blocks += max_num_seqs * ((layout.window_tokens + B - 1) / B + 1);
    }
    plan.groups.push_back(p);
  }
  return plan;
}

}  // namespace bie::planner
