// Internal to src/backend/cpu/matmul*.cpp: the tiled AVX2 matrix-matrix path. Weight rows are
// repacked, a panel of rows at a time, into a per-thread buffer laid out for the micro-kernels
// (8 rows interleaved so that one AVX2 register holds one value of each row); the panel stays
// in L1/L2 while every token is dotted with it. Layouts are private to matmul_avx2.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "bie/backend/matmul.h"

namespace bie::cpu {

struct TilePlan {
  bool supported = false;
  size_t act_row_bytes = 0;  // prepared activations, per token
  size_t panel_bytes = 0;    // weight panel, per thread
  int rows_per_panel = 0;
};

// note: call the functions below only if has_avx2().
[[nodiscard]] TilePlan avx2_tile_plan(quant::GgmlType type, int64_t n_in);

// Converts tokens [t0, t1) of x (n_in floats each) into the tile layout: token t at
// acts + t * act_row_bytes.
void avx2_prepare_acts(quant::GgmlType type, int64_t n_in, const float* x, int64_t t0, int64_t t1,
                       uint8_t* acts);

// y rows [r0, r1) for all n_tokens tokens. r0 must be a multiple of rows_per_panel; r1 may cut
// the last panel short (only at the matrix's end).
void avx2_tile_rows(const WeightView& w, const uint8_t* acts, size_t act_row_bytes,
                    int64_t n_tokens, int64_t r0, int64_t r1, float* y, uint8_t* panel);

}  // namespace bie::cpu
