// AVX2 matrix-vector kernels for decode (1 to kMaxMatvecTokens tokens): weight rows are read in
// place (no repacking: each weight byte is used by at most 4 tokens, so a panel would cost more
// than it saves), R rows at a time, so that each activation block load is shared by R rows and
// each weight block unpack by every token.
//
// 32-value formats: scales never go through scalar fp16 conversions in the inner loop. Per chunk
// of blocks, the fp16 [d, m] headers of four blocks of a row are gathered and converted by one
// vcvtph2ps, and multiplied by the activation's [d, s] pairs in one instruction; the inner loop
// then does one broadcast load and one FMA per block. The same product gives the min / offset
// terms of Q4_0, Q4_1, Q5_0 and Q5_1 as a side result, so they cost nothing per block.
// K-quants: one super-block of one row at a time, its scales unpacked once and applied inside the
// integer madd (see below).
// Built with -mavx2 -mfma -mf16c; called only after has_avx2().
#include <immintrin.h>

#include <algorithm>
#include <cassert>
#include <cstring>

#include "backend/cpu/matmul_kernels.h"
#include "bie/quant/blocks.h"
#include "bie/quant/traits.h"
#include "backend/cpu/matvec_b32_inl.h"
#include "quant/quant_avx2_inl.h"

namespace bie::cpu {

namespace {

using namespace quant;        // NOLINT
using namespace quant::simd;  // NOLINT

// ---- 32-value block formats: matvec_b32_inl.h ----------------------------------------------

using namespace b32;  // NOLINT

// ---- K-quants (Q2_K .. Q6_K) -----------------------------------------------------------------
//
// Activations: Q8_K blocks, as vec_dot takes them. Each row's super-block is unpacked once and
// dotted with every token. A group's scale multiplies its maddubs pairs inside the madd that
// widens them, so the integer sum per super-block needs no float work; the mins (and the
// Q3_K/Q6_K offsets) come from the activations' per-16 sums. Q4_K and Q6_K have their own
// unpacking; Q2_K, Q3_K and Q5_K use the unified form of quant_avx2_inl.h (8 vectors of 32
// unsigned values, 16 group scales and mins).

// Byte shuffles that spread int16 lane k of a 128-bit lane to the low half (k = 2c) and lane
// k + 1 to the high half, for c = 0..3.
inline __m256i group_scale_shuffle(int c) {
  const auto lo = static_cast<char>(4 * c), hi = static_cast<char>(4 * c + 2);
  return _mm256_setr_epi8(lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1,
                          lo, lo + 1, lo, lo + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1,
                          hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1);
}

// Generic policy (Q2_K, Q3_K, Q5_K): the shared unpacker of quant_avx2_inl.h.
template <typename U>
struct KUnified {
  using Block = typename U::Block;
  template <int T>
  [[gnu::always_inline]] static void superblock(const Block& x, const BlockQ8_K* const y[T],
                                                __m256 acc[T]) {
    KRegs k;
    U::run(x, k);
    const __m256i sc = _mm256_load_si256(reinterpret_cast<const __m256i*>(k.sc));
    const __m256i sc_lo = _mm256_permute2x128_si256(sc, sc, 0x00);
    const __m256i sc_hi = _mm256_permute2x128_si256(sc, sc, 0x11);
    __m256i isum[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      const __m256i scv = _mm256_shuffle_epi8(c < 4 ? sc_lo : sc_hi, group_scale_shuffle(c % 4));
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const __m256i p = _mm256_maddubs_epi16(k.q[c], load256(y[t]->qs + 32 * c));
        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(scv, p));
      }
    }
    const __m256i m = _mm256_load_si256(reinterpret_cast<const __m256i*>(k.m));
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m256i msum = _mm256_madd_epi16(m, load256(y[t]->bsums));
      if constexpr (U::kSym) {
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum[t], msum)),
                                 _mm256_set1_ps(k.d * y[t]->d), acc[t]);
      } else {
        acc[t] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_set1_ps(k.d * y[t]->d), acc[t]);
        acc[t] =
            _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_set1_ps(k.dmin * y[t]->d), acc[t]);
      }
    }
  }
};

// Byte shuffle that spreads int16 lane k to all 16 lanes (of a register whose halves are equal).
inline __m256i spread_i16(int k) {
  const auto lo = static_cast<char>(2 * k), hi = static_cast<char>(2 * k + 1);
  return _mm256_setr_epi8(lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi,
                          lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi);
}

// Q4_K: 8 groups of 32 with 6-bit scale and min. Scales are unpacked in general registers (four
// 32-bit words), widened once; each group's scale is spread by one shuffle into the madd.
struct KQ4 {
  using Block = BlockQ4_K;
  template <int T>
  [[gnu::always_inline]] static void superblock(const Block& x, const BlockQ8_K* const y[T],
                                                __m256 acc[T]) {
    uint32_t u[3];
    std::memcpy(u, x.scales, 12);
    constexpr uint32_t kLow6 = 0x3F3F3F3F, kLow4 = 0x0F0F0F0F, kLow2 = 0x03030303;
    const uint32_t sc_lo = u[0] & kLow6, m_lo = u[1] & kLow6;
    const uint32_t sc_hi = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);
    const uint32_t m_hi = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);
    const __m128i sm = _mm_set_epi32(static_cast<int>(m_hi), static_cast<int>(m_lo),
                                     static_cast<int>(sc_hi), static_cast<int>(sc_lo));
    const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));  // sc[0..7], twice
    const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i isum[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m256i q = load256(x.qs + 32 * j);
      const __m256i ql = _mm256_and_si256(q, m4);
      const __m256i qh = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      const __m256i sl = _mm256_shuffle_epi8(sc, spread_i16(2 * j));
      const __m256i sh = _mm256_shuffle_epi8(sc, spread_i16(2 * j + 1));
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const __m256i pl =
            _mm256_madd_epi16(sl, _mm256_maddubs_epi16(ql, load256(y[t]->qs + 64 * j)));
        const __m256i ph =
            _mm256_madd_epi16(sh, _mm256_maddubs_epi16(qh, load256(y[t]->qs + 64 * j + 32)));
        isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(pl, ph));
      }
    }
    // d * y.d as a vector product of two broadcasts: the same rounding as the scalar product.
    const __m256 d = _mm256_set1_ps(h2f(x.d)), dmin = _mm256_set1_ps(h2f(x.dmin));
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      // bsums[0..7] hold the per-32 sums (q8k_sums_per_32).
      const __m128i msum =
          _mm_madd_epi16(mins, _mm_loadu_si128(reinterpret_cast<const __m128i*>(y[t]->bsums)));
      const __m256 yd = _mm256_broadcast_ss(&y[t]->d);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(d, yd), acc[t]);
      acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(_mm256_zextsi128_si256(msum)),
                                _mm256_mul_ps(dmin, yd), acc[t]);
    }
  }
  static void prepare(int64_t n_in, const float* x, uint8_t* out) {
    traits(GgmlType::Q8_K)->from_float(x, out, n_in);
    auto* b = reinterpret_cast<BlockQ8_K*>(out);
    for (int64_t i = 0; i < n_in / kQKK; ++i) q8k_sums_per_32(b[i]);
  }
};

// Q6_K: 16 groups of 16 with int8 scales, x = d * sc * (q - 32). The offset is taken out once
// per super-block from the activations' per-16 sums: 32 * sum_g sc[g] * bsums[g].
struct KQ6 {
  using Block = BlockQ6_K;
  template <int T>
  [[gnu::always_inline]] static void superblock(const Block& x, const BlockQ8_K* const y[T],
                                                __m256 acc[T]) {
    const __m256i sc =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales)));
    const __m256i sc_lo = _mm256_permute2x128_si256(sc, sc, 0x00);  // scales 0..7, twice
    const __m256i sc_hi = _mm256_permute2x128_si256(sc, sc, 0x11);  // scales 8..15, twice
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    __m256i isum[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256i l0 = load256(x.ql + 64 * h), l1 = load256(x.ql + 64 * h + 32);
      const __m256i qh = load256(x.qh + 32 * h);
      const __m256i q[4] = {_mm256_or_si256(_mm256_and_si256(l0, m4),
                                            _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)),
                            _mm256_or_si256(_mm256_and_si256(l1, m4),
                                            _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                            _mm256_and_si256(qh, m30)),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                            _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30))};
      const __m256i src = h == 0 ? sc_lo : sc_hi;
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const __m256i scv = _mm256_shuffle_epi8(src, group_scale_shuffle(k));
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
          const __m256i p = _mm256_maddubs_epi16(q[k], load256(y[t]->qs + 32 * (4 * h + k)));
          isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(scv, p));
        }
      }
    }
    const float d = h2f(x.d);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(sc, load256(y[t]->bsums)), 5);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum[t], off)),
                               _mm256_set1_ps(d * y[t]->d), acc[t]);
    }
  }
};

// Rows [r, r + R) for T tokens, one super-block of one row at a time (a super-block is already
// 8 independent 32-value dots: enough to fill the pipelines without interleaving rows).
template <typename KF, int R, int T>
void matvec_k(const WeightView& w, int64_t r, const uint8_t* acts, size_t act_row_bytes, float* y) {
  using Block = typename KF::Block;
  const int64_t nb = w.n_in / kQKK;
  __m256 acc[R][T];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[i][t] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ8_K* yb[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      yb[t] = reinterpret_cast<const BlockQ8_K*>(acts + static_cast<size_t>(t) * act_row_bytes) + b;
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const auto* row = reinterpret_cast<const Block*>(static_cast<const uint8_t*>(w.data) +
                                                       static_cast<size_t>(r + i) * w.row_bytes);
      prefetch_ahead(row + b, sizeof(Block));
      KF::template superblock<T>(row[b], yb, acc[i]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) y[t * w.n_out + r + i] = hsum_ps(acc[i][t]);
  }
}

size_t act_k_bytes(int64_t n_in) {
  return static_cast<size_t>(n_in / kQKK) * sizeof(BlockQ8_K);
}

void prepare_k(int64_t n_in, const float* x, uint8_t* out) {
  traits(GgmlType::Q8_K)->from_float(x, out, n_in);
}

// ---- dispatch --------------------------------------------------------------------------------

using MatvecFn = void (*)(const WeightView&, int64_t, const uint8_t*, size_t, float*);

struct MatvecKernels {
  size_t (*act_bytes)(int64_t n_in);
  void (*prepare)(int64_t n_in, const float* x, uint8_t* acts);
  MatvecFn row[kMaxMatvecTokens + 1];  // by token count: one row per call (matvec_b32_inl.h)
};

template <B32Kind K>
constexpr MatvecKernels b32_matvec() {
  return {[](int64_t n_in) { return act_b32_bytes<K>(n_in / kQK32); },
          prepare_b32<K>,
          {nullptr, matvec_b32<K, 1, 1>, matvec_b32<K, 1, 2>, matvec_b32<K, 1, 3>,
           matvec_b32<K, 1, 4>}};
}

template <typename KF>
constexpr MatvecKernels k_matvec() {
  constexpr auto prepare = [] {
    if constexpr (requires { KF::prepare; }) {
      return KF::prepare;
    } else {
      return prepare_k;
    }
  }();
  return {
      act_k_bytes,
      prepare,
      {nullptr, matvec_k<KF, 1, 1>, matvec_k<KF, 1, 2>, matvec_k<KF, 1, 3>, matvec_k<KF, 1, 4>}};
}

const MatvecKernels* matvec_kernels(GgmlType type) {
  static const MatvecKernels q2_k = k_matvec<KUnified<UnpackQ2K>>(),
                             q3_k = k_matvec<KUnified<UnpackQ3K>>(), q4_k = k_matvec<KQ4>(),
                             q5_k = k_matvec<KUnified<UnpackQ5K>>(), q6_k = k_matvec<KQ6>();
  static const MatvecKernels b32s[] = {
      b32_matvec<B32Kind::kQ4_0>(), b32_matvec<B32Kind::kQ4_1>(), b32_matvec<B32Kind::kQ5_0>(),
      b32_matvec<B32Kind::kQ5_1>(), b32_matvec<B32Kind::kQ8_0>()};
  if (const int i = b32_index(type); i >= 0) return &b32s[i];
  switch (type) {
    case GgmlType::Q2_K:
      return &q2_k;
    case GgmlType::Q3_K:
      return &q3_k;
    case GgmlType::Q4_K:
      return &q4_k;
    case GgmlType::Q5_K:
      return &q5_k;
    case GgmlType::Q6_K:
      return &q6_k;
    default:
      return nullptr;
  }
}

}  // namespace

MatvecPlan avx2_matvec_plan(GgmlType type, int64_t n_in) {
  MatvecPlan plan;
  if (const MatvecKernels* mk = matvec_kernels(type)) {
    plan.supported = true;
    plan.act_row_bytes = (mk->act_bytes(n_in) + 63) / 64 * 64;
  }
  return plan;
}

void avx2_matvec_prepare(GgmlType type, int64_t n_in, const float* x, uint8_t* acts) {
  const MatvecKernels* mk = matvec_kernels(type);
  assert(mk != nullptr);
  mk->prepare(n_in, x, acts);
}

void avx2_matvec_rows(const WeightView& w, const uint8_t* acts, size_t act_row_bytes,
                      int64_t n_tokens, int64_t r0, int64_t r1, float* y) {
  const MatvecKernels* mk = matvec_kernels(w.type);
  assert(mk != nullptr && n_tokens >= 1 && n_tokens <= kMaxMatvecTokens);
  // The prefetch distance is reached only after kPrefetchBytes: request the range's head now.
  const auto* head = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r0) * w.row_bytes;
  const size_t head_bytes = std::min(kPrefetchBytes, static_cast<size_t>(r1 - r0) * w.row_bytes);
  for (size_t off = 0; off < head_bytes; off += 64) _mm_prefetch(head + off, _MM_HINT_T0);
  for (int64_t r = r0; r < r1; ++r) mk->row[n_tokens](w, r, acts, act_row_bytes, y);
}

}  // namespace bie::cpu
