// Internal to src/backend/cpu/matmul*.cpp and matvec_avx2.cpp: the AVX2 paths.
// Tiled matrix-matrix path (prefill): weight rows are repacked, a panel of rows at a time, into a
// per-thread buffer laid out for the micro-kernels (8 rows interleaved so that one AVX2 register
// holds one value of each row); the panel stays in L1/L2 while every token is dotted with it.
// Matrix-vector path (decode, few tokens): weights read in place. Layouts are private to the
// .cpp files. Stateless; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "bie/backend/matmul.h"
#include "bie/quant/blocks.h"

namespace bie::cpu {

struct TilePlan {
  bool supported = false;
  size_t act_row_bytes = 0;  // prepared activations, per token
  size_t panel_bytes = 0;    // weight panel, per thread
  int rows_per_panel = 0;
};

// Q4_K decode activations (both ISAs' matvec kernels): a Q8_K block whose first 8 per-16 sums
// are replaced by the 8 per-32 sums the mins multiply, with the wrapping int16 adds of a
// _mm_hadd_epi16 of the 16: computed once per token instead of once per weight row.
inline void q8k_sums_per_32(quant::BlockQ8_K& b) {
  for (int g = 0; g < 8; ++g) {
    b.bsums[g] = static_cast<int16_t>(static_cast<uint16_t>(b.bsums[2 * g]) +
                                      static_cast<uint16_t>(b.bsums[2 * g + 1]));
  }
}

// Tile activations of the 32-value block formats, per block (both ISAs' tiles): the Q8_0/Q8_1
// quantiser's values, d and s = d * sum(qs) rounded through fp16 as the blocks would store
// them, and isum = sum(qs) exact.
struct ActB32 {
  int8_t qs[32];
  float d;
  float s;
  int32_t isum;
  int32_t pad;
};
static_assert(sizeof(ActB32) == 48);

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

// AVX-512 twins of the tiles for the K-quants (matmul_avx512.cpp), same contract (own plan and
// panel layout; the activations are the AVX2 tiles' Q8_K rows) and the AVX2 tiles' bits.
// note: call these only if has_avx512().
[[nodiscard]] TilePlan avx512_tile_plan(quant::GgmlType type, int64_t n_in);
void avx512_prepare_acts(quant::GgmlType type, int64_t n_in, const float* x, int64_t t0, int64_t t1,
                         uint8_t* acts);
void avx512_tile_rows(const WeightView& w, const uint8_t* acts, size_t act_row_bytes,
                      int64_t n_tokens, int64_t r0, int64_t r1, float* y, uint8_t* panel);

// The AVX-512 tiles' K-quant panel, per super-block of 16 rows: 64 chunks x 16 rows x 4 bytes of
// the unsigned values (chunk c: values 4c..4c+3), then per group g of 16 values the rows' int32
// scales, per pair of groups h the rows' int16 pair (m[2h], m[2h+1]) of min terms (the
// mins; Q6_K: 32 * its scales), then d[16] and dmin[16] as fp32.
struct Avx512KPanel {
  static constexpr size_t kScOff = 64 * 64, kMOff = kScOff + 16 * 64, kDOff = kMOff + 8 * 64,
                          kDminOff = kDOff + 64, kBytes = kDminOff + 64;
};
// The AVX-512 tiles' panel of a 32-value block format, per block of 16 rows: 8 chunks x 16 rows x
// 4 bytes of the unsigned values (chunk c: values 4c..4c+3; Q4_0/Q5_0 without their offset, Q8_0
// plus 128), then d[16] and m[16] as fp32 (m zero where the format has none).
struct Avx512B32Panel {
  static constexpr size_t kDOff = 8 * 64, kMOff = kDOff + 64, kBytes = kMOff + 64;
};
// The tile kernels on a K-quant or 32-value panel of nb (super-)blocks made elsewhere (16 rows,
// n_valid of them stored): y[t * n_out + i] for i < n_valid and every token.
void avx512_tile_panel(quant::GgmlType type, const uint8_t* panel, int64_t nb, const uint8_t* acts,
                       size_t act_row_bytes, int64_t n_tokens, float* y, int64_t n_out,
                       int n_valid);

// ---- AVX-512 kernels over weights repacked once (matmul_packed_avx512.cpp) -------------------
// Q4_K, Q6_K and the 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).
// The matrix in 16-row panels of its own bits (the file's size, plus at most 63 bytes a panel),
// read in place by the tile kernels for any number of tokens: the tiles' bits, so a decode
// token's bits do not depend on its batch, and prompt tokens get the tiles' bits. Activations:
// avx512_prepare_acts (plan: avx512_tile_plan). note: call these only if has_avx512().

// Bytes of the repacked matrix; 0 if the type has no packed layout (all but Q4_K, Q6_K and the
// 32-value formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).
[[nodiscard]] size_t avx512_packed_bytes(quant::GgmlType type, int64_t n_in, int64_t n_out);
// Repacks panels [p0, p1) (rows [16 p0, 16 p1)) of w into dst (avx512_packed_bytes long).
void avx512_pack_panels(const WeightView& w, int64_t p0, int64_t p1, uint8_t* dst);
inline constexpr int kPackedPanelRows = 16;
// y rows [r0, r1) for all n_tokens tokens from w.packed; r0 a multiple of kPackedPanelRows, r1
// cuts the last panel short only at the matrix's end. Up to kPackedInPlaceTokens tokens the
// kernels read the packed panels in place; more tokens have each panel expanded once into
// `scratch` (avx512_tile_plan's panel_bytes) in the tiles' layout, for the tile kernels.
inline constexpr int64_t kPackedInPlaceTokens = 16;
void avx512_packed_rows(const WeightView& w, const uint8_t* acts, size_t act_row_bytes,
                        int64_t n_tokens, int64_t r0, int64_t r1, float* y, uint8_t* scratch);

// ---- decode: matrix-vector kernels over the weights in place (matvec_avx2.cpp) -------------

// Token counts up to this use the matvec kernels; more tokens amortise the tile repacking.
inline constexpr int kMaxMatvecTokens = 4;

struct MatvecPlan {
  bool supported = false;
  size_t act_row_bytes = 0;  // prepared activations, per token (a multiple of 64)
  // Most tokens one *_matvec_rows call takes: a batch of decode tokens runs in groups of this
  // many over each chunk of rows (the weights' unpacking shared by the group).
  int max_tokens = kMaxMatvecTokens;
};

[[nodiscard]] MatvecPlan avx2_matvec_plan(quant::GgmlType type, int64_t n_in);

// Converts one token of x (n_in floats) into the matvec layout at `acts`.
void avx2_matvec_prepare(quant::GgmlType type, int64_t n_in, const float* x, uint8_t* acts);

// y[t * n_out + r] for rows [r0, r1) and tokens t < n_tokens (1 <= n_tokens <= plan.max_tokens);
// token t's activations at acts + t * act_row_bytes.
void avx2_matvec_rows(const WeightView& w, const uint8_t* acts, size_t act_row_bytes,
                      int64_t n_tokens, int64_t r0, int64_t r1, float* y);

// ---- AVX-512 twins of the matvec kernels (matvec_avx512.cpp) --------------------------------
// Same contract as the avx2_matvec_* functions (own activation layout: prepare with the same
// ISA's function; groups of up to kMaxMatvecTokensAvx512 tokens, 32 vector registers holding
// twice the AVX2 kernels' accumulators). note: call these only if has_avx512().
inline constexpr int kMaxMatvecTokensAvx512 = 8;

[[nodiscard]] MatvecPlan avx512_matvec_plan(quant::GgmlType type, int64_t n_in);
void avx512_matvec_prepare(quant::GgmlType type, int64_t n_in, const float* x, uint8_t* acts);
void avx512_matvec_rows(const WeightView& w, const uint8_t* acts, size_t act_row_bytes,
                        int64_t n_tokens, int64_t r0, int64_t r1, float* y);

}  // namespace bie::cpu
