// The decode kernels of the 32-value block formats (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0): one template for
// the AVX2 file and its AVX-512 twin. Included by matvec_avx2.cpp (-mavx2 -mfma -mf16c) and by
// matvec_avx512.cpp (adds AVX-512 F/BW/VL/VNNI); each gets its own copy (an anonymous namespace).
// With VNNI the unsigned x signed byte dots are one vpdpbusd and Q5's fifth bits one masked add
// from the qh bits: the same integer lanes as maddubs + madd and the compare-built mask, so both
// copies give the same bits (Matmul.Avx512DecodeGivesTheAvx2Bits).
// note: include only from *_avx2.cpp / *_avx512.cpp files, after quant/quant_avx2_inl.h.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/matmul_kernels.h"
#include "bie/quant/blocks.h"
#include "quant/quant_avx2_inl.h"

#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#define BIE_B32_VNNI 1
#endif

namespace bie::cpu {
namespace {
namespace b32 {

using namespace quant;        // NOLINT
using namespace quant::simd;  // NOLINT

// ---- 32-value block formats (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0) -------------------------------------
//
// Activations of one token, nb blocks padded to nb4 = round_up(nb, 4) (padding is zero):
//   qs[nb][kActBytes]       the Q8_0 / Q8_1 quantiser's values (int8; Q8_0 adds |qs|)
//   float ds[nb4][2]        [d, s]: d as fp16 would round it; s = fp16(d * sum(qs)) for the
//                           Q8_1 formats (ggml's min term), 0 otherwise
//   float off[nb4][2]       [-offset * sum(qs), 0] for Q4_0 (offset 8) and Q5_0 (16)
// The weights' unsigned values q (Q4_0: x = d * (q - 8)) go into maddubs as they are; the
// offset comes back as d_x * d_y * off.
// Q8_0 is signed on both sides; maddubs needs one unsigned operand, so the activations carry
// |y| as well and each row needs a single sign fix-up.

constexpr int kChunk = 64;  // blocks per scale pre-pass (bounds the stack buffers)

// Decode streams every weight byte once per token from L3/DRAM; the hardware prefetcher alone
// leaves too few misses in flight (a cold Q4_1 576x1536 matvec ran at 60% of its L2-resident
// speed). Each row prefetches the bytes this far ahead of its read position, which covers the
// next rows of the thread's range (rows are contiguous). 2-8 KiB measured alike; 4 KiB chosen.
constexpr size_t kPrefetchBytes = 4096;

// Prefetches [p + kPrefetchBytes, + n), one request per cache line.
inline void prefetch_ahead(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p) + kPrefetchBytes;
  for (size_t off = 0; off < n; off += 64) _mm_prefetch(c + off, _MM_HINT_T0);
}

enum class B32Kind { kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0 };

// 16 bytes of nibbles -> 32 bytes (low nibbles, then high nibbles). The 16 bytes are broadcast
// to both halves by the load itself, so no lane insert is needed.
inline __m256i nibbles32_bcast(const uint8_t* p) {
  const __m256i t =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_and_si256(_mm256_blend_epi32(t, _mm256_srli_epi16(t, 4), 0xF0),
                          _mm256_set1_epi8(0x0F));
}

// q | 16 where bit j of the block's qh is set (byte j of q holds value j).
inline __m256i with_high_bit(__m256i q, const uint8_t* qh) {
#ifdef BIE_B32_VNNI
  uint32_t m;
  std::memcpy(&m, qh, 4);
  return _mm256_mask_add_epi8(q, _cvtu32_mask32(m), q, _mm256_set1_epi8(0x10));  // q <= 15
#else
  return _mm256_or_si256(q, _mm256_and_si256(bits32_to_mask(qh), _mm256_set1_epi8(0x10)));
#endif
}

// Sums of 4 adjacent u8 x s8 products per int32 lane. maddubs cannot saturate for the operands
// used here (one side <= 31, or both |.| <= 127), so VNNI's vpdpbusd gives the same lanes.
inline __m256i dot_u8s8(__m256i u, __m256i s) {
#ifdef BIE_B32_VNNI
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

inline __m256i load256(const void* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// Unsigned weights (q <= 31) against int8 activations: maddubs cannot saturate.
struct UnsignedDot {
  static constexpr int kActBytes = kQK32;
  struct Y {
    __m256i v;
  };
  static void store_act(const int8_t* qs, uint8_t* out) { std::memcpy(out, qs, kQK32); }
  static Y load_act(const uint8_t* p) { return {load256(p)}; }
  static __m256i dot(__m256i q, const Y& y) { return dot_u8s8(q, y.v); }
};

template <B32Kind K>
struct B32;
template <>
struct B32<B32Kind::kQ4_0> : UnsignedDot {
  using Block = BlockQ4_0;
  static constexpr int kOffset = 8;
  static constexpr bool kMin = false;
  static __m256i dot(const Block* b, const Y& y) {
    return UnsignedDot::dot(nibbles32_bcast(b->qs), y);
  }
};
template <>
struct B32<B32Kind::kQ4_1> : UnsignedDot {
  using Block = BlockQ4_1;
  static constexpr int kOffset = 0;
  static constexpr bool kMin = true;
  static __m256i dot(const Block* b, const Y& y) {
    return UnsignedDot::dot(nibbles32_bcast(b->qs), y);
  }
};
template <>
struct B32<B32Kind::kQ5_0> : UnsignedDot {
  using Block = BlockQ5_0;
  static constexpr int kOffset = 16;
  static constexpr bool kMin = false;
  static __m256i dot(const Block* b, const Y& y) {
    return UnsignedDot::dot(with_high_bit(nibbles32_bcast(b->qs), b->qh), y);
  }
};
template <>
struct B32<B32Kind::kQ5_1> : UnsignedDot {
  using Block = BlockQ5_1;
  static constexpr int kOffset = 0;
  static constexpr bool kMin = true;
  static __m256i dot(const Block* b, const Y& y) {
    return UnsignedDot::dot(with_high_bit(nibbles32_bcast(b->qs), b->qh), y);
  }
};
template <>
struct B32<B32Kind::kQ8_0> {
  using Block = BlockQ8_0;
  static constexpr int kOffset = 0;
  static constexpr bool kMin = false;
  static constexpr int kActBytes = 2 * kQK32;  // y, then |y|
  struct Y {
    __m256i v, abs;
  };
  static void store_act(const int8_t* qs, uint8_t* out) {
    const __m256i v = load256(qs);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), v);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + kQK32), _mm256_sign_epi8(v, v));
  }
  static Y load_act(const uint8_t* p) { return {load256(p), load256(p + kQK32)}; }
  // x * y = |y| * (x * sign(y)): maddubs takes |y| as the unsigned side, shared by every row.
  // note: x = -128 would wrap in the sign fix-up; ggml's Q8_0 quantiser never produces it.
  static __m256i dot(const Block* b, const Y& y) {
    const __m256i xs = _mm256_sign_epi8(load256(b->qs), y.v);
    return dot_u8s8(y.abs, xs);
  }
};

struct ActB32View {
  const uint8_t* qs;
  const float* ds;
  const float* off;
};

inline int64_t round_up4(int64_t n) {
  return (n + 3) / 4 * 4;
}

template <B32Kind K>
size_t act_b32_bytes(int64_t nb) {
  return static_cast<size_t>(nb) * B32<K>::kActBytes + static_cast<size_t>(round_up4(nb)) * 16;
}

template <B32Kind K>
ActB32View act_b32_view(const uint8_t* p, int64_t nb) {
  const auto* ds = reinterpret_cast<const float*>(p + nb * B32<K>::kActBytes);
  return {p, ds, ds + 2 * round_up4(nb)};
}

template <B32Kind K>
void prepare_b32(int64_t n_in, const float* x, uint8_t* out) {
  using F = B32<K>;
  constexpr bool kQ8_1 = F::kMin;  // Q4_1 and Q5_1 pair with Q8_1, the others with Q8_0
  const int64_t nb = n_in / kQK32;
  auto* ds = reinterpret_cast<float*>(out + nb * F::kActBytes);
  float* off = ds + 2 * round_up4(nb);
  for (int64_t i = 0; i < nb; ++i) {
    alignas(32) int8_t qs[kQK32];
    int32_t sum;
    const float d = quantize_q8_block(x + i * kQK32, qs, &sum);
    F::store_act(qs, out + i * F::kActBytes);
    ds[2 * i] = round_fp16(d);
    ds[2 * i + 1] = kQ8_1 ? round_fp16(d * static_cast<float>(sum)) : 0.0f;
    off[2 * i] = static_cast<float>(-F::kOffset * sum);
    off[2 * i + 1] = 0.0f;
  }
  for (int64_t i = 2 * nb; i < 2 * round_up4(nb); ++i) ds[i] = off[i] = 0.0f;
}

// Sum of the lanes of v that hold min/offset terms: odd lanes ([d*dy, m*s] pairs) for the
// Q8_1 formats, even lanes ([d*dy*off, junk]) for the offset formats. The other lanes may hold
// anything (the fp16 header's second half is not a scale for Q4_0/Q5_0).
template <B32Kind K>
inline float min_lanes(__m256 v) {
  constexpr int kOddLanes = 0xAA;
  return hsum_ps(_mm256_blend_ps(_mm256_setzero_ps(), v, B32<K>::kMin ? kOddLanes : 0x55));
}

inline int32_t load_i32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// fp16 [d, m] of blocks b[0..3] as floats [d0 m0 d1 m1 d2 m2 d3 m3] (one conversion for four
// blocks); for formats without m the odd lanes hold whatever follows d.
template <typename Block>
inline __m256 header4(const Block* b) {
  __m128i h = _mm_cvtsi32_si128(load_i32(b));
  h = _mm_insert_epi32(h, load_i32(b + 1), 1);
  h = _mm_insert_epi32(h, load_i32(b + 2), 2);
  h = _mm_insert_epi32(h, load_i32(b + 3), 3);
  return _mm256_cvtph_ps(h);
}
// Same for the first n < 4 blocks; the others read as zero.
template <typename Block>
inline __m256 header4_tail(const Block* b, int n) {
  alignas(16) int32_t h[4] = {0, 0, 0, 0};
  for (int k = 0; k < n; ++k) h[k] = load_i32(b + k);
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(h)));
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
    a[t] = act_b32_view<K>(acts + static_cast<size_t>(t) * act_row_bytes, nb);

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
    // Scales of blocks b .. b + 3 (headers h, one vector per row) times the activations'.
    auto scale_group = [&](int b, const __m256* h) __attribute__((always_inline)) {
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
    };
    // Whole groups of 4 blocks, then the tail apart: merged, the compiler took the tail's
    // store-then-reload path for every group (a store-forwarding stall each).
    int b4 = 0;
    for (; b4 + 4 <= nbc; b4 += 4) {
      __m256 h[R];
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) {
        h[i] = header4(row[i] + b0 + b4);
        prefetch_ahead(row[i] + b0 + b4, 4 * sizeof(Block));
      }
      scale_group(b4, h);
    }
    if (b4 < nbc) {
      __m256 h[R];
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) h[i] = header4_tail(row[i] + b0 + b4, nbc - b4);
      scale_group(b4, h);
    }
    for (int b = 0; b < nbc; ++b) {
      typename F::Y yv[T];
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) yv[t] = F::load_act(a[t].qs + (b0 + b) * F::kActBytes);
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) {
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
          const __m256 s = _mm256_broadcast_ss(dd[t][i] + 2 * b);
          acc[i][t] =
              _mm256_fmadd_ps(_mm256_cvtepi32_ps(F::dot(row[i] + b0 + b, yv[t])), s, acc[i][t]);
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

// Index of a 32-value format in B32Kind order (a kernel table's row), or -1.
inline int b32_index(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_0:
      return static_cast<int>(B32Kind::kQ4_0);
    case GgmlType::Q4_1:
      return static_cast<int>(B32Kind::kQ4_1);
    case GgmlType::Q5_0:
      return static_cast<int>(B32Kind::kQ5_0);
    case GgmlType::Q5_1:
      return static_cast<int>(B32Kind::kQ5_1);
    case GgmlType::Q8_0:
      return static_cast<int>(B32Kind::kQ8_0);
    default:
      return -1;
  }
}

// Rows per call: the dispatch (both ISAs, K-quants too) builds every matrix-vector kernel with
// R = 1. A row at a time reads the weights as one sequential stream per thread; interleaving
// rows (R rows a block at a time, as the dispatch did with R = 4 for 1-2 tokens and 2 above)
// splits it into R streams a row apart, which left the memory system idle on an AMD EPYC (Zen 4)
// VM: cold 2-thread decode of Q4_K 1536x8960 went from 9.5 to 22 GiB/s and of Q8_0 576x49152
// from 12 to 30 GiB/s with one row per call (bie_kernel_bench BM_MatmulIsa, BM_MatmulDecode).
// The bits do not depend on R.

}  // namespace b32
}  // namespace
}  // namespace bie::cpu
