// AVX-512 (F/BW/VL/VNNI) matrix-vector kernels for decode (1 to kMaxMatvecTokensAvx512 tokens),
// the 512-bit twins of matvec_avx2.cpp's K-quant kernels: weight rows are read in place, R rows
// at a time; each super-block of a row is unpacked once and dotted with every token. A CPU
// backend's weights are repacked on AVX-512 (matmul_packed_avx512.cpp) and decode on those; these
// kernels run for a matrix that was not (a raw WeightView, or a failed allocation).
//
// Per 64 weight bytes and token the AVX2 kernels spend maddubs + madd + add on each half; here
// one maddubs (u8 x s8 -> pairs of i16) and one vpdpwssd (VNNI: i16 pairs x group scales,
// accumulated into i32) do the whole 64 bytes, so the integer sum of a super-block needs no
// float work. The mins (Q4_K) and the -32 offset (Q6_K) come from the activations' per-16 sums.
//
// Activations: Q8_K blocks as ggml quantises them (traits(Q8_K)->from_float), with one private
// twist for Q4_K: in each 128-value half the second and third 32-value quarters trade places, so
// that one 512-bit load holds the activations of the low nibbles of 64 weight bytes (values
// 0..31 and 64..95) and the next one those of the high nibbles (32..63, 96..127).
//
// Every (row, token) sum is built in the same order whatever R and T are, so a token's result
// does not depend on the tokens it is batched with. Built with -mavx512f -mavx512bw -mavx512vl
// -mavx512vnni (and AVX2/FMA/F16C); called only after has_avx512().
// GCC 12's AVX-512 intrinsics pass _mm512_undefined_*() as the masked-off source, which its own
// -Wuninitialized flags inside the headers (a false positive: no lane of it is ever read).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <type_traits>
#include <utility>

#include "backend/cpu/matmul_kernels.h"
#include "backend/cpu/matvec_b32_inl.h"
#include "bie/common/simd_avx2.h"
#include "bie/quant/blocks.h"
#include "bie/quant/traits.h"

namespace bie::cpu {

namespace {

using namespace quant;  // NOLINT

// Same prefetch policy as the AVX2 kernels (see matvec_avx2.cpp).
constexpr size_t kPrefetchBytes = 4096;

inline void prefetch_ahead(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p) + kPrefetchBytes;
  for (size_t off = 0; off < n; off += 64) _mm_prefetch(c + off, _MM_HINT_T0);
}

inline __m512i load512(const void* p) {
  return _mm512_loadu_si512(p);
}
inline __m256i load256(const void* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

inline float h2f(half_bits h) {
  return _cvtsh_ss(h);
}

// Index vectors for vpermw: int16 lane i of the result takes lane idx[i] of the source.
// Two groups of 32 (Q4_K): lanes 0..15 <- a, 16..31 <- b.
inline __m512i spread2(int a, int b) {
  return _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16(static_cast<int16_t>(a)),
                                 _mm512_set1_epi16(static_cast<int16_t>(b)));
}
// Four groups of 16 (Q6_K): lanes 8k..8k+7 <- g + k.
inline __m512i spread4(int g) {
  const __m512i lo = spread2(g, g + 2);
  const __m512i hi = spread2(g + 1, g + 3);
  // lanes 0-7 g, 8-15 g+1, 16-23 g+2, 24-31 g+3
  return _mm512_mask_blend_epi16(0xFF00FF00u, lo, hi);
}

// 16 int32 lanes -> the 8 of the AVX2 kernels: lane k of a 256-bit madd covers bytes 4k..4k+3 of
// a 32-byte piece, and lanes k and k + 8 here cover the same bytes of the two pieces of one
// 64-byte register. Integer sums are exact, so after this fold every float operation (and the
// final horizontal sum) is the AVX2 kernels' own, in their order: the AVX-512 and AVX2 decode
// paths give the same bits (the engine may compute one token on either path).
inline __m256i fold(__m512i v) {
  return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

// ---- Q4_K --------------------------------------------------------------------------------------
struct KQ4 {
  using Block = BlockQ4_K;
  // Swaps quarters 1 and 2 of each 128-value half (see the file comment); per-32 sums of the
  // activations for the mins (q8k_sums_per_32).
  static void reorder(BlockQ8_K& b) {
    for (int h = 0; h < 2; ++h) {
      int8_t tmp[32];
      std::memcpy(tmp, b.qs + 128 * h + 32, 32);
      std::memcpy(b.qs + 128 * h + 32, b.qs + 128 * h + 64, 32);
      std::memcpy(b.qs + 128 * h + 64, tmp, 32);
    }
    q8k_sums_per_32(b);
  }
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
    const __m512i sc = _mm512_zextsi128_si512(_mm_cvtepu8_epi16(sm));  // sc[0..7] in lanes 0..7
    const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i isum[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) isum[t] = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m512i q = load512(x.qs + 64 * h);
      const __m512i ql = _mm512_and_si512(q, m4);
      const __m512i qh = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
      // 64 weight bytes hold groups 4h, 4h+2 (low nibbles) and 4h+1, 4h+3 (high nibbles).
      const __m512i sl = _mm512_permutexvar_epi16(spread2(4 * h, 4 * h + 2), sc);
      const __m512i sh = _mm512_permutexvar_epi16(spread2(4 * h + 1, 4 * h + 3), sc);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        isum[t] =
            _mm512_dpwssd_epi32(isum[t], _mm512_maddubs_epi16(ql, load512(y[t]->qs + 128 * h)), sl);
        isum[t] = _mm512_dpwssd_epi32(
            isum[t], _mm512_maddubs_epi16(qh, load512(y[t]->qs + 128 * h + 64)), sh);
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
      const __m256i i8 = fold(isum[t]);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i8), _mm256_mul_ps(d, yd), acc[t]);
      acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(_mm256_zextsi128_si256(msum)),
                                _mm256_mul_ps(dmin, yd), acc[t]);
    }
  }
};

// ---- Q6_K --------------------------------------------------------------------------------------
struct KQ6 {
  using Block = BlockQ6_K;
  static void reorder(BlockQ8_K&) {}
  template <int T>
  [[gnu::always_inline]] static void superblock(const Block& x, const BlockQ8_K* const y[T],
                                                __m256 acc[T]) {
    const __m256i sc16 =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales)));
    const __m512i sc = _mm512_zextsi256_si512(sc16);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    // Per 16-bit lane shifts: the low 256 bits of a broadcast qh make weights 0..31 of the half,
    // the high 256 bits weights 32..63 (and 64..95 / 96..127 for the high nibbles).
    const __m512i shl =
        _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16(4), _mm512_set1_epi16(2));
    const __m512i shr =
        _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_setzero_si512(), _mm512_set1_epi16(2));
    __m512i isum[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) isum[t] = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m512i l = load512(x.ql + 64 * h);
      const __m512i qh = _mm512_broadcast_i64x4(load256(x.qh + 32 * h));
      const __m512i qlo = _mm512_or_si512(_mm512_and_si512(l, m4),
                                          _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30));
      const __m512i qhi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                          _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30));
      const __m512i slo = _mm512_permutexvar_epi16(spread4(8 * h), sc);
      const __m512i shi = _mm512_permutexvar_epi16(spread4(8 * h + 4), sc);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        isum[t] = _mm512_dpwssd_epi32(isum[t],
                                      _mm512_maddubs_epi16(qlo, load512(y[t]->qs + 128 * h)), slo);
        isum[t] = _mm512_dpwssd_epi32(
            isum[t], _mm512_maddubs_epi16(qhi, load512(y[t]->qs + 128 * h + 64)), shi);
      }
    }
    const __m256 d = _mm256_set1_ps(h2f(x.d));
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(sc16, load256(y[t]->bsums)), 5);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(fold(isum[t]), off)),
                               _mm256_mul_ps(d, _mm256_broadcast_ss(&y[t]->d)), acc[t]);
    }
  }
};

// Rows [r, r + R) for T tokens: y[t * n_out + r + i].
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
    for (int i = 0; i < R; ++i) y[t * w.n_out + r + i] = bie::simd::hsum(acc[i][t]);
  }
}

template <typename KF>
void prepare_k(int64_t n_in, const float* x, uint8_t* out) {
  traits(GgmlType::Q8_K)->from_float(x, out, n_in);
  auto* b = reinterpret_cast<BlockQ8_K*>(out);
  for (int64_t i = 0; i < n_in / kQKK; ++i) KF::reorder(b[i]);
}

size_t act_k_bytes(int64_t n_in) {
  return static_cast<size_t>(n_in / kQKK) * sizeof(BlockQ8_K);
}

// ---- dispatch --------------------------------------------------------------------------------

using MatvecFn = void (*)(const WeightView&, int64_t, const uint8_t*, size_t, float*);

constexpr int kMaxT = kMaxMatvecTokensAvx512;

struct MatvecKernels {
  size_t (*act_bytes)(int64_t n_in);
  void (*prepare)(int64_t n_in, const float* x, uint8_t* acts);
  // By token count: one row per call, as for the AVX2 kernels (matvec_b32_inl.h; here cold
  // 2-thread Q4_K 1536x8960 decode went from 11 to 27 GiB/s and Q6_K 8960x1536 from 22 to 37 on
  // an AMD EPYC (Zen 4) VM against 4 rows per call, BM_MatmulIsa).
  MatvecFn row[kMaxT + 1];
  int max_tokens = kMaxT;  // most tokens per call
};

template <typename KF, int... T>
constexpr MatvecKernels k_matvec(std::integer_sequence<int, T...>) {
  return {act_k_bytes,
          prepare_k<KF>,
          {nullptr, matvec_k<KF, 1, T + 1>...}};
}
template <typename KF>
constexpr MatvecKernels k_matvec() {
  return k_matvec<KF>(std::make_integer_sequence<int, kMaxT>{});
}

// The 32-value formats: matvec_b32_inl.h's template built for this ISA (vpdpbusd, masked
// fifth bits), with the AVX2 kernels' rows, token groups and activation layout, so their bits.
template <b32::B32Kind K>
constexpr MatvecKernels b32_matvec() {
  using b32::matvec_b32;
  return {[](int64_t n_in) { return b32::act_b32_bytes<K>(n_in / quant::kQK32); },
          b32::prepare_b32<K>,
          {nullptr, matvec_b32<K, 1, 1>, matvec_b32<K, 1, 2>, matvec_b32<K, 1, 3>,
           matvec_b32<K, 1, 4>},
          kMaxMatvecTokens};
}

const MatvecKernels* matvec_kernels(GgmlType type) {
  using b32::B32Kind;
  static const MatvecKernels q4_k = k_matvec<KQ4>(), q6_k = k_matvec<KQ6>();
  static const MatvecKernels b32s[] = {
      b32_matvec<B32Kind::kQ4_0>(), b32_matvec<B32Kind::kQ4_1>(), b32_matvec<B32Kind::kQ5_0>(),
      b32_matvec<B32Kind::kQ5_1>(), b32_matvec<B32Kind::kQ8_0>()};
  if (const int i = b32::b32_index(type); i >= 0) return &b32s[i];
  switch (type) {
    case GgmlType::Q4_K:
      return &q4_k;
    case GgmlType::Q6_K:
      return &q6_k;
    default:
      return nullptr;
  }
}

}  // namespace

MatvecPlan avx512_matvec_plan(GgmlType type, int64_t n_in) {
  MatvecPlan plan;
  if (const MatvecKernels* mk = matvec_kernels(type)) {
    plan.supported = true;
    plan.act_row_bytes = (mk->act_bytes(n_in) + 63) / 64 * 64;
    plan.max_tokens = mk->max_tokens;
  }
  return plan;
}

void avx512_matvec_prepare(GgmlType type, int64_t n_in, const float* x, uint8_t* acts) {
  const MatvecKernels* mk = matvec_kernels(type);
  assert(mk != nullptr);
  mk->prepare(n_in, x, acts);
}

void avx512_matvec_rows(const WeightView& w, const uint8_t* acts, size_t act_row_bytes,
                        int64_t n_tokens, int64_t r0, int64_t r1, float* y) {
  const MatvecKernels* mk = matvec_kernels(w.type);
  assert(mk != nullptr && n_tokens >= 1 && n_tokens <= mk->max_tokens);
  const auto* head = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r0) * w.row_bytes;
  const size_t head_bytes = std::min(kPrefetchBytes, static_cast<size_t>(r1 - r0) * w.row_bytes);
  for (size_t off = 0; off < head_bytes; off += 64) _mm_prefetch(head + off, _MM_HINT_T0);
  for (int64_t r = r0; r < r1; ++r) mk->row[n_tokens](w, r, acts, act_row_bytes, y);
}

}  // namespace bie::cpu
