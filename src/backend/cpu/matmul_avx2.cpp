// Tiled AVX2 matmul: repack 8 weight rows into an interleaved panel, then run micro-kernels of
// 8 rows x up to 4 tokens over it. In the panel, 4-byte chunk c of the 8 rows' unpacked values
// sits in one register (lane r = row r), so one broadcast of a token's 4 activation bytes feeds
// 8 rows at once through maddubs, and the 8 lanes of the result are the 8 rows' outputs: no
// horizontal sums. Built with -mavx2 -mfma -mf16c; called only after has_avx2().
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

constexpr int kRows = 8;       // rows per quantised panel (one per int32 lane)
constexpr int kTokens = 4;     // tokens per micro-kernel call
constexpr int kFloatRows = 4;  // rows per float panel
constexpr int kFloatTokens = 3;

inline __m256i bcast32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Stores 8 row results of one token, only the first n_valid at the matrix's last panel.
inline void store_rows(float* y, __m256 v, int n_valid) {
  if (n_valid == kRows) {
    _mm256_storeu_ps(y, v);
  } else {
    alignas(32) float tmp[kRows];
    _mm256_store_ps(tmp, v);
    std::memcpy(y, tmp, sizeof(float) * static_cast<size_t>(n_valid));
  }
}

// ---- 32-value block formats (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0) -------------------------------------
//
// Activations: per block {qs[32], d, s, isum}: the Q8_0/Q8_1 quantiser's values, with d and s
// already rounded through fp16 as the blocks would store them, and isum = sum(qs) exact.
// Panel: per block, 8 chunks x 8 rows x 4 bytes, then d[8], m[8] (fp32).
// Unsigned formats keep q without its offset (Q4_0: 8, Q5_0: 16); the kernel subtracts
// offset * isum in integers, so the integer dot equals ggml's exactly.

constexpr size_t kPanelB32 = 256 + 2 * 32;  // bytes per block of 8 rows

void prepare_b32(int64_t n_in, const float* x, ActB32* out) {
  for (int64_t i = 0; i < n_in / kQK32; ++i, x += kQK32) {
    int32_t sum;
    const float d = quantize_q8_block(x, out[i].qs, &sum);
    out[i].d = round_fp16(d);
    out[i].s = round_fp16(d * static_cast<float>(sum));
    out[i].isum = sum;
    out[i].pad = 0;
  }
}

enum class B32Kind { kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0 };

template <B32Kind K>
struct B32Traits;
template <>
struct B32Traits<B32Kind::kQ4_0> {
  using Block = BlockQ4_0;
  static constexpr int kOffset = 8, kAccSteps = 8;  // 8 maddubs of 2*15*127 fit int16
  static constexpr bool kMin = false, kSigned = false;
  static __m256i values(const Block& b) { return nibbles32(b.qs); }
  static float min(const Block&) { return 0.0f; }
};
template <>
struct B32Traits<B32Kind::kQ4_1> {
  using Block = BlockQ4_1;
  static constexpr int kOffset = 0, kAccSteps = 8;
  static constexpr bool kMin = true, kSigned = false;
  static __m256i values(const Block& b) { return nibbles32(b.qs); }
  static float min(const Block& b) { return h2f(b.m); }
};
template <>
struct B32Traits<B32Kind::kQ5_0> {
  using Block = BlockQ5_0;
  static constexpr int kOffset = 16, kAccSteps = 4;  // 4 maddubs of 2*31*127 fit int16
  static constexpr bool kMin = false, kSigned = false;
  static __m256i values(const Block& b) {
    return _mm256_or_si256(nibbles32(b.qs),
                           _mm256_and_si256(bits32_to_mask(b.qh), _mm256_set1_epi8(0x10)));
  }
  static float min(const Block&) { return 0.0f; }
};
template <>
struct B32Traits<B32Kind::kQ5_1> {
  using Block = BlockQ5_1;
  static constexpr int kOffset = 0, kAccSteps = 4;
  static constexpr bool kMin = true, kSigned = false;
  static __m256i values(const Block& b) {
    return _mm256_or_si256(nibbles32(b.qs),
                           _mm256_and_si256(bits32_to_mask(b.qh), _mm256_set1_epi8(0x10)));
  }
  static float min(const Block& b) { return h2f(b.m); }
};
template <>
struct B32Traits<B32Kind::kQ8_0> {
  using Block = BlockQ8_0;
  static constexpr int kOffset = 0, kAccSteps = 1;
  static constexpr bool kMin = false, kSigned = true;
  static __m256i values(const Block& b) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
  }
  static float min(const Block&) { return 0.0f; }
};

template <B32Kind K>
void pack_b32(const WeightView& w, int64_t r0, int n_valid, uint8_t* panel) {
  using Tr = B32Traits<K>;
  using Block = typename Tr::Block;
  const int64_t nb = w.n_in / kQK32;
  const auto* base = static_cast<const uint8_t*>(w.data);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* p = panel + b * kPanelB32;
    auto* d = reinterpret_cast<float*>(p + 256);
    auto* m = reinterpret_cast<float*>(p + 288);
    __m256i rows[kRows], cols[kRows];
    for (int r = 0; r < kRows; ++r) {
      if (r < n_valid) {
        const auto* blk =
            reinterpret_cast<const Block*>(base + static_cast<size_t>(r0 + r) * w.row_bytes) + b;
        rows[r] = Tr::values(*blk);
        d[r] = h2f(blk->d);
        m[r] = Tr::min(*blk);
      } else {
        rows[r] = _mm256_setzero_si256();
        d[r] = m[r] = 0.0f;
      }
    }
    transpose8x32(rows, cols);
    for (int c = 0; c < 8; ++c) _mm256_store_si256(reinterpret_cast<__m256i*>(p + 32 * c), cols[c]);
  }
}

template <B32Kind K, int T>
void kernel_b32(const uint8_t* panel, int64_t nb, const uint8_t* acts, size_t act_row_bytes,
                float* y, int64_t n_out, int n_valid) {
  using Tr = B32Traits<K>;
  const __m256i ones = _mm256_set1_epi16(1);
  const ActB32* a[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t)
    a[t] = reinterpret_cast<const ActB32*>(acts + static_cast<size_t>(t) * act_row_bytes);
  __m256 acc[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = panel + b * kPanelB32;
    __m256i i32[T], i16[T];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) i32[t] = i16[t] = _mm256_setzero_si256();
#pragma GCC unroll 16
    for (int c = 0; c < 8; ++c) {
      const __m256i wv = _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 32 * c));
      if constexpr (Tr::kSigned) {
        const __m256i aw = _mm256_sign_epi8(wv, wv);
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
          const __m256i av = _mm256_sign_epi8(bcast32(a[t][b].qs + 4 * c), wv);
          i32[t] = _mm256_add_epi32(i32[t], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, av), ones));
        }
      } else {
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
          i16[t] = _mm256_add_epi16(i16[t], _mm256_maddubs_epi16(wv, bcast32(a[t][b].qs + 4 * c)));
          if ((c + 1) % Tr::kAccSteps == 0) {
            i32[t] = _mm256_add_epi32(i32[t], _mm256_madd_epi16(i16[t], ones));
            i16[t] = _mm256_setzero_si256();
          }
        }
      }
    }
    const __m256 dv = _mm256_load_ps(reinterpret_cast<const float*>(p + 256));
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      __m256i iv = i32[t];
      if constexpr (Tr::kOffset != 0)
        iv = _mm256_sub_epi32(iv, _mm256_set1_epi32(Tr::kOffset * a[t][b].isum));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iv), _mm256_mul_ps(dv, _mm256_set1_ps(a[t][b].d)),
                               acc[t]);
      if constexpr (Tr::kMin) {
        acc[t] = _mm256_fmadd_ps(_mm256_load_ps(reinterpret_cast<const float*>(p + 288)),
                                 _mm256_set1_ps(a[t][b].s), acc[t]);
      }
    }
  }
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) store_rows(y + t * n_out, acc[t], n_valid);
}

// ---- K-quants --------------------------------------------------------------------------------
//
// Activations: Q8_K blocks. Panel per super-block: 64 chunks x 8 rows x 4 bytes of the unified
// qu (quant_internal.h), then per group g of 16 an int16 pair vector (sc, sc) per row, per
// pair of groups h an int16 pair (m[2h], m[2h+1]) per row, then d[8], dmin[8].
// x = d*sc*qu - dmin*m: the main sum uses madd(maddubs(qu, a), (sc, sc)), the min term
// madd((m0, m1), (bsum0, bsum1)).

constexpr size_t kPanelK = 2048 + 512 + 256 + 64;

template <typename U>
void pack_k(const WeightView& w, int64_t r0, int n_valid, uint8_t* panel) {
  using Block = typename U::Block;
  const int64_t nb = w.n_in / kQKK;
  const auto* base = static_cast<const uint8_t*>(w.data);
  KRegs regs[kRows];
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* p = panel + b * kPanelK;
    auto* scv = reinterpret_cast<uint32_t*>(p + 2048);
    auto* mv = reinterpret_cast<uint32_t*>(p + 2560);
    auto* d = reinterpret_cast<float*>(p + 2816);
    auto* dmin = reinterpret_cast<float*>(p + 2848);
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
      for (int g = 0; g < 16; ++g) {
        const auto s = static_cast<uint16_t>(regs[r].sc[g]);
        scv[g * kRows + r] = s | (static_cast<uint32_t>(s) << 16);
      }
      for (int h = 0; h < 8; ++h) {
        mv[h * kRows + r] =
            static_cast<uint16_t>(regs[r].m[2 * h]) |
            (static_cast<uint32_t>(static_cast<uint16_t>(regs[r].m[2 * h + 1])) << 16);
      }
      d[r] = regs[r].d;
      dmin[r] = regs[r].dmin;
    }
    for (int cv = 0; cv < 8; ++cv) {
      __m256i rows[kRows], cols[kRows];
      for (int r = 0; r < kRows; ++r) rows[r] = regs[r].q[cv];
      transpose8x32(rows, cols);
      for (int j = 0; j < 8; ++j)
        _mm256_store_si256(reinterpret_cast<__m256i*>(p + 32 * (8 * cv + j)), cols[j]);
    }
  }
}

template <typename U>
constexpr int k_acc_steps() {
  return U::kZero == 32 ? 2 : 4;  // Q6_K's qu reaches 63: only 2 maddubs fit int16
}

template <typename U, int T>
void kernel_k(const uint8_t* panel, int64_t nb, const uint8_t* acts, size_t act_row_bytes, float* y,
              int64_t n_out, int n_valid) {
  constexpr int kSteps = k_acc_steps<U>();
  const BlockQ8_K* a[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t)
    a[t] = reinterpret_cast<const BlockQ8_K*>(acts + static_cast<size_t>(t) * act_row_bytes);
  __m256 acc[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = panel + b * kPanelK;
    __m256i isum[T];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
#pragma GCC unroll 16
    for (int g = 0; g < 16; ++g) {
      const __m256i scv = _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 2048 + 32 * g));
#pragma GCC unroll 16
      for (int c0 = 4 * g; c0 < 4 * g + 4; c0 += kSteps) {
        __m256i i16[T];
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) i16[t] = _mm256_setzero_si256();
#pragma GCC unroll 16
        for (int c = c0; c < c0 + kSteps; ++c) {
          const __m256i wv = _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 32 * c));
#pragma GCC unroll 16
          for (int t = 0; t < T; ++t) {
            i16[t] =
                _mm256_add_epi16(i16[t], _mm256_maddubs_epi16(wv, bcast32(a[t][b].qs + 4 * c)));
          }
        }
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t)
          isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(i16[t], scv));
      }
    }
    const __m256 dv = _mm256_load_ps(reinterpret_cast<const float*>(p + 2816));
    const __m256 dminv = _mm256_load_ps(reinterpret_cast<const float*>(p + 2848));
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      __m256i msum = _mm256_setzero_si256();
#pragma GCC unroll 16
      for (int h = 0; h < 8; ++h) {
        const __m256i mv = _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 2560 + 32 * h));
        msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mv, bcast32(a[t][b].bsums + 2 * h)));
      }
      const __m256 da = _mm256_set1_ps(a[t][b].d);
      if constexpr (U::kSym) {
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum[t], msum)),
                                 _mm256_mul_ps(dv, da), acc[t]);
      } else {
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(dv, da), acc[t]);
        acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dminv, da), acc[t]);
      }
    }
  }
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) store_rows(y + t * n_out, acc[t], n_valid);
}

// ---- float formats (F32 F16 BF16) ------------------------------------------------------------
//
// Activations: fp32 rows rounded through the vec_dot_type (fp16/bf16), as ggml's dot sees them.
// Panel: 4 rows converted to fp32. Kernel: 4 rows x 3 tokens of 8-wide FMAs.

template <int T>
void kernel_float(const float* panel, int64_t n_in, const uint8_t* acts, size_t act_row_bytes,
                  float* y, int64_t n_out, int n_valid) {
  const float* a[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t)
    a[t] = reinterpret_cast<const float*>(acts + static_cast<size_t>(t) * act_row_bytes);
  __m256 acc[kFloatRows][T];
#pragma GCC unroll 16
  for (auto& row : acc) {
#pragma GCC unroll 16
    for (auto& v : row) v = _mm256_setzero_ps();
  }
  for (int64_t k = 0; k < n_in; k += 8) {
    __m256 wv[kFloatRows];
#pragma GCC unroll 16
    for (int r = 0; r < kFloatRows; ++r) wv[r] = _mm256_load_ps(panel + r * n_in + k);
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m256 av = _mm256_loadu_ps(a[t] + k);
#pragma GCC unroll 16
      for (int r = 0; r < kFloatRows; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], av, acc[r][t]);
    }
  }
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
#pragma GCC unroll 16
    for (int r = 0; r < n_valid; ++r) y[t * n_out + r] = hsum_ps(acc[r][t]);
  }
}

// ---- drivers ---------------------------------------------------------------------------------

using PackFn = void (*)(const WeightView&, int64_t, int, uint8_t*);
using KernelFn = void (*)(const uint8_t*, int64_t, const uint8_t*, size_t, float*, int64_t, int);

template <int T, typename F>
void for_token_tiles(int64_t n_tokens, F&& run) {
  int64_t t = 0;
  for (; t + T <= n_tokens; t += T) run(t, T);
  if (t < n_tokens) run(t, static_cast<int>(n_tokens - t));
}

struct QuantKernels {
  PackFn pack;
  KernelFn k[kTokens + 1];  // by token count 1..4
  int64_t values_per_block;
};

template <B32Kind K>
constexpr QuantKernels b32_kernels() {
  return {pack_b32<K>,
          {nullptr, kernel_b32<K, 1>, kernel_b32<K, 2>, kernel_b32<K, 3>, kernel_b32<K, 4>},
          kQK32};
}
template <typename U>
constexpr QuantKernels k_kernels() {
  return {
      pack_k<U>, {nullptr, kernel_k<U, 1>, kernel_k<U, 2>, kernel_k<U, 3>, kernel_k<U, 4>}, kQKK};
}

const QuantKernels* quant_kernels(GgmlType type) {
  static const QuantKernels q4_0 = b32_kernels<B32Kind::kQ4_0>(),
                            q4_1 = b32_kernels<B32Kind::kQ4_1>(),
                            q5_0 = b32_kernels<B32Kind::kQ5_0>(),
                            q5_1 = b32_kernels<B32Kind::kQ5_1>(),
                            q8_0 = b32_kernels<B32Kind::kQ8_0>(), q2_k = k_kernels<UnpackQ2K>(),
                            q3_k = k_kernels<UnpackQ3K>(), q4_k = k_kernels<UnpackQ4K>(),
                            q5_k = k_kernels<UnpackQ5K>(), q6_k = k_kernels<UnpackQ6K>();
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

bool is_float_type(GgmlType t) {
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}

}  // namespace

TilePlan avx2_tile_plan(GgmlType type, int64_t n_in) {
  TilePlan plan;
  if (const QuantKernels* qk = quant_kernels(type)) {
    const int64_t nb = n_in / qk->values_per_block;
    plan.supported = true;
    plan.rows_per_panel = kRows;
    if (qk->values_per_block == kQK32) {
      plan.act_row_bytes = static_cast<size_t>(nb) * sizeof(ActB32);
      plan.panel_bytes = static_cast<size_t>(nb) * kPanelB32;
    } else {
      plan.act_row_bytes = static_cast<size_t>(nb) * sizeof(BlockQ8_K);
      plan.panel_bytes = static_cast<size_t>(nb) * kPanelK;
    }
  } else if (is_float_type(type) && n_in % 8 == 0) {
    plan.supported = true;
    plan.rows_per_panel = kFloatRows;
    plan.act_row_bytes = static_cast<size_t>(n_in) * sizeof(float);
    plan.panel_bytes = static_cast<size_t>(n_in) * sizeof(float) * kFloatRows;
  }
  return plan;
}

void avx2_prepare_acts(GgmlType type, int64_t n_in, const float* x, int64_t t0, int64_t t1,
                       uint8_t* acts) {
  const TilePlan plan = avx2_tile_plan(type, n_in);
  const TypeTraits* tr = traits(type);
  for (int64_t t = t0; t < t1; ++t) {
    uint8_t* out = acts + static_cast<size_t>(t) * plan.act_row_bytes;
    const float* xt = x + t * n_in;
    if (is_float_type(type)) {
      auto* f = reinterpret_cast<float*>(out);
      if (type == GgmlType::F32) {
        std::memcpy(f, xt, static_cast<size_t>(n_in) * sizeof(float));
      } else {
        // Round through fp16/bf16: the values ggml's dot would see.
        const TypeTraits* at = traits(tr->vec_dot_type);
        for (int64_t k = 0; k < n_in; k += 8) {
          uint16_t h[8];
          at->from_float(xt + k, h, 8);
          at->to_float(h, f + k, 8);
        }
      }
    } else if (tr->vec_dot_type == GgmlType::Q8_K) {
      traits(GgmlType::Q8_K)->from_float(xt, out, n_in);
    } else {
      prepare_b32(n_in, xt, reinterpret_cast<ActB32*>(out));
    }
  }
}

void avx2_tile_rows(const WeightView& w, const uint8_t* acts, size_t act_row_bytes,
                    int64_t n_tokens, int64_t r0, int64_t r1, float* y, uint8_t* panel) {
  if (const QuantKernels* qk = quant_kernels(w.type)) {
    const int64_t nb = w.n_in / qk->values_per_block;
    for (int64_t r = r0; r < r1; r += kRows) {
      const int n_valid = static_cast<int>(std::min<int64_t>(kRows, r1 - r));
      qk->pack(w, r, n_valid, panel);
      for_token_tiles<kTokens>(n_tokens, [&](int64_t t, int nt) {
        qk->k[nt](panel, nb, acts + static_cast<size_t>(t) * act_row_bytes, act_row_bytes,
                  y + t * w.n_out + r, w.n_out, n_valid);
      });
    }
    return;
  }
  assert(is_float_type(w.type));
  const TypeTraits* tr = traits(w.type);
  auto* fp = reinterpret_cast<float*>(panel);
  const auto* base = static_cast<const uint8_t*>(w.data);
  for (int64_t r = r0; r < r1; r += kFloatRows) {
    const int n_valid = static_cast<int>(std::min<int64_t>(kFloatRows, r1 - r));
    for (int i = 0; i < kFloatRows; ++i) {
      float* dst = fp + i * w.n_in;
      if (i < n_valid) {
        tr->to_float(base + static_cast<size_t>(r + i) * w.row_bytes, dst, w.n_in);
      } else {
        std::memset(dst, 0, static_cast<size_t>(w.n_in) * sizeof(float));
      }
    }
    for_token_tiles<kFloatTokens>(n_tokens, [&](int64_t t, int nt) {
      const uint8_t* a = acts + static_cast<size_t>(t) * act_row_bytes;
      float* yt = y + t * w.n_out + r;
      switch (nt) {
        case 1:
          kernel_float<1>(fp, w.n_in, a, act_row_bytes, yt, w.n_out, n_valid);
          break;
        case 2:
          kernel_float<2>(fp, w.n_in, a, act_row_bytes, yt, w.n_out, n_valid);
          break;
        default:
          kernel_float<3>(fp, w.n_in, a, act_row_bytes, yt, w.n_out, n_valid);
          break;
      }
    });
  }
}

}  // namespace bie::cpu
