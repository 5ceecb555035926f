// Fused causal attention through a block table. One call (attend_paged_tile) handles a *tile*:
// n_q consecutive query tokens x the query heads of one KV head's GQA group, against a range of
// blocks (one split of the visible context). Each block's K tile and V tile is read once for all
// rows of the tile; the format's codes are decoded inside the dot/axpy loops (never into a
// dequantised copy). Softmax is online: per row a running max m, a running sum l and an
// unnormalised accumulator acc, rescaled when m grows, so scratch is bounded by one block.
// Splits of one query's context yield independent partials (m, l, acc) that
// merge_paged_partials combines exactly. Stateless; the caller owns scratch and partials.
// Thread-safe for distinct scratch and partials.
//
// Numerics: for FP16 K tiles the query is rounded to fp16 and each score is summed in
// dense_attention's order (one 8-lane accumulator over head_dim, same horizontal sum): SmolLM2
// turns K-dot summation-order noise into visible logit moves. The weights exp(s - m) stay fp32
// (dense_attention rounds its *normalised* probabilities to fp16 as llama.cpp does; rounding the
// unnormalised online weights instead moved SmolLM2's golden logits past the 0.6 bar, keeping
// them fp32 stays inside it). So f16 paged attention is no longer bit-identical to
// ContiguousKvCache: logits differ by up to ~0.6 on SmolLM2 (test_paged_kv_golden.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "bie/backend/kv_block_view.h"
#include "bie/backend/kv_format.h"

namespace bie::attention {

// One logical block as attention sees it (described by kv/: where its tiles are, how to read
// them).
using PagedBlockView = kv::KvBlockView;

// Most query tokens in one tile (prefill); a tile's rows are n_q * group <= kMaxTileQ * group.
inline constexpr int kMaxTileQ = 16;

// One task: queries at positions q_pos0 .. q_pos0 + n_q - 1 (query i sees keys 0 .. q_pos0 + i,
// the causal mask, or with window > 0 only keys j with q_pos0 + i - j < window) for the groups of
// KV heads kv_head .. kv_head + n_kv - 1, over blocks [block_begin, block_end). Several KV heads
// per task read their adjacent tiles as one run.
struct PagedAttnTile {
  const PagedBlockView* blocks = nullptr;  // the sequence's logical blocks
  int block_size = 16;
  int64_t q_pos0 = 0;
  int n_q = 1;  // 1 .. kMaxTileQ
  int64_t block_begin = 0;
  int64_t block_end = 0;  // blocks past the last query's position are skipped
  int kv_head = 0;
  int n_kv = 1;
  int group = 1;  // KV head kv_head + h serves query heads (kv_head + h) * group .. + group - 1
  int head_dim = 0;
  float scale = 1.0f;
  int64_t window = 0;  // > 0: sliding window (see above); 0: every earlier key
  // Query i, KV head h, group head g at q + i * q_stride + (h * group + g) * head_dim (q points at
  // the first query head of KV head kv_head).
  const float* q = nullptr;
  int64_t q_stride = 0;
};

// A tile's online-softmax state; row r = (h * n_q + i) * group + g. A row that saw no key has m =
// -inf, l = 0, acc = 0.
struct PagedAttnPartial {
  float* m = nullptr;    // [rows] running max of the scaled scores
  float* l = nullptr;    // [rows] sum of exp(s - m)
  float* acc = nullptr;  // [rows, head_dim] sum of exp(s - m) * v
};

// Floats of one partial with `rows` rows (m, l, acc back to back; see partial_at).
[[nodiscard]] inline size_t paged_partial_floats(int rows, int head_dim) {
  return static_cast<size_t>(rows) * (static_cast<size_t>(head_dim) + 2);
}
[[nodiscard]] inline PagedAttnPartial partial_at(float* base, int rows, int head_dim) {
  return PagedAttnPartial{base, base + rows, base + 2 * rows};
}

// Scratch floats attend_paged_tile needs for `rows` = n_q * n_kv * group rows: bounded by one
// block, independent of the context.
[[nodiscard]] inline size_t paged_attn_scratch_floats(int rows, int head_dim, int block_size) {
  return static_cast<size_t>(rows) *
         (static_cast<size_t>(head_dim) + 2 * static_cast<size_t>(block_size));
}

// Split-K: how many chunks to cut each tile's visible context into so that tiles * splits tasks
// keep n_threads busy (decode of one token has only n_head_kv tiles: 3 tiles on 2 threads leave
// one idle a third of the time). The smallest s <= kMaxKvSplits minimising the makespan
// ceil(tiles * s / n_threads) / s, with at least kMinSplitTokens visible tokens per chunk.
inline constexpr int64_t kMinSplitTokens = 512;
// The attention runner cuts every query's context into parts on this fixed grid of absolute
// positions (whole blocks), whatever the tile, so per-query results do not depend on batching.
inline constexpr int64_t kSplitGridTokens = 256;
inline constexpr int kMaxKvSplits = 8;
[[nodiscard]] int plan_kv_splits(int64_t tiles, int64_t visible_tokens, int n_threads);

// How the attention runner cuts one layer's attention into tasks: each task takes
// `heads_per_task` KV heads (all of them, so a block's adjacent tiles are read as one run, unless
// per-head tasks balance the threads better) and one of `splits` chunks of the context.
struct PagedTaskPlan {
  int heads_per_task = 1;
  int splits = 1;
};
[[nodiscard]] PagedTaskPlan plan_paged_tasks(int64_t tiles, int n_kv_heads, int64_t visible_tokens,
                                             int n_threads);

// Runs the tile over its block range into `part` (overwritten).
// note: call only if 1 <= n_q <= kMaxTileQ, head_dim <= 512, every block in range that holds a
// visible position has tiles
void attend_paged_tile(const PagedAttnTile& t, float* scratch, const PagedAttnPartial& part);

// out row r = (h, i, g), at out + i * out_stride + (h * group + g) * head_dim, = the exact
// combination of the parts' rows: sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s.
// A row no part saw is written as zeros.
void merge_paged_partials(const PagedAttnPartial* parts, int n_parts, int n_q, int n_kv, int group,
                          int head_dim, float* out, int64_t out_stride);

// Scalar reference twin: one query token at position n_kv_tokens - 1, plain and slow.
// Dequantises every visible row (the last `window` positions when window > 0, else all) with the
// format's scalar load(), scores and softmax in double, no fp16 rounding of q or weights.
// q: [group, head_dim] (the group's heads), out: [group, head_dim].
void attend_paged_reference(const PagedBlockView* blocks, int block_size, int64_t n_kv_tokens,
                            int kv_head, int group, int head_dim, float scale, const float* q,
                            float* out, int64_t window = 0);

// Kernels behind attend_paged_tile (internal; exposed for tests of the generic path).
namespace detail {
// Scores rows q[r] (r < n_rows) against `rows` rows of a K tile: s[r * s_stride + j].
using ScoreBlockFn = void (*)(const PagedBlockView& bv, const uint8_t* tile, int rows,
                              const float* const* q, int n_rows, float* s, int s_stride);
// acc[r][0..d) += sum_j p[r * p_stride + j] * V row j.
using AccumBlockFn = void (*)(const PagedBlockView& bv, const uint8_t* tile, int rows,
                              const float* p, int p_stride, float* const* acc, int n_rows);
// One row's online-softmax step over a block: s[0, lim) are raw scores of visible keys
// (lim >= 1), s[lim, rows) masked. Scales the scores, raises the running max *m, rescales *l and
// acc[head_dim] by exp(m_old - m_new) when it grows, and leaves the weights exp(s - m_new) in
// s[0, lim) (0 in s[lim, rows)). The caller adds their sum to *l (all rows of a block at once).
using UpdateRowFn = void (*)(float* s, int rows, int lim, float scale, float* m, float* l,
                             float* acc, int head_dim);
// out[0, n) = x[0, n) rounded to fp16 and back (round to nearest even, as quant::fp32_to_fp16).
using RoundFp16Fn = void (*)(const float* x, int n, float* out);
// l[r] += (((0 + s[r * stride]) + s[r * stride + 1]) + ... + s[r * stride + cols - 1]) for
// r < n_rows: each row's sum in index order, whatever the vector width.
using AddRowSumsFn = void (*)(const float* s, int n_rows, int stride, int cols, float* l);
struct TileKernels {
  ScoreBlockFn score;
  AccumBlockFn accum;
  UpdateRowFn update;
  RoundFp16Fn round_fp16;
  AddRowSumsFn add_row_sums;
};
// Format-generic kernels: the traits' dot/axpy per row, scalar softmax with std::exp.
[[nodiscard]] TileKernels generic_kernels();
// Fused AVX2 kernels (decode once per block row, all tile rows at once; vector softmax step), or
// the generic ones where a block's format or head_dim (% 16) is not covered.
[[nodiscard]] TileKernels avx2_kernels();
// AVX-512 kernels that give the AVX2 kernels' bits (two K rows or 16 channels per vector), and
// the AVX2 ones where a format is not covered. bf16: int4_asym V by AVX512_BF16 pair dot products
// (same bits; only where cpu_features().avx512bf16).
[[nodiscard]] TileKernels avx512_kernels(bool bf16);
// The AVX2 / AVX-512 kernels' int4_channel scores (the int8-query method, head_dim % 64 == 0) in
// scalar code: their exact bits, for tests. s[r * ss + j] = query row r's score of tile row j.
void int4_channel_scores_i8q(int d, const uint8_t* tile, int rows, const float* const* q,
                             int n_rows, float* s, int ss);
void attend_paged_tile_with(const TileKernels& k, const PagedAttnTile& t, float* scratch,
                            const PagedAttnPartial& part);
}  // namespace detail

}  // namespace bie::attention
