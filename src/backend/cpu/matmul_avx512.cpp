// Tiled AVX-512 (F/BW/VL/VNNI) matmul for the K-quants (prefill): the 512-bit twin of
// matmul_avx2.cpp's K-quant tiles. A panel holds 16 weight rows (one per int32 lane) in the
// unified qu form (quant_internal.h), 4-byte chunk c of the 16 rows in one 64-byte register, so
// one broadcast of a token's 4 activation bytes feeds 16 rows through one vpdpbusd (u8 x s8,
// four products summed into each int32 lane, no int16 saturation step). A group's chunks (16
// values, or 32 for Q4_K/Q5_K whose two halves share a scale) accumulate into a fresh int32
// vector that is then multiplied by the rows' group scales (vpmulld) and added to the block sum.
//
// Bits: every integer sum is exact and equals the AVX2 kernel's (the same products, only
// grouped differently), and the float part (the mins' and offsets' integer sum, the two fmadds
// per super-block) is the AVX2 kernel's per lane, in its order; so the AVX-512 tiles give the
// AVX2 tiles' bits, and each (row, token) sum is built in one order whatever the token tile, so
// a token's result does not depend on its batch. Activations: Q8_K blocks as ggml quantises
// them, the AVX2 tiles' layout. Called only after has_avx512().
// GCC 12's AVX-512 intrinsics pass _mm512_undefined_*() as the masked-off source, which its own
// -Wuninitialized flags inside the headers (a false positive: no lane of it is ever read).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <type_traits>

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

// Panel per super-block: 64 chunks x 16 rows x 4 bytes of qu, then per group g of 16 the rows'
// int32 scales, per pair of groups h an int16 pair (m[2h], m[2h+1]) per row, then d[16],
// dmin[16] (fp32).
constexpr size_t kQBytes = 64 * 64;
constexpr size_t kScOff = kQBytes, kMOff = kScOff + 16 * 64, kDOff = kMOff + 8 * 64,
                 kDminOff = kDOff + 64, kPanelBytes = kDminOff + 64;

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
      for (int g = 0; g < 16; ++g) scv[g * kRows + r] = regs[r].sc[g];
      for (int h = 0; h < 8; ++h) {
        mv[h * kRows + r] =
            static_cast<uint16_t>(regs[r].m[2 * h]) |
            (static_cast<uint32_t>(static_cast<uint16_t>(regs[r].m[2 * h + 1])) << 16);
      }
      d[r] = regs[r].d;
      dmin[r] = regs[r].dmin;
    }
    for (int cv = 0; cv < 8; ++cv) {
      for (int half = 0; half < 2; ++half) {
        __m256i rows[8], cols[8];
        for (int r = 0; r < 8; ++r) rows[r] = regs[8 * half + r].q[cv];
        transpose8x32(rows, cols);
        for (int j = 0; j < 8; ++j) {
          _mm256_store_si256(reinterpret_cast<__m256i*>(p + 64 * (8 * cv + j) + 32 * half),
                             cols[j]);
        }
      }
    }
  }
}

inline __m512i bcast32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
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

using PackFn = void (*)(const WeightView&, int64_t, int, uint8_t*);
using KernelFn = void (*)(const uint8_t*, int64_t, const uint8_t*, size_t, float*, int64_t, int);

struct Kernels {
  PackFn pack;
  KernelFn k[kTokens + 1];  // by token count 1..kTokens
};

template <typename U>
constexpr Kernels k_kernels() {
  return {pack<U>,
          {nullptr, kernel<U, 1>, kernel<U, 2>, kernel<U, 3>, kernel<U, 4>, kernel<U, 5>,
           kernel<U, 6>, kernel<U, 7>, kernel<U, 8>}};
}

const Kernels* kernels(GgmlType type) {
  static const Kernels q2_k = k_kernels<UnpackQ2K>(), q3_k = k_kernels<UnpackQ3K>(),
                       q4_k = k_kernels<UnpackQ4K>(), q5_k = k_kernels<UnpackQ5K>(),
                       q6_k = k_kernels<UnpackQ6K>();
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

TilePlan avx512_tile_plan(GgmlType type, int64_t n_in) {
  TilePlan plan;
  if (kernels(type) != nullptr) {
    const int64_t nb = n_in / kQKK;
    plan.supported = true;
    plan.rows_per_panel = kRows;
    plan.act_row_bytes = static_cast<size_t>(nb) * sizeof(BlockQ8_K);
    plan.panel_bytes = static_cast<size_t>(nb) * kPanelBytes;
  }
  return plan;
}

void avx512_prepare_acts(GgmlType type, int64_t n_in, const float* x, int64_t t0, int64_t t1,
                         uint8_t* acts) {
  const TilePlan plan = avx512_tile_plan(type, n_in);
  assert(plan.supported);
  for (int64_t t = t0; t < t1; ++t) {
    traits(GgmlType::Q8_K)
        ->from_float(x + t * n_in, acts + static_cast<size_t>(t) * plan.act_row_bytes, n_in);
  }
}

void avx512_tile_rows(const WeightView& w, const uint8_t* acts, size_t act_row_bytes,
                      int64_t n_tokens, int64_t r0, int64_t r1, float* y, uint8_t* panel) {
  const Kernels* ks = kernels(w.type);
  assert(ks != nullptr);
  const int64_t nb = w.n_in / kQKK;
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
