// Causal attention over dense FP16 K/V rows (the contiguous cache's layout). Stateless kernels;
// a scalar reference and an AVX2 path with the same arithmetic (the query and the softmax
// weights are rounded to fp16 before their dot products, as llama.cpp's f16 KV path does).
#pragma once

#include <cstdint>

namespace bie::attention {

struct DenseAttnArgs {
  const float* q;       // [n_head * head_dim] one query token
  const uint16_t* k;    // [n_kv_tokens, kv_stride] fp16; head g starts at column g * head_dim
  const uint16_t* v;    // same layout as k
  int64_t kv_stride;    // elements between consecutive tokens' rows
  int64_t n_kv_tokens;  // positions kv_first .. n_kv_tokens - 1 are visible to this query
  int head;             // query head
  int kv_head;          // its KV head (head / group size)
  int head_dim;
  float scale;
  float* out;            // [head_dim] result for this head
  float* scores;         // scratch, n_kv_tokens floats
  int64_t kv_first = 0;  // first visible position (> 0 under a sliding window)
};

// Softmax of scores[0..n) in place (max-subtracted, sum in double as ggml's soft_max). Shared
// with the paged kernel so both caches normalise identically.
void softmax_inplace(float* scores, int64_t n);

void attend_one_head_scalar(const DenseAttnArgs& a);
void attend_one_head_avx2(const DenseAttnArgs& a);
// Picks the AVX2 path when the CPU has it.
void attend_one_head(const DenseAttnArgs& a);

}  // namespace bie::attention
