// KV byte accounting: the single source of truth for how many bytes a model's KV cache needs in a
// given storage layout. The KV cache sizes its pools with these functions, and `bie plan` reports
// them, so the two cannot disagree. Every function is pure and thread-safe. docs/planner.md gives
// the layouts and the block rules these functions assume.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "bie/common/result.h"
#include "bie/planner/kv_format.h"
#include "bie/planner/model_geometry.h"

namespace bie::planner {

// The body formats of one layer's K and V.
struct KvLayerFormats {
  KvFormat k = kKvF16;
  KvFormat v = kKvF16;
  friend bool operator==(const KvLayerFormats&, const KvLayerFormats&) = default;
};

// How a sequence's KV is stored: the body formats for K and V, paged blocks of `block_size`
// tokens, and (for BIE's quantised formats) the first `sink_tokens` and last `window_tokens`
// tokens kept in FP16.
struct KvLayout {
  KvFormat k = kKvF16;
  KvFormat v = kKvF16;
  // --kv-layer-map: the body formats of each layer ([n_layer]); empty: every layer stores k and v.
  // With a map, k and v name the regime it refines (labels) and store nothing themselves. Every
  // entry keeps K or V quantised (check_kv_layout), so a mapped layout is always mixed.
  std::vector<KvLayerFormats> per_layer;
  int block_size = 16;
  int sink_tokens = 8;
  int window_tokens = 128;
  // --kv-rotate: K rows and query heads pass through a normalised Walsh–Hadamard transform per
  // head before K is stored and before scores (backend/kv_format_rotate.h). Costs no bytes.
  bool rotate = false;

  // Layer il's body formats.
  [[nodiscard]] KvLayerFormats body(size_t il) const {
    return per_layer.empty() ? KvLayerFormats{k, v} : per_layer[il];
  }
  // Whether sink/window blocks are FP16 while the rest is in the body formats (see
  // uses_fp16_sink_window).
  [[nodiscard]] bool mixed() const {
    if (!per_layer.empty()) return true;
    return uses_fp16_sink_window(k) || uses_fp16_sink_window(v);
  }
  // Whether some layer stores per-channel keys (tiles written whole, block-sized chunks).
  [[nodiscard]] bool has_per_channel() const;
  // The most prompt tokens one pass may take, 0 for no limit (layouts that are not mixed). A
  // prompt chunk is written FP16 and its blocks move to the body when later chunks push them out
  // of the window, so every prompt token attends to at least the window's last W - C tokens in
  // FP16, as a decoded token does to the whole window. C = max(B, W/2 rounded down to blocks):
  // each token sees at least half the window (64 of 128 tokens with 64-token blocks).
  [[nodiscard]] int64_t prefill_chunk_cap() const;
  // Prompt tokens per pass for a requested chunk size (--chunked-prefill-size, -b): the request,
  // lowered to prefill_chunk_cap() where there is one. The engine, bench and quality all cut
  // prompts with it.
  [[nodiscard]] int64_t prefill_chunk(int64_t requested) const {
    const int64_t cap = prefill_chunk_cap();
    return cap > 0 ? std::min(requested, cap) : requested;
  }
};

// Checks every layer's head widths against its formats, the layout's sizes and a layer map's
// length and entries.
[[nodiscard]] Status check_kv_layout(const ModelGeometry& g, const KvLayout& layout);

// ---- flat formulas (../shared/BRIEF.md §1, §4) ---------------------------------------------

// Bytes one token adds to the cache of every layer, counting every layer as global:
//   sum over layers of n_head_kv * (bytes_per_head_token(k, d_k) + bytes_per_head_token(v, d_v)).
// For Llama-3-8B in f16: 2 * 32 * 8 * 128 * 2 = 131072 B. The contiguous f16 cache sizes itself
// as kv_bytes_per_token(g, kKvF16, kKvF16) * n_ctx * n_seq (see contiguous_kv_bytes).
// note: call only if check_kv_format holds for every layer's head widths.
[[nodiscard]] uint64_t kv_bytes_per_token(const ModelGeometry& g, KvFormat k, KvFormat v);
// The same in a layout's body formats (each layer its own with a layer map).
[[nodiscard]] uint64_t kv_bytes_per_token(const ModelGeometry& g, const KvLayout& layout);

// Bits per stored value of the body, averaged over every K and V value of a token (scales and
// zeros included): 8 * kv_bytes_per_token(g, layout) / values per token. int4_asym's 4.5 + 4.5
// gives 4.5; a layer map's average is what --calibrate budgets.
[[nodiscard]] double kv_body_bits_per_value(const ModelGeometry& g, const KvLayout& layout);

// Bytes of a contiguous (unpaged, unwindowed) cache of n_ctx tokens for each of n_seq sequences:
// kv_bytes_per_token(g, k, v) * n_ctx * n_seq. What the foundation's simple KV cache allocates.
[[nodiscard]] uint64_t contiguous_kv_bytes(const ModelGeometry& g, KvFormat k, KvFormat v,
                                           int64_t n_ctx, int64_t n_seq);

// Bytes of n_tokens of one sequence without paging or FP16 sinks, but honouring sliding windows
// (a local layer stores min(n, window) tokens) and MLA: the formulas of BRIEF §4.
[[nodiscard]] uint64_t kv_bytes_unpaged(const ModelGeometry& g, KvFormat k, KvFormat v,
                                        int64_t n_tokens);

// ---- paged accounting ----------------------------------------------------------------------

// Layers with the same KV shape, window and body formats share a block pool; a block of a group
// holds `block_size` tokens of one sequence for every layer of the group. A model without sliding
// windows or a layer map has exactly one group (all layers), as DESIGN.md's "block = B tokens,
// all layers". Groups are listed in the order of their first layer.
struct KvLayerGroup {
  LayerKv shape;  // n_head_kv, head widths, window (0 = global)
  int64_t n_layers = 0;
  KvLayerFormats body;  // the body formats of its layers
};
[[nodiscard]] std::vector<KvLayerGroup> kv_layer_groups(const ModelGeometry& g,
                                                        const KvLayout& layout);
// The group of layer il (its index in kv_layer_groups(g, layout)); il must store KV.
[[nodiscard]] size_t kv_layer_group_of(const std::vector<KvLayerGroup>& groups,
                                       const ModelGeometry& g, const KvLayout& layout, size_t il);

// Bytes of one block of one group: block_size * n_layers * n_head_kv * (bytes(k) + bytes(v)).
[[nodiscard]] uint64_t kv_group_block_bytes(const KvLayerGroup& grp, KvFormat k, KvFormat v,
                                            int block_size);
// The same in the group's body formats.
[[nodiscard]] uint64_t kv_group_body_block_bytes(const KvLayerGroup& grp, int block_size);

// Bytes of one block across all layers (the common case of a model without sliding windows).
// block_bytes(g, f16, f16, 16) for Llama-3-8B = 16 * 131072 = 2 MiB.
[[nodiscard]] uint64_t block_bytes(const ModelGeometry& g, KvFormat k, KvFormat v, int block_size);

// Blocks one sequence of n_tokens holds in one group, split by storage. Block b covers tokens
// [b*B, (b+1)*B). A local layer (window W > 0) keeps only blocks holding one of the last W tokens.
// In a mixed layout a kept block is FP16 if it holds a sink token (global layers only) or one of
// the last window_tokens tokens; every other kept block is in the body format. In an unmixed
// layout every kept block counts as body.
struct KvBlockCount {
  int64_t fp16 = 0;
  int64_t body = 0;
  friend bool operator==(const KvBlockCount&, const KvBlockCount&) = default;
};
[[nodiscard]] KvBlockCount kv_block_count(const KvLayout& layout, int64_t n_tokens, int64_t window);

// Exact bytes one sequence of n_tokens occupies in a paged cache with this layout.
[[nodiscard]] uint64_t kv_sequence_bytes(const ModelGeometry& g, const KvLayout& layout,
                                         int64_t n_tokens);

// What the FP16 sinks and window cost one long sequence beyond storing those tokens in the body
// format: kv_sequence_bytes(n) minus the same blocks all in the body format, for n large enough
// that sinks and window are disjoint (0 for an unmixed layout).
[[nodiscard]] uint64_t kv_fp16_overhead_bytes(const ModelGeometry& g, const KvLayout& layout);

// Largest n <= limit whose pools for n_seqs sequences (kv_pool_plan(n, n_seqs, chunk_tokens),
// what the engine reserves) fit budget_bytes; 0 if not even one token.
[[nodiscard]] int64_t kv_max_tokens(const ModelGeometry& g, const KvLayout& layout,
                                    uint64_t budget_bytes, int64_t n_seqs, int64_t limit,
                                    int64_t chunk_tokens = 0);

// Pool sizes for one group.
struct KvGroupPool {
  KvLayerGroup group;
  int64_t fp16_blocks = 0;
  int64_t body_blocks = 0;
  uint64_t fp16_block_bytes = 0;
  uint64_t body_block_bytes = 0;
  [[nodiscard]] uint64_t bytes() const {
    return static_cast<uint64_t>(fp16_blocks) * fp16_block_bytes +
           static_cast<uint64_t>(body_blocks) * body_block_bytes;
  }
};
struct KvPoolPlan {
  std::vector<KvGroupPool> groups;
  [[nodiscard]] uint64_t total_bytes() const;
};

// Pools that let max_num_seqs sequences each grow to max_model_len tokens at the same time:
// per group, max_num_seqs times the most FP16 blocks and the most body blocks one sequence
// holds at any length up to max_model_len. This is the engine's allocation; a test asserts that
// what the KV cache allocates for a configuration equals total_bytes().
// chunk_tokens > 0: the prefill-pass headroom of sliding-window groups. A local group's pools
// above hold its window; while a pass of new tokens runs, the group also holds those tokens'
// blocks and the blocks they push out of the window (dropped after the pass). For passes of up
// to chunk_tokens tokens in all (over max_num_seqs sequences) a local group gets
// ceil(chunk_tokens / B) + max_num_seqs more body blocks and, in a mixed layout,
// max_num_seqs * (ceil(window_tokens / B) + 1) more FP16 blocks. Global groups are unchanged.
[[nodiscard]] KvPoolPlan kv_pool_plan(const ModelGeometry& g, const KvLayout& layout,
                                      int64_t max_model_len, int64_t max_num_seqs,
                                      int64_t chunk_tokens = 0);

}  // namespace bie::planner
