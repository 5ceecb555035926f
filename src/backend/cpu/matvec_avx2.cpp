// AVX2 matrix-vector kernels for decode (1 to kMaxMatvecTokens tokens): weight rows are read in
// place (no repacking: each weight byte is used by at most 4 tokens, so a panel would cost more
// than it saves), R rows at a time, so that each activation block load is shared by R rows and
// each weight block unpack by every token.
//
// Scales never go through scalar fp16 conversions in the inner loop. Per chunk of blocks, the
// fp16 header of every (row, block) is converted with one vcvtph2ps of its first four halves and
// multiplied, four blocks per instruction, by the activation's [d, s] pairs; the inner loop then
// does one broadcast load and one FMA per block. The same product gives the min / offset terms
// of Q4_0, Q4_1, Q5_0 and Q5_1 as a side result, so they cost nothing per block.
// Built with -mavx2 -mfma -mf16c; called only after has_avx2().
#include <immintrin.h>

#include <algorithm>
#include <cassert>
#include <cstring>

#include "backend/cpu/matmul_kernels.h"
#include "bie/quant/blocks.h"
#include "bie/quant/traits.h"
#include "quant/quant_avx2_inl.h"

namespace bie::cpu {

namespace {

using namespace quant;        // NOLINT
using namespace quant::simd;  // NOLINT

// ---- 32-value block formats (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0) -------------------------------------
//
// Activations of one token, nb blocks padded to nb4 = round_up(nb, 4) (padding is zero):
//   int8  qs[nb][32]        the Q8_0 / Q8_1 quantiser's values
//   float ds[nb4][2]        [d, s]: d as fp16 would round it; s = fp16(d * sum(qs)) for the
//                           Q8_1 formats (ggml's min term), 0 otherwise
//   float off[nb4][2]       [-offset * sum(qs), 0] for Q4_0 (offset 8) and Q5_0 (16)
// The weights' unsigned values q (Q4_0: x = d * (q - 8)) go into maddubs as they are; the
// offset comes back as d_x * d_y * off.

constexpr int kChunk = 64;  // blocks per scale pre-pass (bounds the stack buffers)

enum class B32Kind { kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0 };

// 16 bytes of nibbles -> 32 bytes (low nibbles, then high nibbles). The 16 bytes are broadcast
// to both halves by the load itself, so no lane insert is needed.
inline __m256i nibbles32_bcast(const uint8_t* p) {
  const __m256i t =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_and_si256(_mm256_blend_epi32(t, _mm256_srli_epi16(t, 4), 0xF0),
                          _mm256_set1_epi8(0x0F));
}

inline __m256i q5_high_bit(const uint8_t* qh) {
  return _mm256_and_si256(bits32_to_mask(qh), _mm256_set1_epi8(0x10));
}

template <B32Kind K>
struct B32;
template <>
struct B32<B32Kind::kQ4_0> {
  using Block = BlockQ4_0;
  static constexpr int kOffset = 8;
  static constexpr bool kMin = false, kSigned = false;
  static __m256i values(const Block* b) { return nibbles32_bcast(b->qs); }
};
template <>
struct B32<B32Kind::kQ4_1> {
  using Block = BlockQ4_1;
  static constexpr int kOffset = 0;
  static constexpr bool kMin = true, kSigned = false;
  static __m256i values(const Block* b) { return nibbles32_bcast(b->qs); }
};
template <>
struct B32<B32Kind::kQ5_0> {
  using Block = BlockQ5_0;
  static constexpr int kOffset = 16;
  static constexpr bool kMin = false, kSigned = false;
  static __m256i values(const Block* b) {
    return _mm256_or_si256(nibbles32_bcast(b->qs), q5_high_bit(b->qh));
  }
};
template <>
struct B32<B32Kind::kQ5_1> {
  using Block = BlockQ5_1;
  static constexpr int kOffset = 0;
  static constexpr bool kMin = true, kSigned = false;
  static __m256i values(const Block* b) {
    return _mm256_or_si256(nibbles32_bcast(b->qs), q5_high_bit(b->qh));
  }
};
template <>
struct B32<B32Kind::kQ8_0> {
  using Block = BlockQ8_0;
  static constexpr int kOffset = 0;
  static constexpr bool kMin = false, kSigned = true;
  static __m256i values(const Block* b) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs));
  }
};

struct ActB32View {
  const int8_t* qs;
  const float* ds;
  const float* off;
};

inline int64_t round_up4(int64_t n) {
  return (n + 3) / 4 * 4;
}

size_t act_b32_bytes(int64_t nb) {
  return static_cast<size_t>(nb) * kQK32 + static_cast<size_t>(round_up4(nb)) * 16;
}

ActB32View act_b32_view(const uint8_t* p, int64_t nb) {
  const auto* ds = reinterpret_cast<const float*>(p + nb * kQK32);
  return {reinterpret_cast<const int8_t*>(p), ds, ds + 2 * round_up4(nb)};
}

void prepare_b32(int64_t n_in, const float* x, bool q8_1_sum, int offset, uint8_t* out) {
  const int64_t nb = n_in / kQK32;
  auto* qs = reinterpret_cast<int8_t*>(out);
  auto* ds = reinterpret_cast<float*>(out + nb * kQK32);
  float* off = ds + 2 * round_up4(nb);
  for (int64_t i = 0; i < nb; ++i) {
    int32_t sum;
    const float d = quantize_q8_block(x + i * kQK32, qs + i * kQK32, &sum);
    ds[2 * i] = round_fp16(d);
    ds[2 * i + 1] = q8_1_sum ? round_fp16(d * static_cast<float>(sum)) : 0.0f;
    off[2 * i] = static_cast<float>(-offset * sum);
    off[2 * i + 1] = 0.0f;
  }
  for (int64_t i = 2 * nb; i < 2 * round_up4(nb); ++i) ds[i] = off[i] = 0.0f;
}

// Integer dot of one block: 8 int32 partial sums.
template <B32Kind K>
inline __m256i block_dot(__m256i xv, __m256i yv) {
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (B32<K>::kSigned) {
    return _mm256_madd_epi16(
        _mm256_maddubs_epi16(_mm256_sign_epi8(xv, xv), _mm256_sign_epi8(yv, xv)), ones);
  } else {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(xv, yv), ones);  // q <= 31: no saturation
  }
}

// Sum of the lanes of v that hold min/offset terms: odd lanes ([d*dy, m*s] pairs) for the
// Q8_1 formats, even lanes ([d*dy*off, junk]) for the offset formats. The other lanes may hold
// anything (the fp16 header's second half is not a scale for Q4_0/Q5_0).
template <B32Kind K>
inline float min_lanes(__m256 v) {
  constexpr int kOddLanes = 0xAA;
  return hsum_ps(_mm256_blend_ps(_mm256_setzero_ps(), v, B32<K>::kMin ? kOddLanes : 0x55));
}

// fp16 [d, m] of blocks b[0 .. min(4, n)) as floats [d0 m0 d1 m1 d2 m2 d3 m3]; zero for blocks
// at or past n. For formats without m the odd lanes hold whatever follows d.
template <typename Block>
inline __m256 header4(const Block* b, int n) {
  __m128 h[4];
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    h[k] = n > k ? _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + k)))
                 : _mm_setzero_ps();
  }
  const __m128 lo = _mm_movelh_ps(h[0], h[1]), hi = _mm_movelh_ps(h[2], h[3]);
  return _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
}

// Rows [r, r + R) for T tokens: y[t * n_out + r + i].
template <B32Kind K, int R, int T>
void matvec_b32(const WeightView& w, int64_t r, const uint8_t* acts, size_t act_row_bytes,
                float* y) {
  using F = B32<K>;
  using Block = typename F::Block;
  constexpr bool kHasMin = F::kMin || F::kOffset != 0;
  const int64_t nb = w.n_in / kQK32;
  const Block* row[R];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    row[i] = reinterpret_cast<const Block*>(static_cast<const uint8_t*>(w.data) +
                                            static_cast<size_t>(r + i) * w.row_bytes);
  }
  ActB32View a[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t)
    a[t] = act_b32_view(acts + static_cast<size_t>(t) * act_row_bytes, nb);

  __m256 acc[R][T], macc[R][T];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[i][t] = macc[i][t] = _mm256_setzero_ps();
  }
  // [token][row][block] pairs [d_x * d_y, m * s]; only the even lanes are read below.
  alignas(32) float dd[T][R][2 * kChunk];

  for (int64_t b0 = 0; b0 < nb; b0 += kChunk) {
    const int nbc = static_cast<int>(std::min<int64_t>(kChunk, nb - b0));
    for (int b = 0; b < nbc; b += 4) {
      // Headers of 4 blocks -> [d0 m0 d1 m1 d2 m2 d3 m3]; blocks past the end read as zero.
      __m256 h[R];
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) h[i] = header4(row[i] + b0 + b, nbc - b);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const __m256 ds = _mm256_loadu_ps(a[t].ds + 2 * (b0 + b));
#pragma GCC unroll 8
        for (int i = 0; i < R; ++i) {
          const __m256 p = _mm256_mul_ps(h[i], ds);
          _mm256_store_ps(dd[t][i] + 2 * b, p);
          if constexpr (F::kMin) {
            macc[i][t] = _mm256_add_ps(macc[i][t], p);
          } else if constexpr (F::kOffset != 0) {
            macc[i][t] = _mm256_fmadd_ps(p, _mm256_loadu_ps(a[t].off + 2 * (b0 + b)), macc[i][t]);
          }
        }
      }
    }
    for (int b = 0; b < nbc; ++b) {
      __m256i yv[T];
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t)
        yv[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[t].qs + (b0 + b) * kQK32));
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) {
        const __m256i xv = F::values(row[i] + b0 + b);
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
          const __m256 s = _mm256_broadcast_ss(dd[t][i] + 2 * b);
          acc[i][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block_dot<K>(xv, yv[t])), s, acc[i][t]);
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      float v = hsum_ps(acc[i][t]);
      if constexpr (kHasMin) v += min_lanes<K>(macc[i][t]);
      y[t * w.n_out + r + i] = v;
    }
  }
}

// ---- dispatch --------------------------------------------------------------------------------

using MatvecFn = void (*)(const WeightView&, int64_t, const uint8_t*, size_t, float*);

// Rows per call: R * T accumulators and R * T min accumulators must fit the 16 registers.
constexpr int matvec_rows(int64_t n_tokens) {
  return n_tokens <= 2 ? 4 : 2;
}

struct MatvecKernels {
  MatvecFn main[kMaxMatvecTokens + 1];    // by token count: matvec_rows(T) rows per call
  MatvecFn single[kMaxMatvecTokens + 1];  // one row, for a range's tail
};

template <B32Kind K>
constexpr MatvecKernels b32_matvec() {
  return {{nullptr, matvec_b32<K, matvec_rows(1), 1>, matvec_b32<K, matvec_rows(2), 2>,
           matvec_b32<K, matvec_rows(3), 3>, matvec_b32<K, matvec_rows(4), 4>},
          {nullptr, matvec_b32<K, 1, 1>, matvec_b32<K, 1, 2>, matvec_b32<K, 1, 3>,
           matvec_b32<K, 1, 4>}};
}

const MatvecKernels* matvec_kernels(GgmlType type) {
  static const MatvecKernels q4_0 = b32_matvec<B32Kind::kQ4_0>(),
                             q4_1 = b32_matvec<B32Kind::kQ4_1>(),
                             q5_0 = b32_matvec<B32Kind::kQ5_0>(),
                             q5_1 = b32_matvec<B32Kind::kQ5_1>(),
                             q8_0 = b32_matvec<B32Kind::kQ8_0>();
  switch (type) {
    case GgmlType::Q4_0:
      return &q4_0;
    case GgmlType::Q4_1:
      return &q4_1;
    case GgmlType::Q5_0:
      return &q5_0;
    case GgmlType::Q5_1:
      return &q5_1;
    case GgmlType::Q8_0:
      return &q8_0;
    default:
      return nullptr;
  }
}

int b32_offset(GgmlType type) {
  return type == GgmlType::Q4_0 ? 8 : type == GgmlType::Q5_0 ? 16 : 0;
}

}  // namespace

MatvecPlan avx2_matvec_plan(GgmlType type, int64_t n_in) {
  MatvecPlan plan;
  if (matvec_kernels(type) != nullptr) {
    plan.supported = true;
    plan.act_row_bytes = act_b32_bytes(n_in / kQK32);
    plan.act_row_bytes = (plan.act_row_bytes + 63) / 64 * 64;
  }
  return plan;
}

void avx2_matvec_prepare(GgmlType type, int64_t n_in, const float* x, uint8_t* acts) {
  assert(matvec_kernels(type) != nullptr);
  const bool q8_1 = traits(type)->vec_dot_type == GgmlType::Q8_1;
  prepare_b32(n_in, x, q8_1, b32_offset(type), acts);
}

void avx2_matvec_rows(const WeightView& w, const uint8_t* acts, size_t act_row_bytes,
                      int64_t n_tokens, int64_t r0, int64_t r1, float* y) {
  const MatvecKernels* mk = matvec_kernels(w.type);
  assert(mk != nullptr && n_tokens >= 1 && n_tokens <= kMaxMatvecTokens);
  const int rows = matvec_rows(n_tokens);
  int64_t r = r0;
  for (; r + rows <= r1; r += rows) mk->main[n_tokens](w, r, acts, act_row_bytes, y);
  for (; r < r1; ++r) mk->single[n_tokens](w, r, acts, act_row_bytes, y);
}

}  // namespace bie::cpu
