// Tiled AVX-512 (F/BW/VL/VNNI) matmul for the K-quants and the 32-value block formats
// (prefill): the 512-bit twins of matmul_avx2.cpp's quantised tiles. A panel holds 16 weight rows
// (one per int32 lane) in the unified qu form (quant_internal.h), 4-byte chunk c of the 16 rows in
// one 64-byte register, so one broadcast of a token's 4 activation bytes feeds 16 rows through one
// vpdpbusd (u8 x s8, four products summed into each int32 lane, no int16 saturation step). A
// group's chunks (16 values, or 32 for Q4_K/Q5_K whose two halves share a scale) accumulate into a
// fresh int32 vector that is then multiplied by the rows' group scales (vpmulld) and added to the
// block sum.
//
// Bits: every integer sum is exact and equals the AVX2 kernel's (the same products, only
// grouped differently), and the float part (the mins' and offsets' integer sum, the two fmadds
// per super-block) is the AVX2 kernel's per lane, in its order; so the AVX-512 tiles give the
// AVX2 tiles' bits, and each (row, token) sum is built in one order whatever the token tile, so
// a token's result does not depend on its batch. Activations: the AVX2 tiles' layout (Q8_K
// blocks as ggml quantises them; ActB32 for the 32-value formats).
// 32-value formats (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0): the same panel shape per block of 32 (8 chunks),
// one vpdpbusd per chunk and token into the block's int32 sum. The weights go in unsigned:
// Q4_0/Q5_0 without their offset (8, 16) and Q8_0 as q + 128, the offset coming back as
// offset * sum(a) in integers, so the integer dot is exact and equals the AVX2 kernel's.
// Called only after has_avx512().
// GCC 12's AVX-512 intrinsics pass _mm512_undefined_*() as the masked-off source, which its own
// -Wuninitialized flags inside the headers (a false positive: no lane of it is ever read).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <type_traits>

#include "backend/cpu/avx512_inl.h"
#include "backend/cpu/matmul_kernels.h"
#include "bie/quant/blocks.h"
#include "bie/quant/traits.h"
#include "quant/quant_avx2_inl.h"

namespace bie::cpu {

namespace {

using namespace quant;        // NOLINT
using namespace quant::simd;  // NOLINT

constexpr int kRows = 16;   // rows per panel (one per int32 lane)
constexpr int kTokens = 8;  // tokens per micro-kernel call

// Panel per super-block: Avx512KPanel (matmul_kernels.h).
constexpr size_t kScOff = Avx512KPanel::kScOff, kMOff = Avx512KPanel::kMOff,
                 kDOff = Avx512KPanel::kDOff, kDminOff = Avx512KPanel::kDminOff,
                 kPanelBytes = Avx512KPanel::kBytes;

// Q4_K and Q5_K have 8 groups of 32 (each scale covers two of the unified groups of 16).
template <typename U>
constexpr int group_chunks() {
  return std::is_same_v<U, UnpackQ4K> || std::is_same_v<U, UnpackQ5K> ? 8 : 4;
}

template <typename U>
void pack(const WeightView& w, int64_t r0, int n_valid, uint8_t* panel) {
  using Block = typename U::Block;
  const int64_t nb = w.n_in / kQKK;
  const auto* base = static_cast<const uint8_t*>(w.data);
  KRegs regs[kRows];
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* p = panel + b * kPanelBytes;
    auto* scv = reinterpret_cast<int32_t*>(p + kScOff);
    auto* mv = reinterpret_cast<uint32_t*>(p + kMOff);
    auto* d = reinterpret_cast<float*>(p + kDOff);
    auto* dmin = reinterpret_cast<float*>(p + kDminOff);
    for (int r = 0; r < kRows; ++r) {
      if (r < n_valid) {
        U::run(reinterpret_cast<const Block*>(base + static_cast<size_t>(r0 + r) * w.row_bytes)[b],
               regs[r]);
      } else {
        for (auto& q : regs[r].q) q = _mm256_setzero_si256();
        std::memset(regs[r].sc, 0, sizeof(regs[r].sc));
        std::memset(regs[r].m, 0, sizeof(regs[r].m));
        regs[r].d = regs[r].dmin = 0.0f;
      }
      d[r] = regs[r].d;
      dmin[r] = regs[r].dmin;
    }
    // Rows to lanes by 8x8 transposes of 32-bit elements: the qu chunks, the group scales
    // (widened to int32) and the min pairs (m[2h], m[2h+1]), which are the 32-bit words of m.
    for (int half = 0; half < 2; ++half) {
      const KRegs* rr = regs + 8 * half;
      __m256i rows[8], cols[8];
      for (int cv = 0; cv < 8; ++cv) {
        for (int i = 0; i < 8; ++i) rows[i] = rr[i].q[cv];
        transpose8x32(rows, cols);
        for (int j = 0; j < 8; ++j) {
          _mm256_store_si256(reinterpret_cast<__m256i*>(p + 64 * (8 * cv + j) + 32 * half),
                             cols[j]);
        }
      }
      for (int gh = 0; gh < 2; ++gh) {
        for (int i = 0; i < 8; ++i) {
          rows[i] = _mm256_cvtepi16_epi32(
              _mm_load_si128(reinterpret_cast<const __m128i*>(rr[i].sc + 8 * gh)));
        }
        transpose8x32(rows, cols);
        for (int j = 0; j < 8; ++j) {
          _mm256_store_si256(reinterpret_cast<__m256i*>(scv + (8 * gh + j) * kRows + 8 * half),
                             cols[j]);
        }
      }
      for (int i = 0; i < 8; ++i)
        rows[i] = _mm256_load_si256(reinterpret_cast<const __m256i*>(rr[i].m));
      transpose8x32(rows, cols);
      for (int h = 0; h < 8; ++h) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(mv + h * kRows + 8 * half), cols[h]);
      }
    }
  }
}

template <typename U, int T>
void kernel(const uint8_t* panel, int64_t nb, const uint8_t* acts, size_t act_row_bytes, float* y,
            int64_t n_out, int n_valid) {
  constexpr int kGroup = group_chunks<U>();
  const BlockQ8_K* a[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t)
    a[t] = reinterpret_cast<const BlockQ8_K*>(acts + static_cast<size_t>(t) * act_row_bytes);
  __m512 acc[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = panel + b * kPanelBytes;
    __m512i isum[T];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) isum[t] = _mm512_setzero_si512();
    for (int c0 = 0; c0 < 64; c0 += kGroup) {
      __m512i gsum[T];
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) gsum[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int c = c0; c < c0 + kGroup; ++c) {
        const __m512i wv = _mm512_load_si512(p + 64 * c);
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t)
          gsum[t] = _mm512_dpbusd_epi32(gsum[t], wv, bcast32(a[t][b].qs + 4 * c));
      }
      const __m512i scv = _mm512_load_si512(p + kScOff + 64 * (c0 / 4));
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t)
        isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(gsum[t], scv));
    }
    const __m512 dv = _mm512_load_ps(p + kDOff);
    const __m512 dminv = _mm512_load_ps(p + kDminOff);
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      __m512i msum = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int h = 0; h < 8; ++h) {
        msum = _mm512_dpwssd_epi32(msum, _mm512_load_si512(p + kMOff + 64 * h),
                                   bcast32(a[t][b].bsums + 2 * h));
      }
      const __m512 da = _mm512_set1_ps(a[t][b].d);
      if constexpr (U::kSym) {
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(isum[t], msum)),
                                 _mm512_mul_ps(dv, da), acc[t]);
      } else {
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dv, da), acc[t]);
        acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dminv, da), acc[t]);
      }
    }
  }
  const auto mask = static_cast<__mmask16>((1u << n_valid) - 1u);
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + t * n_out, mask, acc[t]);
}

// ---- 32-value block formats -------------------------------------------------------------------
//
// Panel per block: 8 chunks x 16 rows x 4 bytes of unsigned values, then d[16], m[16] (fp32).
constexpr size_t kB32DOff = Avx512B32Panel::kDOff, kB32MOff = Avx512B32Panel::kMOff,
                 kB32PanelBytes = Avx512B32Panel::kBytes;

enum class B32Kind { kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0 };

template <B32Kind K>
struct B32;
template <>
struct B32<B32Kind::kQ4_0> {
  using Block = BlockQ4_0;
  static constexpr int kOffset = 8;
  static constexpr bool kMin = false;
  static __m256i values(const Block& b) { return nibbles32(b.qs); }
  static float min(const Block&) { return 0.0f; }
};
template <>
struct B32<B32Kind::kQ4_1> {
  using Block = BlockQ4_1;
  static constexpr int kOffset = 0;
  static constexpr bool kMin = true;
  static __m256i values(const Block& b) { return nibbles32(b.qs); }
  static float min(const Block& b) { return h2f(b.m); }
};
inline __m256i q5_values(const uint8_t* qs, const uint8_t* qh) {
  return _mm256_or_si256(nibbles32(qs),
                         _mm256_and_si256(bits32_to_mask(qh), _mm256_set1_epi8(0x10)));
}
template <>
struct B32<B32Kind::kQ5_0> {
  using Block = BlockQ5_0;
  static constexpr int kOffset = 16;
  static constexpr bool kMin = false;
  static __m256i values(const Block& b) { return q5_values(b.qs, b.qh); }
  static float min(const Block&) { return 0.0f; }
};
template <>
struct B32<B32Kind::kQ5_1> {
  using Block = BlockQ5_1;
  static constexpr int kOffset = 0;
  static constexpr bool kMin = true;
  static __m256i values(const Block& b) { return q5_values(b.qs, b.qh); }
  static float min(const Block& b) { return h2f(b.m); }
};
template <>
struct B32<B32Kind::kQ8_0> {
  using Block = BlockQ8_0;
  static constexpr int kOffset = 128;
  static constexpr bool kMin = false;
  static __m256i values(const Block& b) {  // q + 128 as an unsigned byte
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs)),
                            _mm256_set1_epi8(static_cast<char>(0x80)));
  }
  static float min(const Block&) { return 0.0f; }
};

template <B32Kind K>
void pack_b32(const WeightView& w, int64_t r0, int n_valid, uint8_t* panel) {
  using Tr = B32<K>;
  using Block = typename Tr::Block;
  const int64_t nb = w.n_in / kQK32;
  const auto* base = static_cast<const uint8_t*>(w.data);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* p = panel + b * kB32PanelBytes;
    auto* d = reinterpret_cast<float*>(p + kB32DOff);
    auto* m = reinterpret_cast<float*>(p + kB32MOff);
    for (int half = 0; half < 2; ++half) {
      __m256i rows[8], cols[8];
      for (int i = 0; i < 8; ++i) {
        const int r = 8 * half + i;
        if (r < n_valid) {
          const auto* blk =
              reinterpret_cast<const Block*>(base + static_cast<size_t>(r0 + r) * w.row_bytes) + b;
          rows[i] = Tr::values(*blk);
          d[r] = h2f(blk->d);
          m[r] = Tr::min(*blk);
        } else {
          rows[i] = _mm256_setzero_si256();
          d[r] = m[r] = 0.0f;
        }
      }
      transpose8x32(rows, cols);
      for (int c = 0; c < 8; ++c)
        _mm256_store_si256(reinterpret_cast<__m256i*>(p + 64 * c + 32 * half), cols[c]);
    }
  }
}

template <B32Kind K, int T>
void kernel_b32(const uint8_t* panel, int64_t nb, const uint8_t* acts, size_t act_row_bytes,
                float* y, int64_t n_out, int n_valid) {
  using Tr = B32<K>;
  const ActB32* a[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t)
    a[t] = reinterpret_cast<const ActB32*>(acts + static_cast<size_t>(t) * act_row_bytes);
  __m512 acc[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = panel + b * kB32PanelBytes;
    __m512i isum[T];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) isum[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      const __m512i wv = _mm512_load_si512(p + 64 * c);
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t)
        isum[t] = _mm512_dpbusd_epi32(isum[t], wv, bcast32(a[t][b].qs + 4 * c));
    }
    const __m512 dv = _mm512_load_ps(p + kB32DOff);
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      __m512i iv = isum[t];
      if constexpr (Tr::kOffset != 0)
        iv = _mm512_sub_epi32(iv, _mm512_set1_epi32(Tr::kOffset * a[t][b].isum));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iv), _mm512_mul_ps(dv, _mm512_set1_ps(a[t][b].d)),
                               acc[t]);
      if constexpr (Tr::kMin)
        acc[t] = _mm512_fmadd_ps(_mm512_load_ps(p + kB32MOff), _mm512_set1_ps(a[t][b].s), acc[t]);
    }
  }
  const auto mask = static_cast<__mmask16>((1u << n_valid) - 1u);
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + t * n_out, mask, acc[t]);
}

using PackFn = void (*)(const WeightView&, int64_t, int, uint8_t*);
using KernelFn = void (*)(const uint8_t*, int64_t, const uint8_t*, size_t, float*, int64_t, int);

struct Kernels {
  PackFn pack;
  KernelFn k[kTokens + 1];  // by token count 1..kTokens
  int64_t values_per_block;
  size_t panel_block_bytes;
  size_t act_block_bytes;
};

template <typename U>
constexpr Kernels k_kernels() {
  return {pack<U>,
          {nullptr, kernel<U, 1>, kernel<U, 2>, kernel<U, 3>, kernel<U, 4>, kernel<U, 5>,
           kernel<U, 6>, kernel<U, 7>, kernel<U, 8>},
          kQKK,
          kPanelBytes,
          sizeof(BlockQ8_K)};
}

template <B32Kind K>
constexpr Kernels b32_kernels() {
  return {pack_b32<K>,
          {nullptr, kernel_b32<K, 1>, kernel_b32<K, 2>, kernel_b32<K, 3>, kernel_b32<K, 4>,
           kernel_b32<K, 5>, kernel_b32<K, 6>, kernel_b32<K, 7>, kernel_b32<K, 8>},
          kQK32,
          kB32PanelBytes,
          sizeof(ActB32)};
}

const Kernels* kernels(GgmlType type) {
  static const Kernels q2_k = k_kernels<UnpackQ2K>(), q3_k = k_kernels<UnpackQ3K>(),
                       q4_k = k_kernels<UnpackQ4K>(), q5_k = k_kernels<UnpackQ5K>(),
                       q6_k = k_kernels<UnpackQ6K>();
  static const Kernels q4_0 = b32_kernels<B32Kind::kQ4_0>(), q4_1 = b32_kernels<B32Kind::kQ4_1>(),
                       q5_0 = b32_kernels<B32Kind::kQ5_0>(), q5_1 = b32_kernels<B32Kind::kQ5_1>(),
                       q8_0 = b32_kernels<B32Kind::kQ8_0>();
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

TilePlan avx512_tile_plan(GgmlType type, int64_t n_in) {
  TilePlan plan;
  if (const Kernels* ks = kernels(type)) {
    const auto nb = static_cast<size_t>(n_in / ks->values_per_block);
    plan.supported = true;
    plan.rows_per_panel = kRows;
    plan.act_row_bytes = nb * ks->act_block_bytes;
    plan.panel_bytes = nb * ks->panel_block_bytes;
  }
  return plan;
}

void avx512_prepare_acts(GgmlType type, int64_t n_in, const float* x, int64_t t0, int64_t t1,
                         uint8_t* acts) {
  assert(kernels(type) != nullptr);
  avx2_prepare_acts(type, n_in, x, t0, t1, acts);  // the same layout (and bits)
}

void avx512_tile_panel(GgmlType type, const uint8_t* panel, int64_t nb, const uint8_t* acts,
                       size_t act_row_bytes, int64_t n_tokens, float* y, int64_t n_out,
                       int n_valid) {
  const Kernels* ks = kernels(type);
  assert(ks != nullptr);
  for (int64_t t = 0; t < n_tokens; t += kTokens) {
    const int nt = static_cast<int>(std::min<int64_t>(kTokens, n_tokens - t));
    ks->k[nt](panel, nb, acts + static_cast<size_t>(t) * act_row_bytes, act_row_bytes,
              y + t * n_out, n_out, n_valid);
  }
}

void avx512_tile_rows(const WeightView& w, const uint8_t* acts, size_t act_row_bytes,
                      int64_t n_tokens, int64_t r0, int64_t r1, float* y, uint8_t* panel) {
  const Kernels* ks = kernels(w.type);
  assert(ks != nullptr);
  const int64_t nb = w.n_in / ks->values_per_block;
  for (int64_t r = r0; r < r1; r += kRows) {
    const int n_valid = static_cast<int>(std::min<int64_t>(kRows, r1 - r));
    ks->pack(w, r, n_valid, panel);
    int64_t t = 0;
    for (; t < n_tokens; t += kTokens) {
      const int nt = static_cast<int>(std::min<int64_t>(kTokens, n_tokens - t));
      ks->k[nt](panel, nb, acts + static_cast<size_t>(t) * act_row_bytes, act_row_bytes,
                y + t * w.n_out + r, w.n_out, n_valid);
    }
  }
}

}  // namespace bie::cpu
