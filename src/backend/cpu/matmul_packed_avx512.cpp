// AVX-512 (F/BW/VL/VNNI) kernels over Q4_K, Q6_K and 32-value block (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0)
// weights repacked once, when a CPU backend first multiplies by them, into 16-row panels that
// keep the file's bits per value (4 + 2 for Q6_K, 4 + 1 for Q5_x) and its scale bytes: the
// repacked matrix is the original's size (plus at most 63 bytes of padding per panel), so decode
// stays bandwidth-bound on it. (The 32-value formats' section is further down.)
//
// The kernels are matmul_avx512.cpp's tiles with the panel read in place instead of repacked per
// call: one 64-byte register holds a 4-value chunk of 16 rows (one per int32 lane), so one
// broadcast of a token's 4 activation bytes feeds 16 rows through one vpdpbusd. The chunk's
// values come out of the packed nibbles (and Q6_K's 2-bit tops) with two or three bit operations
// shared by the tokens of the call; the group scales and the mins are taken out of the blocks'
// own scale bytes once per super-block.
//
// Bits: every integer sum (a group's dot, its scaled sum over the super-block, the mins' and the
// offsets' sum) is exact and equals the tiles'; the float part is the tiles' two fmadds per
// super-block per lane, in their order. So a (row, token) result here is bit for bit the AVX-512
// and AVX2 tiles' result, whatever the number of tokens in the call: decode tokens get the same
// bits alone or in a batch of any size, and prompt tokens the bits they would get from the tiles.
// Activations: the tiles' Q8_K rows (avx512_prepare_acts).
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

namespace bie::cpu {

namespace {

using namespace quant;  // NOLINT

constexpr int kRows = 16;   // rows per panel (one per int32 lane)
constexpr int kTokens = 8;  // tokens per kernel call (the accumulators fill the registers)

// Decode streams each panel once from DRAM, and the hardware prefetchers alone keep too few
// lines in flight. So the kernels request the bytes kPrefetchBytes ahead of their read position
// into L2 (prefetcht1), walking the panel as one linear stream (panels are contiguous, so the
// stream runs on into the next panel) at the rate the blocks consume it.
// On an AMD EPYC (Zen 4) VM this took cold 2-thread decode of Q4_K 1536x8960 from 17 to ~30 GiB/s
// and the 1.5B's tg from 19 to ~29 tok/s; 16-32 KiB measured alike, 4-8 KiB and 64+ KiB lower,
// prefetcht0 at 4 KiB (the kernels' first choice) no better than none.
constexpr size_t kPrefetchBytes = 16384;

// The kernels' requests reach kPrefetchBytes ahead only after that many bytes: a range's head is
// requested up front.
void prefetch_head(const uint8_t* p, size_t range_bytes) {
  const size_t n = std::min(kPrefetchBytes, range_bytes);
  for (size_t o = 0; o < n; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T1);
}

// A panel holds 16 rows over all nb super-blocks, one region after the other (each region's
// per-block part is a whole number of 64-byte vectors except D's):
//   N  nb x 32 vectors: byte b of lane r of vector k holds value 4k + b of row r's block in its
//      low nibble and value 128 + 4k + b in its high nibble (Q6_K: the values' low 4 bits).
//   H  (Q6_K) nb x 16 vectors: byte b of lane r of vector m holds the top 2 bits of values
//      8m + b (bits 0-1), 128 + 8m + b (2-3), 8m + 4 + b (4-5) and 128 + 8m + 4 + b (6-7).
//   S  the block's scale bytes as the file stores them, 4 per lane: Q4_K's 12 (3 vectors), Q6_K's
//      16 int8 (4 vectors).
//   D  fp16 per row: Q4_K d[16] then dmin[16]; Q6_K d[16].
// Rows past the matrix's end are zero (their lanes are never stored).
struct Layout {
  size_t n = 0, h = 0, s = 0, d = 0;  // region offsets
  size_t s_block = 0, d_block = 0;    // per-block bytes of S and D
  size_t panel = 0;                   // bytes per panel, a multiple of 64
};

constexpr size_t kNBlock = 32 * 64, kHBlock = 16 * 64;

Layout layout(GgmlType type, int64_t nb) {
  Layout l;
  const bool q6 = type == GgmlType::Q6_K;
  const auto n = static_cast<size_t>(nb);
  l.s_block = q6 ? 4 * 64 : 3 * 64;
  l.d_block = q6 ? 32 : 64;
  l.h = n * kNBlock;
  l.s = l.h + (q6 ? n * kHBlock : 0);
  l.d = l.s + n * l.s_block;
  l.panel = (l.d + n * l.d_block + 63) / 64 * 64;
  return l;
}

inline __m256i ld32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
inline void st32(uint8_t* p, __m256i v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
}
// Bytes x & m per byte, x >> k per byte (shifted as 16-bit lanes, then masked).
inline __m256i band(__m256i x, int m) {
  return _mm256_and_si256(x, _mm256_set1_epi8(static_cast<char>(m)));
}
inline __m256i shr(__m256i x, int k) {
  return band(_mm256_srli_epi16(x, k), 0xFF >> k);
}
inline __m256i shl(__m256i x, int k) {
  return band(_mm256_slli_epi16(x, k), (0xFF << k) & 0xFF);
}

// One row's block as N bytes (value v's low 4 bits in the low nibble of byte v, value 128 + v's in
// the high nibble, v < 128) and, for Q6_K, H bytes (64: the 2-bit tops, the layout's H).
void block_bytes(const BlockQ4_K& b, uint8_t* n, uint8_t*) {
  // Values 64j .. 64j+31 are the low nibbles of qs[32j ..], 64j+32 .. the high nibbles.
  const __m256i a = ld32(b.qs), bb = ld32(b.qs + 32), c = ld32(b.qs + 64), d = ld32(b.qs + 96);
  st32(n, _mm256_or_si256(band(a, 0x0F), shl(c, 4)));
  st32(n + 32, _mm256_or_si256(shr(a, 4), band(c, 0xF0)));
  st32(n + 64, _mm256_or_si256(band(bb, 0x0F), shl(d, 4)));
  st32(n + 96, _mm256_or_si256(shr(bb, 4), band(d, 0xF0)));
}

void block_bytes(const BlockQ6_K& b, uint8_t* n, uint8_t* h) {
  __m256i q[8];  // values 32i .. 32i+31 (0..63)
  for (int half = 0; half < 2; ++half) {
    const __m256i l0 = ld32(b.ql + 64 * half), l1 = ld32(b.ql + 64 * half + 32);
    const __m256i qh = ld32(b.qh + 32 * half);
    q[4 * half + 0] = _mm256_or_si256(band(l0, 0x0F), shl(band(qh, 0x03), 4));
    q[4 * half + 1] = _mm256_or_si256(band(l1, 0x0F), shl(band(qh, 0x0C), 2));
    q[4 * half + 2] = _mm256_or_si256(shr(l0, 4), band(qh, 0x30));
    q[4 * half + 3] = _mm256_or_si256(shr(l1, 4), shr(band(qh, 0xC0), 2));
  }
  alignas(32) uint8_t x[128];  // top bits of value v (bits 0-1) and of 128 + v (bits 2-3)
  for (int i = 0; i < 4; ++i) {
    st32(n + 32 * i, _mm256_or_si256(band(q[i], 0x0F), shl(q[4 + i], 4)));
    st32(x + 32 * i, _mm256_or_si256(shr(q[i], 4), shl(shr(q[4 + i], 4), 2)));
  }
  // H word m: chunk 2m's tops in bits 0-3 of each byte, chunk 2m+1's in bits 4-7.
  for (int m = 0; m < 16; ++m) {
    uint32_t w0, w1;
    std::memcpy(&w0, x + 8 * m, 4);
    std::memcpy(&w1, x + 8 * m + 4, 4);
    const uint32_t w = w0 | (w1 << 4);
    std::memcpy(h + 4 * m, &w, 4);
  }
}

template <typename Block>
void pack_panel(const WeightView& w, int64_t r0, int n_valid, const Layout& l, uint8_t* panel) {
  constexpr bool kQ6 = std::is_same_v<Block, BlockQ6_K>;
  const int64_t nb = w.n_in / kQKK;
  std::memset(panel, 0, l.panel);
  const auto* base = static_cast<const uint8_t*>(w.data);
  alignas(32) uint8_t nbytes[128], hbytes[64];
  for (int r = 0; r < n_valid; ++r) {
    const auto* row = reinterpret_cast<const Block*>(base + static_cast<size_t>(r0 + r) * w.row_bytes);
    for (int64_t b = 0; b < nb; ++b) {
      const Block& blk = row[b];
      block_bytes(blk, nbytes, hbytes);
      // Word k of the row's bytes goes to lane r of vector k.
      uint8_t* nv = panel + l.n + static_cast<size_t>(b) * kNBlock + 4 * r;
      for (int k = 0; k < 32; ++k) std::memcpy(nv + 64 * k, nbytes + 4 * k, 4);
      uint8_t* sv = panel + l.s + static_cast<size_t>(b) * l.s_block + 4 * r;
      uint8_t* dv = panel + l.d + static_cast<size_t>(b) * l.d_block + 2 * r;
      if constexpr (kQ6) {
        uint8_t* hv = panel + l.h + static_cast<size_t>(b) * kHBlock + 4 * r;
        for (int m = 0; m < 16; ++m) std::memcpy(hv + 64 * m, hbytes + 4 * m, 4);
        for (int j = 0; j < 4; ++j) std::memcpy(sv + 64 * j, blk.scales + 4 * j, 4);
        std::memcpy(dv, &blk.d, 2);
      } else {
        for (int j = 0; j < 3; ++j) std::memcpy(sv + 64 * j, blk.scales + 4 * j, 4);
        std::memcpy(dv, &blk.d, 2);
        std::memcpy(dv + 32, &blk.dmin, 2);
      }
    }
  }
}

// Byte i of every 32-bit lane, zero-extended.
inline __m512i byte_u32(__m512i x, int i) {
  return _mm512_and_si512(_mm512_srli_epi32(x, 8 * i), _mm512_set1_epi32(0xFF));
}

// The values of chunk c (0..63: values 4c..4c+3) of a block's 16 rows, unsigned bytes.
template <bool Q6>
[[gnu::always_inline]] inline __m512i chunk(const uint8_t* nv, const uint8_t* hv, int c) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const int k = c & 31;
  const __m512i v = _mm512_load_si512(nv + 64 * k);
  const __m512i low = c < 32 ? _mm512_and_si512(v, m4)
                             : _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
  if constexpr (!Q6) {
    return low;
  } else {
    const __m512i h = _mm512_load_si512(hv + 64 * (k / 2));
    // The chunk's two top bits sit at bit 0 (k even, c < 32), 2 (even, c >= 32), 4 (odd, c < 32)
    // or 6 (odd, c >= 32) of each byte; they go to bits 4-5.
    __m512i top;
    if (k % 2 == 0) {
      top = c < 32 ? _mm512_slli_epi16(h, 4) : _mm512_slli_epi16(h, 2);
    } else {
      top = c < 32 ? h : _mm512_srli_epi16(h, 2);
    }
    return _mm512_or_si512(low, _mm512_and_si512(top, _mm512_set1_epi8(0x30)));
  }
}

// The scales of group g of the 16 rows as int32 lanes: Q4_K's 8 groups of 32 (6-bit, unsigned),
// Q6_K's 16 groups of 16 (int8).
template <bool Q6>
[[gnu::always_inline]] inline __m512i group_scale(const __m512i* s, int g) {
  if constexpr (Q6) {
    return _mm512_srai_epi32(_mm512_slli_epi32(s[g / 4], 24 - 8 * (g % 4)), 24);
  } else {
    // get_scale_min_k4: groups 0..3 are the low 6 bits of bytes 0..3; groups 4..7 the low
    // nibbles of bytes 8..11 with the top 2 bits of bytes 0..3 above them.
    if (g < 4) return _mm512_and_si512(byte_u32(s[0], g), _mm512_set1_epi32(0x3F));
    const __m512i lo = _mm512_and_si512(byte_u32(s[2], g - 4), _mm512_set1_epi32(0x0F));
    const __m512i hi = _mm512_srli_epi32(byte_u32(s[0], g - 4), 6);
    return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 4));
  }
}

// The int16 pair (m[2h], m[2h+1]) of the tiles' min terms in every lane: Q4_K's min of group h
// twice (it covers both groups of 16); Q6_K's offset 32 * sc for groups 2h and 2h+1.
template <bool Q6>
[[gnu::always_inline]] inline __m512i min_pair(const __m512i* s, int h) {
  if constexpr (Q6) {
    // Bytes 2(h%2) and 2(h%2)+1 of word h/2 go to the high byte of each int16 half (the low bytes
    // cleared); an arithmetic shift by 3 then leaves 32 * the signed byte.
    const __m512i w = s[h / 2];
    const __m512i lo = h % 2 == 0 ? _mm512_slli_epi32(w, 8) : _mm512_srli_epi32(w, 8);
    const __m512i hi = h % 2 == 0 ? _mm512_slli_epi32(w, 16) : w;
    const __m512i both = _mm512_and_si512(_mm512_mask_blend_epi16(0xAAAAAAAAu, lo, hi),
                                          _mm512_set1_epi32(static_cast<int>(0xFF00FF00u)));
    return _mm512_srai_epi16(both, 3);
  } else {
    __m512i m;
    if (h < 4) {
      m = _mm512_and_si512(byte_u32(s[1], h), _mm512_set1_epi32(0x3F));
    } else {
      const __m512i lo = _mm512_srli_epi32(byte_u32(s[2], h - 4), 4);
      const __m512i hi = _mm512_srli_epi32(byte_u32(s[1], h - 4), 6);
      m = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 4));
    }
    return _mm512_or_si512(m, _mm512_slli_epi32(m, 16));
  }
}

template <bool Q6, int T>
void kernel(const uint8_t* panel, const Layout& l, int64_t nb, const uint8_t* acts,
            size_t act_row_bytes, float* y, int64_t n_out, int n_valid) {
  constexpr int kGroup = Q6 ? 4 : 8;  // chunks per scale group
  constexpr int kScaleWords = Q6 ? 4 : 3;
  constexpr int kChains = std::min(kGroup, T >= 4 ? 1 : 4 / T);
  const BlockQ8_K* a[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t)
    a[t] = reinterpret_cast<const BlockQ8_K*>(acts + static_cast<size_t>(t) * act_row_bytes);
  __m512 acc[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  const size_t block_bytes = l.panel / static_cast<size_t>(nb);  // at most 64 lines
  for (int64_t b = 0; b < nb; ++b) {
    const char* pf = reinterpret_cast<const char*>(panel) + kPrefetchBytes +
                     static_cast<size_t>(b) * block_bytes;
    const uint8_t* nv = panel + l.n + static_cast<size_t>(b) * kNBlock;
    const uint8_t* hv = panel + l.h + static_cast<size_t>(b) * kHBlock;
    const uint8_t* sp = panel + l.s + static_cast<size_t>(b) * l.s_block;
    const uint8_t* dp = panel + l.d + static_cast<size_t>(b) * l.d_block;
    __m512i s[kScaleWords];
#pragma GCC unroll 4
    for (int j = 0; j < kScaleWords; ++j) s[j] = _mm512_load_si512(sp + 64 * j);
    __m512i isum[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) isum[t] = _mm512_setzero_si512();
#pragma GCC unroll 16
    for (int c0 = 0; c0 < 64; c0 += kGroup) {
      // kChains independent dpbusd chains per token (chunk c into chain c % kChains), summed
      // after the group: with few tokens one chain would serialise the group on vpdpbusd's
      // latency. Integer sums, so the result is the same whatever the split.
      __m512i gsum[kChains][T];
#pragma GCC unroll 4
      for (int k = 0; k < kChains; ++k) {
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) gsum[k][t] = _mm512_setzero_si512();
      }
#pragma GCC unroll 8
      for (int c = c0; c < c0 + kGroup; ++c) {
        if (64 * static_cast<size_t>(c) < block_bytes) _mm_prefetch(pf + 64 * c, _MM_HINT_T1);
        const __m512i wv = chunk<Q6>(nv, hv, c);
        const int k = c % kChains;
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t)
          gsum[k][t] = _mm512_dpbusd_epi32(gsum[k][t], wv, bcast32(a[t][b].qs + 4 * c));
      }
      const __m512i scv = group_scale<Q6>(s, c0 / kGroup);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        __m512i g = gsum[0][t];
#pragma GCC unroll 4
        for (int k = 1; k < kChains; ++k) g = _mm512_add_epi32(g, gsum[k][t]);
        isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(g, scv));
      }
    }
    __m512i msum[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) msum[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int h = 0; h < 8; ++h) {
      const __m512i mp = min_pair<Q6>(s, h);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t)
        msum[t] = _mm512_dpwssd_epi32(msum[t], mp, bcast32(a[t][b].bsums + 2 * h));
    }
    const __m512 dv =
        _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(dp)));
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m512 da = _mm512_set1_ps(a[t][b].d);
      if constexpr (Q6) {
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(isum[t], msum[t])),
                                 _mm512_mul_ps(dv, da), acc[t]);
      } else {
        const __m512 dminv =
            _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(dp + 32)));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dv, da), acc[t]);
        acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum[t]), _mm512_mul_ps(dminv, da), acc[t]);
      }
    }
  }
  const auto mask = static_cast<__mmask16>((1u << n_valid) - 1u);
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + t * n_out, mask, acc[t]);
}

// Panel `panel` in the tiles' layout (Avx512KPanel), super-block by super-block: the values of
// every chunk, the group scales (Q4_K's at the first of their two groups of 16), the min pairs,
// d and dmin. The same bytes the tiles' own packing makes of these rows (but for unused lanes).
template <bool Q6>
void expand(const uint8_t* panel, const Layout& l, int64_t nb, uint8_t* out) {
  constexpr int kScaleWords = Q6 ? 4 : 3;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* nv = panel + l.n + static_cast<size_t>(b) * kNBlock;
    const uint8_t* hv = panel + l.h + static_cast<size_t>(b) * kHBlock;
    const uint8_t* sp = panel + l.s + static_cast<size_t>(b) * l.s_block;
    const uint8_t* dp = panel + l.d + static_cast<size_t>(b) * l.d_block;
    uint8_t* o = out + static_cast<size_t>(b) * Avx512KPanel::kBytes;
#pragma GCC unroll 64
    for (int c = 0; c < 64; ++c) _mm512_store_si512(o + 64 * c, chunk<Q6>(nv, hv, c));
    __m512i s[kScaleWords];
    for (int j = 0; j < kScaleWords; ++j) s[j] = _mm512_load_si512(sp + 64 * j);
    for (int g = 0; g < (Q6 ? 16 : 8); ++g) {
      _mm512_store_si512(o + Avx512KPanel::kScOff + 64 * (Q6 ? g : 2 * g), group_scale<Q6>(s, g));
    }
    for (int h = 0; h < 8; ++h)
      _mm512_store_si512(o + Avx512KPanel::kMOff + 64 * h, min_pair<Q6>(s, h));
    const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(dp)));
    _mm512_store_ps(o + Avx512KPanel::kDOff, d);
    _mm512_store_ps(o + Avx512KPanel::kDminOff,
                    Q6 ? d
                       : _mm512_cvtph_ps(
                             _mm256_load_si256(reinterpret_cast<const __m256i*>(dp + 32))));
  }
}

using KernelFn = void (*)(const uint8_t*, const Layout&, int64_t, const uint8_t*, size_t, float*,
                          int64_t, int);

template <bool Q6>
constexpr KernelFn kKernels[kTokens + 1] = {nullptr,          kernel<Q6, 1>, kernel<Q6, 2>,
                                            kernel<Q6, 3>,    kernel<Q6, 4>, kernel<Q6, 5>,
                                            kernel<Q6, 6>,    kernel<Q6, 7>, kernel<Q6, 8>};

bool packable_k(GgmlType type) { return type == GgmlType::Q4_K || type == GgmlType::Q6_K; }

// ---- 32-value block formats (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0) ---------------------------------------
//
// A panel holds 16 rows over all nb blocks of 32 values, one region after the other:
//   N  nb x 4 vectors (4- and 5-bit formats): byte b of lane r of vector k is qs[4k + b] of row
//      r's block as the file stores it (value 4k + b's low 4 bits in its low nibble, value
//      16 + 4k + b's in its high nibble); Q8_0: nb x 8 vectors, byte b of lane r of vector k is
//      value 4k + b + 128 as an unsigned byte.
//   H  (Q5_0/Q5_1) nb x 1 vector: bit c of byte b of lane r is the fifth bit of value 4c + b.
//   D  fp16 per row: d[16], then (Q4_1/Q5_1) m[16].
// So the panel is the rows' file bytes (plus padding to 64 bytes), and chunk c (values
// 4c..4c+3 of 16 rows) comes out as the unsigned values the b32 tiles hold (Q4_0/Q5_0 without
// their offset, Q8_0 plus 128) with at most four bit operations. The kernels below are the tiles'
// kernel_b32 with the chunks read from here: the same integer sums and the same two fmadds per
// block, so a (row, token) result is the tiles' bits whatever the token count.
struct B32Spec {
  int n_vectors = 0;  // N vectors per block (4, or 8 for Q8_0)
  bool high = false;  // an H vector per block (Q5_0, Q5_1)
  bool min = false;   // an m per row (Q4_1, Q5_1)
  int offset = 0;     // subtracted from the stored values (Q4_0: 8, Q5_0: 16, Q8_0: 128)
};

constexpr B32Spec b32_spec(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_0:
      return {4, false, false, 8};
    case GgmlType::Q4_1:
      return {4, false, true, 0};
    case GgmlType::Q5_0:
      return {4, true, false, 16};
    case GgmlType::Q5_1:
      return {4, true, true, 0};
    case GgmlType::Q8_0:
      return {8, false, false, 128};
    default:
      return {};
  }
}

struct B32Layout {
  size_t h = 0, d = 0;          // region offsets (N starts the panel)
  size_t n_block = 0, d_block = 0;
  size_t panel = 0;             // bytes per panel, a multiple of 64
};

B32Layout b32_layout(const B32Spec& s, int64_t nb) {
  B32Layout l;
  const auto n = static_cast<size_t>(nb);
  l.n_block = static_cast<size_t>(s.n_vectors) * 64;
  l.d_block = s.min ? 64 : 32;
  l.h = n * l.n_block;
  l.d = l.h + (s.high ? n * 64 : 0);
  l.panel = (l.d + n * l.d_block + 63) / 64 * 64;
  return l;
}

// The H word of one row's block: bit c of byte b is bit 4c + b of the file's qh.
uint32_t high_word(const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  uint32_t out = 0;
  for (int c = 0; c < 8; ++c)
    for (int b = 0; b < 4; ++b) out |= ((bits >> (4 * c + b)) & 1u) << (8 * b + c);
  return out;
}

template <typename Block>
void pack_b32_panel(const WeightView& w, int64_t r0, int n_valid, const B32Layout& l,
                    uint8_t* panel) {
  const int64_t nb = w.n_in / kQK32;
  std::memset(panel, 0, l.panel);
  const auto* base = static_cast<const uint8_t*>(w.data);
  for (int r = 0; r < n_valid; ++r) {
    const auto* row = reinterpret_cast<const Block*>(base + static_cast<size_t>(r0 + r) * w.row_bytes);
    for (int64_t b = 0; b < nb; ++b) {
      const Block& blk = row[b];
      uint8_t* nv = panel + static_cast<size_t>(b) * l.n_block + 4 * r;
      if constexpr (std::is_same_v<Block, BlockQ8_0>) {
        for (int k = 0; k < 8; ++k) {
          for (int i = 0; i < 4; ++i)
            nv[64 * k + i] = static_cast<uint8_t>(static_cast<uint8_t>(blk.qs[4 * k + i]) ^ 0x80u);
        }
      } else {
        for (int k = 0; k < 4; ++k) std::memcpy(nv + 64 * k, blk.qs + 4 * k, 4);
      }
      if constexpr (requires { blk.qh; }) {
        const uint32_t hw = high_word(blk.qh);
        std::memcpy(panel + l.h + static_cast<size_t>(b) * 64 + 4 * r, &hw, 4);
      }
      uint8_t* dv = panel + l.d + static_cast<size_t>(b) * l.d_block + 2 * r;
      std::memcpy(dv, &blk.d, 2);
      if constexpr (requires { blk.m; }) std::memcpy(dv + 32, &blk.m, 2);
    }
  }
}

// Chunk c (values 4c..4c+3) of a block's 16 rows as the tiles' unsigned bytes.
template <int NV, bool High>
[[gnu::always_inline]] inline __m512i b32_chunk(const uint8_t* nv, __m512i h, int c) {
  if constexpr (NV == 8) {
    return _mm512_load_si512(nv + 64 * c);
  } else {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i v = _mm512_load_si512(nv + 64 * (c & 3));
    const __m512i low = c < 4 ? v : _mm512_srli_epi16(v, 4);
    if constexpr (!High) {
      return _mm512_and_si512(low, m4);
    } else {
      // Bit c of each H byte to bit 4 (16-bit shifts: no bit crosses into bit 4 of the other
      // byte), then (low & 0x0F) | top in one ternary-logic operation.
      const __m512i hs = c <= 4 ? _mm512_slli_epi16(h, 4 - c) : _mm512_srli_epi16(h, c - 4);
      const __m512i top = _mm512_and_si512(hs, _mm512_set1_epi8(0x10));
      return _mm512_ternarylogic_epi32(low, top, m4, 0xEC);  // (A & C) | B
    }
  }
}

template <int NV, bool High, bool Min, int Offset, int T>
void kernel_b32(const uint8_t* panel, const B32Layout& l, int64_t nb, const uint8_t* acts,
                size_t act_row_bytes, float* y, int64_t n_out, int n_valid) {
  const ActB32* a[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t)
    a[t] = reinterpret_cast<const ActB32*>(acts + static_cast<size_t>(t) * act_row_bytes);
  __m512 acc[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  const size_t block_bytes = l.panel / static_cast<size_t>(nb);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* nv = panel + static_cast<size_t>(b) * l.n_block;
    const uint8_t* dp = panel + l.d + static_cast<size_t>(b) * l.d_block;
    const char* pf = reinterpret_cast<const char*>(panel) + kPrefetchBytes +
                     static_cast<size_t>(b) * block_bytes;
    for (size_t o = 0; o < block_bytes; o += 64) _mm_prefetch(pf + o, _MM_HINT_T1);
    __m512i h = _mm512_setzero_si512();
    if constexpr (High) h = _mm512_load_si512(panel + l.h + static_cast<size_t>(b) * 64);
    __m512i isum[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) isum[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      const __m512i wv = b32_chunk<NV, High>(nv, h, c);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t)
        isum[t] = _mm512_dpbusd_epi32(isum[t], wv, bcast32(a[t][b].qs + 4 * c));
    }
    const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dp)));
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      __m512i iv = isum[t];
      if constexpr (Offset != 0)
        iv = _mm512_sub_epi32(iv, _mm512_set1_epi32(Offset * a[t][b].isum));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iv), _mm512_mul_ps(dv, _mm512_set1_ps(a[t][b].d)),
                               acc[t]);
      if constexpr (Min) {
        const __m512 mv =
            _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dp + 32)));
        acc[t] = _mm512_fmadd_ps(mv, _mm512_set1_ps(a[t][b].s), acc[t]);
      }
    }
  }
  const auto mask = static_cast<__mmask16>((1u << n_valid) - 1u);
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + t * n_out, mask, acc[t]);
}

// Panel `panel` in the b32 tiles' layout (Avx512B32Panel), block by block: the 8 chunks' values,
// then d and m as fp32 (zero where the format has no m).
template <int NV, bool High, bool Min>
void expand_b32(const uint8_t* panel, const B32Layout& l, int64_t nb, uint8_t* out) {
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* nv = panel + static_cast<size_t>(b) * l.n_block;
    const uint8_t* dp = panel + l.d + static_cast<size_t>(b) * l.d_block;
    __m512i h = _mm512_setzero_si512();
    if constexpr (High) h = _mm512_load_si512(panel + l.h + static_cast<size_t>(b) * 64);
    uint8_t* o = out + static_cast<size_t>(b) * Avx512B32Panel::kBytes;
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) _mm512_store_si512(o + 64 * c, b32_chunk<NV, High>(nv, h, c));
    _mm512_store_ps(o + Avx512B32Panel::kDOff,
                    _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dp))));
    _mm512_store_ps(o + Avx512B32Panel::kMOff,
                    Min ? _mm512_cvtph_ps(
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(dp + 32)))
                        : _mm512_setzero_ps());
  }
}

using B32KernelFn = void (*)(const uint8_t*, const B32Layout&, int64_t, const uint8_t*, size_t,
                             float*, int64_t, int);
using B32ExpandFn = void (*)(const uint8_t*, const B32Layout&, int64_t, uint8_t*);

struct B32Kernels {
  B32KernelFn k[kTokens + 1];
  B32ExpandFn expand;
};

// The kernels of one format, built from its b32_spec.
template <GgmlType Type, B32Spec S = b32_spec(Type)>
constexpr B32Kernels b32_kernels() {
  constexpr int NV = S.n_vectors, Off = S.offset;
  constexpr bool Hi = S.high, Mn = S.min;
  return {{nullptr, kernel_b32<NV, Hi, Mn, Off, 1>, kernel_b32<NV, Hi, Mn, Off, 2>,
           kernel_b32<NV, Hi, Mn, Off, 3>, kernel_b32<NV, Hi, Mn, Off, 4>,
           kernel_b32<NV, Hi, Mn, Off, 5>, kernel_b32<NV, Hi, Mn, Off, 6>,
           kernel_b32<NV, Hi, Mn, Off, 7>, kernel_b32<NV, Hi, Mn, Off, 8>},
          expand_b32<NV, Hi, Mn>};
}

const B32Kernels* b32_kernels_of(GgmlType type) {
  static constexpr B32Kernels q4_0 = b32_kernels<GgmlType::Q4_0>(),
                              q4_1 = b32_kernels<GgmlType::Q4_1>(),
                              q5_0 = b32_kernels<GgmlType::Q5_0>(),
                              q5_1 = b32_kernels<GgmlType::Q5_1>(),
                              q8_0 = b32_kernels<GgmlType::Q8_0>();
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

bool packable_b32(GgmlType type) { return b32_kernels_of(type) != nullptr; }

}  // namespace

size_t avx512_packed_bytes(GgmlType type, int64_t n_in, int64_t n_out) {
  const int64_t panels = (n_out + kRows - 1) / kRows;
  if (packable_k(type) && n_in % kQKK == 0)
    return static_cast<size_t>(panels) * layout(type, n_in / kQKK).panel;
  if (packable_b32(type) && n_in % kQK32 == 0)
    return static_cast<size_t>(panels) * b32_layout(b32_spec(type), n_in / kQK32).panel;
  return 0;
}

void avx512_pack_panels(const WeightView& w, int64_t p0, int64_t p1, uint8_t* dst) {
  assert(avx512_packed_bytes(w.type, w.n_in, w.n_out) > 0);
  const bool k = packable_k(w.type);
  const Layout l = k ? layout(w.type, w.n_in / kQKK) : Layout{};
  const B32Layout bl = k ? B32Layout{} : b32_layout(b32_spec(w.type), w.n_in / kQK32);
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t r0 = p * kRows;
    const int n_valid = static_cast<int>(std::min<int64_t>(kRows, w.n_out - r0));
    uint8_t* panel = dst + static_cast<size_t>(p) * (k ? l.panel : bl.panel);
    switch (w.type) {
      case GgmlType::Q6_K:
        pack_panel<BlockQ6_K>(w, r0, n_valid, l, panel);
        break;
      case GgmlType::Q4_K:
        pack_panel<BlockQ4_K>(w, r0, n_valid, l, panel);
        break;
      case GgmlType::Q4_0:
        pack_b32_panel<BlockQ4_0>(w, r0, n_valid, bl, panel);
        break;
      case GgmlType::Q4_1:
        pack_b32_panel<BlockQ4_1>(w, r0, n_valid, bl, panel);
        break;
      case GgmlType::Q5_0:
        pack_b32_panel<BlockQ5_0>(w, r0, n_valid, bl, panel);
        break;
      case GgmlType::Q5_1:
        pack_b32_panel<BlockQ5_1>(w, r0, n_valid, bl, panel);
        break;
      case GgmlType::Q8_0:
        pack_b32_panel<BlockQ8_0>(w, r0, n_valid, bl, panel);
        break;
      default:
        assert(false);
    }
  }
}

namespace {

// y rows [r0, r1) from the packed panels (panel_bytes each, nb blocks): up to
// kPackedInPlaceTokens tokens read each panel in place, kernel(panel, token, count, y) per group
// of up to kTokens tokens; more tokens have each panel expanded (expand(panel, out)) into
// `scratch` for the tile kernels.
template <class Expand, class Kernel>
void packed_panels(const WeightView& w, size_t panel_bytes, int64_t nb, const uint8_t* acts,
                   size_t act_row_bytes, int64_t n_tokens, int64_t r0, int64_t r1, float* y,
                   uint8_t* scratch, const Expand& expand, const Kernel& kernel) {
  const auto* packed = static_cast<const uint8_t*>(w.packed);
  const bool in_place = n_tokens <= kPackedInPlaceTokens;
  if (in_place) {
    prefetch_head(packed + static_cast<size_t>(r0 / kRows) * panel_bytes,
                  static_cast<size_t>((r1 - r0 + kRows - 1) / kRows) * panel_bytes);
  }
  for (int64_t r = r0; r < r1; r += kRows) {
    const uint8_t* panel = packed + static_cast<size_t>(r / kRows) * panel_bytes;
    const int n_valid = static_cast<int>(std::min<int64_t>(kRows, r1 - r));
    if (!in_place) {
      expand(panel, scratch);
      avx512_tile_panel(w.type, scratch, nb, acts, act_row_bytes, n_tokens, y + r, w.n_out,
                        n_valid);
      continue;
    }
    for (int64_t t = 0; t < n_tokens; t += kTokens) {
      const int nt = static_cast<int>(std::min<int64_t>(kTokens, n_tokens - t));
      kernel(panel, acts + static_cast<size_t>(t) * act_row_bytes, nt, y + t * w.n_out + r,
             n_valid);
    }
  }
}

}  // namespace

void avx512_packed_rows(const WeightView& w, const uint8_t* acts, size_t act_row_bytes,
                        int64_t n_tokens, int64_t r0, int64_t r1, float* y, uint8_t* scratch) {
  assert(w.packed != nullptr && r0 % kRows == 0);
  if (const B32Kernels* ks = b32_kernels_of(w.type)) {
    const int64_t nb = w.n_in / kQK32;
    const B32Layout l = b32_layout(b32_spec(w.type), nb);
    packed_panels(
        w, l.panel, nb, acts, act_row_bytes, n_tokens, r0, r1, y, scratch,
        [&](const uint8_t* panel, uint8_t* out) { ks->expand(panel, l, nb, out); },
        [&](const uint8_t* panel, const uint8_t* a, int nt, float* yt, int n_valid) {
          ks->k[nt](panel, l, nb, a, act_row_bytes, yt, w.n_out, n_valid);
        });
    return;
  }
  assert(packable_k(w.type));
  const int64_t nb = w.n_in / kQKK;
  const Layout l = layout(w.type, nb);
  const bool q6 = w.type == GgmlType::Q6_K;
  const KernelFn* ks = q6 ? kKernels<true> : kKernels<false>;
  packed_panels(
      w, l.panel, nb, acts, act_row_bytes, n_tokens, r0, r1, y, scratch,
      [&](const uint8_t* panel, uint8_t* out) {
        if (q6) {
          expand<true>(panel, l, nb, out);
        } else {
          expand<false>(panel, l, nb, out);
        }
      },
      [&](const uint8_t* panel, const uint8_t* a, int nt, float* yt, int n_valid) {
        ks[nt](panel, l, nb, a, act_row_bytes, yt, w.n_out, n_valid);
      });
}

}  // namespace bie::cpu
