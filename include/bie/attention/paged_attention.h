// Causal attention through a block table: for one query token and one KV head, the query heads of
// its GQA group score every visible block with the block's format kernel (kv::KvFormatTraits::dot)
// and accumulate values with its axpy — the cache is never dequantised, not even per block.
// Each block's K (then V) tile is visited once per KV head and used for every query head of the
// group while it sits in L1. Stateless; the caller owns the scratch. Thread-safe for distinct
// outputs and scratch.
//
// Numerics: scores are kept for the whole context (4 B per visible token and query head), then
// normalised with attention::softmax_inplace exactly as dense_attention does, and for FP16 tiles
// the query and the softmax weights are rounded to fp16 before their dots, and FP16 K tiles are
// scored in dense_attention's summation order (one 8-lane accumulator; kv::f16_dot uses two).
// With an all-f16 layout this is bit-identical to ContiguousKvCache's attention, which a
// running-max/sum (online) softmax cannot be (SmolLM2 turns summation-order noise into logit
// moves of ~0.1-0.8).
#pragma once

#include <cstdint>

#include "bie/kv/kv_format.h"

namespace bie::attention {

// One logical block as attention sees it: where its tiles are and how to read them.
struct PagedBlockView {
  const uint8_t* k = nullptr;  // K tile of KV head 0 of this layer; head h at k + h * k_tile_bytes
  const uint8_t* v = nullptr;  // V tile of KV head 0; head h at v + h * v_tile_bytes
  size_t k_tile_bytes = 0;
  size_t v_tile_bytes = 0;
  const kv::KvFormatTraits* tk = nullptr;
  const kv::KvFormatTraits* tv = nullptr;
  kv::KvRowGeom gk;
  kv::KvRowGeom gv;
  bool k_f16 = false;  // round the query to fp16 before dot (dense_attention's arithmetic)
  bool v_f16 = false;  // round the softmax weights to fp16 before axpy
};

struct PagedAttnArgs {
  const PagedBlockView* blocks = nullptr;  // logical blocks 0 .. ceil(n_kv_tokens / block_size)
  int block_size = 16;
  int64_t n_kv_tokens = 0;  // positions 0 .. n_kv_tokens - 1 are visible to this query
  int kv_head = 0;
  int group = 1;  // query heads kv_head * group .. + group - 1
  int head_dim = 0;
  float scale = 1.0f;
  const float* q = nullptr;  // [group, head_dim] the group's query heads, contiguous
  float* out = nullptr;      // [group, head_dim] results
  // Scratch: scores [group, n_kv_tokens]; qr [group, head_dim]; p [block_size].
  float* scores = nullptr;
  float* qr = nullptr;
  float* p = nullptr;
};

// Scratch floats PagedAttnArgs needs for a context of n_kv_tokens.
[[nodiscard]] inline int64_t paged_attn_scratch_floats(int64_t n_kv_tokens, int group, int head_dim,
                                                       int block_size) {
  return static_cast<int64_t>(group) * (n_kv_tokens + head_dim) + block_size;
}

// note: call only if n_kv_tokens >= 1, every visible block has tiles, head_dim <= 512
void attend_paged_group(const PagedAttnArgs& a);

}  // namespace bie::attention
