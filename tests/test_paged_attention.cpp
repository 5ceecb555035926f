// Fused paged attention (online softmax, split-K, prefill tiles) against its scalar reference twin
// (dequantise with load(), double softmax), for every KV format, mixed FP16/body tables, GQA
// groups, split counts and causal prefill tiles; then PagedKvCache end to end (store + attend
// through the cache, with and without --kv-rotate) against the same reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/paged_attention.h"
#include "bie/attention/attention_runner.h"
#include "bie/backend/kv_format.h"
#include "bie/backend/kv_format_rotate.h"
#include "bie/backend/kv_layout.h"
#include "bie/backend/thread_pool.h"
#include "bie/common/cpu_features.h"
#include "bie/kv/paged_kv_cache.h"
#include "bie/model/model.h"
#include "bie/quant/fp16.h"
#include "bie/tokenizer/tokenizer.h"
#include "support/contiguous_kv_cache.h"
#include "support/generate.h"
#include "support/paths.h"

namespace bie::attention {

// Defined in paged_attention_avx2.cpp (dense_attention's FP16 K-dot order).
void f16_dot_dense_order_avx2(int head_dim, const float* q, const uint8_t* tile, int n,
                              float* scores);

namespace {

using planner::KvFormat;
using planner::KvType;

constexpr KvFormat kF16{KvType::kF16, 0};

KvFormat fmt(const char* name) {
  auto f = planner::parse_kv_format(name);
  EXPECT_TRUE(f.ok()) << name;
  return f.value();
}

// A sequence's blocks in memory: block b stores K/V of tokens [bB, (b+1)B) for n_kv_heads heads,
// in (k_fmt, v_fmt) or FP16 for sink/window blocks.
struct Blocks {
  std::vector<std::vector<uint8_t>> k, v;
  std::vector<PagedBlockView> views;
  bool any_f16 = false;
};

struct Shape {
  int n_kv_heads = 2;
  int group = 3;
  int head_dim = 64;
  int block_size = 16;
};

// fp16_blocks(b): whether block b is a sink/window block.
template <class IsFp16>
Blocks make_blocks(const Shape& s, int64_t n_tokens, KvFormat kf, KvFormat vf, IsFp16 fp16_block,
                   std::mt19937& rng) {
  const int d = s.head_dim, B = s.block_size, H = s.n_kv_heads;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Blocks out;
  const int64_t nb = (n_tokens + B - 1) / B;
  std::vector<float> rows(static_cast<size_t>(B) * d);
  for (int64_t b = 0; b < nb; ++b) {
    const bool f16 = fp16_block(b);
    const KvFormat k = f16 ? kF16 : kf, v = f16 ? kF16 : vf;
    out.any_f16 |= (k.type == KvType::kF16 || v.type == KvType::kF16);
    PagedBlockView bv;
    bv.tk = kv::kv_traits(k.type);
    bv.tv = kv::kv_traits(v.type);
    bv.gk = kv::kv_row_geom(k, d);
    bv.gv = kv::kv_row_geom(v, d);
    bv.k_tile_bytes = kv::kv_tile_bytes(k, d, B);
    bv.v_tile_bytes = kv::kv_tile_bytes(v, d, B);
    bv.k_f16 = k.type == KvType::kF16;
    out.k.emplace_back(bv.k_tile_bytes * H);
    out.v.emplace_back(bv.v_tile_bytes * H);
    for (int h = 0; h < H; ++h) {
      // Keys with an outlier channel (as real keys have), values plain normal.
      for (int i = 0; i < B * d; ++i)
        rows[static_cast<size_t>(i)] = nd(rng) * (i % d == 5 ? 6.0f : 1.0f);
      bv.tk->store(bv.gk, rows.data(), out.k.back().data() + h * bv.k_tile_bytes, 0, B);
      for (float& x : rows) x = nd(rng);
      bv.tv->store(bv.gv, rows.data(), out.v.back().data() + h * bv.v_tile_bytes, 0, B);
    }
    out.views.push_back(bv);
  }
  for (size_t b = 0; b < out.views.size(); ++b) {
    out.views[b].k = out.k[b].data();
    out.views[b].v = out.v[b].data();
  }
  return out;
}

// Runs queries q_pos0 .. q_pos0 + n_q - 1 of KV head hk as `splits` split tasks + merge.
// q and the result: [n_q, n_kv * group, head_dim].
std::vector<float> run_tile(const detail::TileKernels& kern, const Blocks& bl, const Shape& s,
                            int64_t q_pos0, int n_q, int hk, int splits, float scale,
                            const std::vector<float>& q, int n_kv = 1, int64_t window = 0) {
  const int d = s.head_dim, G = s.group, rows = n_q * n_kv * G;
  PagedAttnTile t;
  t.blocks = bl.views.data();
  t.block_size = s.block_size;
  t.q_pos0 = q_pos0;
  t.n_q = n_q;
  t.kv_head = hk;
  t.n_kv = n_kv;
  t.group = G;
  t.head_dim = d;
  t.scale = scale;
  t.window = window;
  t.q = q.data();
  t.q_stride = static_cast<int64_t>(n_kv) * G * d;
  std::vector<float> scratch(paged_attn_scratch_floats(rows, d, s.block_size));
  std::vector<float> pbuf(paged_partial_floats(rows, d) * static_cast<size_t>(splits));
  std::vector<PagedAttnPartial> parts;
  const int64_t nb = (q_pos0 + n_q + s.block_size - 1) / s.block_size;
  for (int sp = 0; sp < splits; ++sp) {
    parts.push_back(partial_at(pbuf.data() + paged_partial_floats(rows, d) * sp, rows, d));
    t.block_begin = nb * sp / splits;
    t.block_end = nb * (sp + 1) / splits;
    detail::attend_paged_tile_with(kern, t, scratch.data(), parts.back());
  }
  std::vector<float> out(static_cast<size_t>(rows) * d, -1.0f);
  merge_paged_partials(parts.data(), splits, n_q, n_kv, G, d, out.data(), t.q_stride);
  return out;
}

struct Case {
  const char* k;
  const char* v;
  bool mixed;  // block 0 and the last 2 blocks FP16
};

const Case kCases[] = {
    {"f16", "f16", false},
    {"fp8_e4m3", "fp8_e4m3", false},
    {"int8", "int8", false},
    {"int4_asym_g32", "int4_asym_g32", false},
    {"int4_asym_g64", "int4_asym_g64", false},
    {"int4_asym_g128", "int4_asym_g128", false},
    {"int4_channel_t16", "int4_asym_g64", false},
    {"int4_asym_g64", "int4_asym_g64", true},
    {"int4_channel_t16", "int4_asym_g64", true},
    {"int8", "fp8_e4m3", true},
    {"int8_channel_t16", "int8", false},
};

// Largest |a - b| over all elements.
double max_diff(const float* a, const float* b, size_t n) {
  double m = 0.0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  return m;
}

// FP16 K tiles round q to fp16 (dense_attention's arithmetic): ~1e-3 off the unrounded
// reference. Quantised tiles are exact dequantisation, off only by fp32 rounding.
double tolerance(bool any_f16) {
  return any_f16 ? 4e-3 : 2e-5;
}

// The AVX2 / AVX-512 kernels score int4_channel keys by the int8-query method
// (detail::int4_channel_scores_i8q), which moves each score by some delta against exact
// dequantisation. With |delta| * scale <= e, every softmax weight moves by a factor within
// [exp(-2e), exp(2e)], so an output moves by at most expm1(2e) * max|v|: the tolerance of those
// kernels is tolerance(any_f16) plus that bound, e measured here over every int4_channel K tile of
// `bl` (all KV heads) and every query row of q.
// They also sum int4_asym V with the weights p_j * scale_j rounded to bf16 (8 significant bits:
// relative error <= 2^-8), so an output moves by at most 2^-8 * 15 * max scale_j more (a code is
// at most 15).
double i8q_tolerance(const Blocks& bl, const Shape& s, const std::vector<float>& q, float scale) {
  const int d = s.head_dim, B = s.block_size;
  double e = 0.0, vmax = 0.0, smax = 0.0;
  std::vector<float> want(static_cast<size_t>(B)), got(static_cast<size_t>(B));
  std::vector<float> v(static_cast<size_t>(B) * d);
  for (const PagedBlockView& bv : bl.views) {
    for (int h = 0; h < s.n_kv_heads; ++h) {
      bv.tv->load(bv.gv, bv.v + h * bv.v_tile_bytes, 0, B, v.data());
      for (const float x : v) vmax = std::max(vmax, static_cast<double>(std::fabs(x)));
      if (bv.tv->type == KvType::kInt4Asym) {
        const int G = bv.gv.group;
        const uint8_t* vt = bv.v + h * bv.v_tile_bytes;
        for (int j = 0; j < B; ++j) {
          for (int g = 0; g < d / G; ++g) {
            const uint8_t* grp = vt + j * kv::row_bytes_int4(d, G) + g * kv::group_bytes_int4(G);
            uint16_t h16;
            std::memcpy(&h16, grp, 2);
            smax = std::max(smax, static_cast<double>(std::fabs(quant::fp16_to_fp32(h16))));
          }
        }
      }
      if (bv.tk->type != KvType::kInt4Channel || d % 64 != 0) continue;
      const uint8_t* tile = bv.k + h * bv.k_tile_bytes;
      for (size_t r = 0; r < q.size() / d; ++r) {
        const float* qr = q.data() + r * d;
        bv.tk->dot(bv.gk, qr, tile, 0, B, want.data());
        detail::int4_channel_scores_i8q(d, tile, B, &qr, 1, got.data(), B);
        e = std::max(e, max_diff(want.data(), got.data(), want.size()) * scale);
      }
    }
  }
  return tolerance(bl.any_f16) + std::expm1(2.0 * e) * vmax + 0x1p-8 * 15.0 * smax;
}

std::vector<detail::TileKernels> kernel_sets() {
  std::vector<detail::TileKernels> k = {detail::generic_kernels()};
  if (has_avx2()) k.push_back(detail::avx2_kernels());
  if (has_avx512()) k.push_back(detail::avx512_kernels(false));
  if (has_avx512() && cpu_features().avx512bf16) k.push_back(detail::avx512_kernels(true));
  return k;
}

TEST(PagedAttention, DecodeMatchesReferenceEveryFormatLengthGroupSplit) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int checked = 0;
  for (const Case& c : kCases) {
    for (int64_t n : {1, 15, 16, 17, 100, 1100}) {
      for (int group : {1, 3, 4}) {
        Shape s;
        s.group = group;
        s.head_dim = fmt(c.k).group == 128 ? 128 : 64;  // g128 needs two groups' width
        const int64_t nb = (n + 15) / 16;
        // Mixed: sink block 0 and a 32-token window; n < 48 has no body (window > context).
        Blocks bl = make_blocks(
            s, n, fmt(c.k), fmt(c.v), [&](int64_t b) { return c.mixed && (b == 0 || b >= nb - 2); },
            rng);
        std::vector<float> q(static_cast<size_t>(group) * s.head_dim);
        for (float& x : q) x = nd(rng);
        std::vector<float> ref(q.size());
        const float scale = 0.125f;
        const int hk = 1;
        attend_paged_reference(bl.views.data(), 16, n, hk, group, s.head_dim, scale, q.data(),
                               ref.data());
        const auto kernels = kernel_sets();
        const double simd_tol = i8q_tolerance(bl, s, q, scale);
        for (size_t ki = 0; ki < kernels.size(); ++ki) {
          const auto& kern = kernels[ki];
          const double tol = ki == 0 ? tolerance(bl.any_f16) : simd_tol;
          for (int splits = 1; splits <= 4; ++splits) {
            const auto out = run_tile(kern, bl, s, n - 1, 1, hk, splits, scale, q);
            const double e = max_diff(out.data(), ref.data(), ref.size());
            EXPECT_LT(e, tol) << c.k << "/" << c.v << (c.mixed ? " mixed" : "") << " n=" << n
                              << " group=" << group << " splits=" << splits;
            ++checked;
          }
          // Both KV heads in one task (adjacent tiles read as one run), 2 splits.
          std::vector<float> q2(2 * q.size());
          for (float& x : q2) x = nd(rng);
          const auto out2 = run_tile(kern, bl, s, n - 1, 1, 0, 2, scale, q2, 2);
          const double tol2 = ki == 0 ? tolerance(bl.any_f16) : i8q_tolerance(bl, s, q2, scale);
          for (int h = 0; h < 2; ++h) {
            std::vector<float> ref2(q.size());
            attend_paged_reference(bl.views.data(), 16, n, h, group, s.head_dim, scale,
                                   q2.data() + h * q.size(), ref2.data());
            EXPECT_LT(max_diff(out2.data() + h * q.size(), ref2.data(), ref2.size()), tol2)
                << c.k << "/" << c.v << " n=" << n << " group=" << group << " both heads, head "
                << h;
          }
        }
      }
    }
  }
  EXPECT_GE(checked, 10 * 6 * 3 * 4);
}

TEST(PagedAttention, PrefillTileCausalMask) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const Case& c : kCases) {
    for (int64_t pos0 : {0, 5, 33, 700}) {
      for (int n_q : {1, 7, 16}) {
        Shape s;
        s.group = 3;
        s.head_dim = fmt(c.k).group == 128 ? 128 : 64;
        const int64_t n = pos0 + n_q;
        const int64_t nb = (n + 15) / 16;
        Blocks bl = make_blocks(
            s, n, fmt(c.k), fmt(c.v), [&](int64_t b) { return c.mixed && (b == 0 || b >= nb - 2); },
            rng);
        const int d = s.head_dim, G = s.group;
        std::vector<float> q(static_cast<size_t>(n_q) * G * d);
        for (float& x : q) x = nd(rng);
        const auto kernels = kernel_sets();
        const double simd_tol = i8q_tolerance(bl, s, q, 0.125f);
        for (size_t ki = 0; ki < kernels.size(); ++ki) {
          const auto& kern = kernels[ki];
          const double tol = ki == 0 ? tolerance(bl.any_f16) : simd_tol;
          for (int splits : {1, 3}) {
            const auto out = run_tile(kern, bl, s, pos0, n_q, 0, splits, 0.125f, q);
            for (int i = 0; i < n_q; ++i) {
              std::vector<float> ref(static_cast<size_t>(G) * d);
              attend_paged_reference(bl.views.data(), 16, pos0 + i + 1, 0, G, d, 0.125f,
                                     q.data() + static_cast<size_t>(i) * G * d, ref.data());
              const double e =
                  max_diff(out.data() + static_cast<size_t>(i) * G * d, ref.data(), ref.size());
              EXPECT_LT(e, tol) << c.k << "/" << c.v << " pos0=" << pos0 << " n_q=" << n_q
                                << " query " << i;
            }
          }
        }
      }
    }
  }
}

// Sliding window: query p sees keys (p - window, p] only, in every format, kernel set and split;
// windows shorter than, equal to and longer than a block, and one wider than the context.
TEST(PagedAttention, PrefillTileSlidingWindow) {
  std::mt19937 rng(13);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const Case& c : kCases) {
    for (int64_t pos0 : {0, 21, 700}) {
      for (int n_q : {1, 16}) {
        Shape s;
        s.group = 2;
        s.head_dim = fmt(c.k).group == 128 ? 128 : 64;
        const int64_t n = pos0 + n_q;
        const int64_t nb = (n + 15) / 16;
        Blocks bl = make_blocks(
            s, n, fmt(c.k), fmt(c.v), [&](int64_t b) { return c.mixed && (b == 0 || b >= nb - 2); },
            rng);
        const int d = s.head_dim, G = s.group;
        std::vector<float> q(static_cast<size_t>(n_q) * G * d);
        for (float& x : q) x = nd(rng);
        const auto kernels = kernel_sets();
        const double simd_tol = i8q_tolerance(bl, s, q, 0.125f);
        for (size_t ki = 0; ki < kernels.size(); ++ki) {
          const auto& kern = kernels[ki];
          const double tol = ki == 0 ? tolerance(bl.any_f16) : simd_tol;
          for (int64_t window : {1, 5, 16, 40, 5000}) {
            for (int splits : {1, 3}) {
              const auto out = run_tile(kern, bl, s, pos0, n_q, 0, splits, 0.125f, q, 1, window);
              for (int i = 0; i < n_q; ++i) {
                std::vector<float> ref(static_cast<size_t>(G) * d);
                attend_paged_reference(bl.views.data(), 16, pos0 + i + 1, 0, G, d, 0.125f,
                                       q.data() + static_cast<size_t>(i) * G * d, ref.data(),
                                       window);
                const double e =
                    max_diff(out.data() + static_cast<size_t>(i) * G * d, ref.data(), ref.size());
                EXPECT_LT(e, tol) << c.k << "/" << c.v << " pos0=" << pos0 << " n_q=" << n_q
                                  << " window=" << window << " splits=" << splits << " query " << i;
              }
            }
          }
          // A window that covers the whole context is the unwindowed arithmetic, bit for bit.
          const auto full = run_tile(kern, bl, s, pos0, n_q, 0, 3, 0.125f, q);
          const auto wide = run_tile(kern, bl, s, pos0, n_q, 0, 3, 0.125f, q, 1, n + 1);
          EXPECT_EQ(full, wide) << c.k << "/" << c.v << " pos0=" << pos0;
        }
      }
    }
  }
}

// The reference with window w equals the reference over only the last w keys: a window of 1
// returns the query's own value row.
TEST(PagedAttention, ReferenceWindowOfOneIsOwnValue) {
  std::mt19937 rng(17);
  Shape s;
  s.group = 1;
  Blocks bl = make_blocks(
      s, 40, kF16, kF16, [](int64_t) { return true; }, rng);
  std::vector<float> q(64, 0.3f), out(64), v(64);
  attend_paged_reference(bl.views.data(), 16, 40, 0, 1, 64, 0.125f, q.data(), out.data(), 1);
  kv::kv_traits_scalar(KvType::kF16)->load(bl.views[2].gv, bl.views[2].v, 39 % 16, 1, v.data());
  EXPECT_LT(max_diff(out.data(), v.data(), 64), 1e-6);
}

// Kernels over a block where one query's scores are huge: the online max must rescale exactly.
TEST(PagedAttention, PeakedScoresRescale) {
  std::mt19937 rng(3);
  Shape s;
  s.group = 3;
  Blocks bl = make_blocks(
      s, 300, fmt("int8"), fmt("int8"), [](int64_t) { return false; }, rng);
  std::vector<float> q(static_cast<size_t>(s.group) * s.head_dim, 0.0f);
  for (size_t i = 0; i < q.size(); ++i) q[i] = (i % 64 == 5) ? 40.0f : 0.1f;  // hits the outlier
  std::vector<float> ref(q.size());
  attend_paged_reference(bl.views.data(), 16, 300, 0, s.group, s.head_dim, 0.125f, q.data(),
                         ref.data());
  for (const auto& kern : kernel_sets()) {
    const auto out = run_tile(kern, bl, s, 299, 1, 0, 2, 0.125f, q);
    EXPECT_LT(max_diff(out.data(), ref.data(), ref.size()), 1e-4);
  }
}

// The fused FP16 K scoring (rows batched, horizontal sums 4 at a time) must equal the dense
// order bit for bit: SmolLM2's golden logits move by tenths with K-dot summation order.
TEST(PagedAttention, F16ScoresBitIdenticalToDenseOrder) {
  if (!has_avx2()) GTEST_SKIP() << "no AVX2";
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const int d : {16, 48, 64, 128}) {
    const kv::KvRowGeom g{d, 0};
    const int B = 16;
    std::vector<float> x(static_cast<size_t>(B) * d);
    for (float& e : x) e = nd(rng);
    std::vector<uint8_t> tile(kv::kv_tile_bytes(kF16, d, B));
    kv::kv_traits_scalar(KvType::kF16)->store(g, x.data(), tile.data(), 0, B);
    PagedBlockView bv;
    bv.k = tile.data();
    bv.tk = kv::kv_traits_scalar(KvType::kF16);
    bv.gk = g;
    bv.k_f16 = true;
    for (const int n_rows : {1, 2, 3, 4, 5, 9}) {
      std::vector<float> q(static_cast<size_t>(n_rows) * d);
      for (float& e : q) e = nd(rng);
      std::vector<const float*> qp(static_cast<size_t>(n_rows));
      for (int r = 0; r < n_rows; ++r) qp[static_cast<size_t>(r)] = q.data() + r * d;
      for (const int rows : {1, 2, 3, 5, 7, 16}) {
        std::vector<float> s(static_cast<size_t>(n_rows) * B), want(static_cast<size_t>(B));
        detail::avx2_kernels().score(bv, tile.data(), rows, qp.data(), n_rows, s.data(), B);
        for (int r = 0; r < n_rows; ++r) {
          f16_dot_dense_order_avx2(d, qp[static_cast<size_t>(r)], tile.data(), rows, want.data());
          for (int j = 0; j < rows; ++j) {
            ASSERT_EQ(s[static_cast<size_t>(r * B + j)], want[static_cast<size_t>(j)])
                << "d " << d << " n_rows " << n_rows << " rows " << rows << " r " << r << " j "
                << j;
          }
        }
      }
    }
  }
}

// The SIMD tables' fp16 rounding of the queries and their per-row sums of a block's weights give
// the scalar kernels' bits: round to nearest even with ties, subnormals, overflow and signed
// zeros; row sums in index order for every row count (8-row groups and a tail) and every column
// count (8-column steps and a tail).
TEST(PagedAttention, SimdRoundingAndRowSumsGiveTheScalarBits) {
  if (!has_avx2()) GTEST_SKIP() << "no AVX2 on this machine (the scalar path is the reference)";
  const detail::TileKernels ref = detail::generic_kernels();
  std::vector<detail::TileKernels> simd = {detail::avx2_kernels()};
  if (has_avx512()) simd.push_back(detail::avx512_kernels(false));
  std::mt19937 rng(41);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> x(203);
  for (float& v : x) v = nd(rng);
  // fp16 ties (1 + 2^-11 and 1 + 3 * 2^-11), a subnormal half, beyond the largest half, -0.
  const float special[] = {1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 0x1.8p-20f, 70000.0f,   -0.0f,
                           65519.0f,        -65520.0f,       0x1p-25f,   0x1.4p-24f, 1e-30f};
  std::copy(std::begin(special), std::end(special), x.begin() + 3);
  for (const auto& k : simd) {
    for (const int n : {8, 64, 203}) {
      std::vector<float> want(static_cast<size_t>(n)), got(want.size());
      ref.round_fp16(x.data(), n, want.data());
      k.round_fp16(x.data(), n, got.data());
      for (int i = 0; i < n; ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(got[static_cast<size_t>(i)]),
                  std::bit_cast<uint32_t>(want[static_cast<size_t>(i)]))
            << "round n=" << n << " i=" << i << " x=" << x[static_cast<size_t>(i)];
      }
    }
    for (const int rows : {1, 7, 8, 12, 19}) {
      for (const int cols : {1, 5, 8, 16, 13}) {
        const int stride = 16;
        std::vector<float> sc(static_cast<size_t>(rows * stride));
        for (float& v : sc) v = std::exp(nd(rng));
        std::vector<float> want(static_cast<size_t>(rows), 0.5f), got(want);
        ref.add_row_sums(sc.data(), rows, stride, cols, want.data());
        k.add_row_sums(sc.data(), rows, stride, cols, got.data());
        ASSERT_EQ(got, want) << "rows=" << rows << " cols=" << cols;
      }
    }
  }
}

// The AVX-512 kernels do the AVX2 kernels' arithmetic on wider vectors: every output equals the
// AVX2 output bit for bit (every format pair, 16- and 64-token blocks, head widths 64 and 128,
// GQA groups 1 to 8 — the AVX-512 kernels fuse up to 8 rows, the AVX2 ones 4 —, partial blocks,
// prefill tiles, splits), so a token's bits do not depend on which of the two ISAs the machine
// has. Where the machine has AVX512_BF16, the kernels that sum int4_asym V by pair dot products
// are held to the same bits.
TEST(PagedAttention, Avx512KernelsGiveTheAvx2KernelsBits) {
  if (!has_avx512()) GTEST_SKIP() << "no AVX-512 on this machine (the AVX2 path is tested)";
  std::mt19937 rng(23);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const detail::TileKernels k2 = detail::avx2_kernels();
  std::vector<detail::TileKernels> wide = {detail::avx512_kernels(false)};
  if (cpu_features().avx512bf16) wide.push_back(detail::avx512_kernels(true));
  int checked = 0;
  for (const int B : {16, 64}) {
    for (const Case& c : kCases) {
      std::string kname = c.k;
      if (B == 64 && kname.ends_with("_t16")) kname.replace(kname.size() - 3, 3, "t64");
      for (const int d : {64, 128}) {
        if (fmt(c.k).group == 128 && d < 128) continue;
        for (const int group : {1, 2, 3, 4, 6, 7, 8}) {
          for (const int64_t n : {1, 7, 64, 129, 700}) {
            Shape s;
            s.group = group;
            s.head_dim = d;
            s.block_size = B;
            const int64_t nb = (n + B - 1) / B;
            Blocks bl = make_blocks(
                s, n, fmt(kname.c_str()), fmt(c.v),
                [&](int64_t b) { return c.mixed && (b == 0 || b >= nb - 2); }, rng);
            for (const int n_q : {1, 5}) {
              if (n_q > n) continue;
              std::vector<float> q(static_cast<size_t>(n_q) * group * d);
              for (float& x : q) x = nd(rng);
              for (const int splits : {1, 3}) {
                const auto want = run_tile(k2, bl, s, n - n_q, n_q, 1, splits, 0.125f, q);
                for (size_t wi = 0; wi < wide.size(); ++wi) {
                  const auto got = run_tile(wide[wi], bl, s, n - n_q, n_q, 1, splits, 0.125f, q);
                  ASSERT_EQ(got, want)
                      << kname << "/" << c.v << (c.mixed ? " mixed" : "") << " B=" << B
                      << " d=" << d << " group=" << group << " n=" << n << " n_q=" << n_q
                      << " splits=" << splits << (wi == 1 ? " (bf16)" : "");
                  ++checked;
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

// The AVX2 and AVX-512 int4_channel scores (the int8-query method) equal the scalar twin bit for
// bit: head widths 64, 128, 256, tiles of 16 and 64 rows with partial ones, 1 to 8 query rows,
// queries with an outlier channel and an all-zero query.
TEST(PagedAttention, Int4ChannelScoresGiveTheScalarTwinBits) {
  if (!has_avx2()) GTEST_SKIP() << "no AVX2 on this machine (the generic kernels have no twin)";
  std::mt19937 rng(31);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<detail::TileKernels> simd = {detail::avx2_kernels()};
  if (has_avx512()) simd.push_back(detail::avx512_kernels(false));
  int checked = 0;
  for (const int d : {64, 128, 256}) {
    for (const int T : {16, 64}) {
      const KvFormat f{KvType::kInt4Channel, T};
      PagedBlockView bv;
      bv.tk = kv::kv_traits(f.type);
      bv.gk = kv::kv_row_geom(f, d);
      std::vector<uint8_t> tile(kv::kv_tile_bytes(f, d, T));
      std::vector<float> rows(static_cast<size_t>(T) * d);
      for (size_t i = 0; i < rows.size(); ++i) rows[i] = nd(rng) * (i % d == 5 ? 6.0f : 1.0f);
      bv.tk->store(bv.gk, rows.data(), tile.data(), 0, T);
      for (const int n_rows : {1, 2, 3, 4, 5, 6, 7, 8}) {
        std::vector<float> q(static_cast<size_t>(n_rows) * d);
        for (size_t i = 0; i < q.size(); ++i) q[i] = nd(rng) * (i % d == 9 ? 8.0f : 1.0f);
        if (n_rows == 3) std::fill(q.begin() + d, q.begin() + 2 * d, 0.0f);  // amax 0
        std::vector<const float*> qp;
        for (int r = 0; r < n_rows; ++r) qp.push_back(q.data() + static_cast<size_t>(r) * d);
        for (const int n : {1, 5, 16, 17, 33, 64}) {
          if (n > T) continue;
          std::vector<float> want(static_cast<size_t>(n_rows) * T, -1.0f), got = want;
          detail::int4_channel_scores_i8q(d, tile.data(), n, qp.data(), n_rows, want.data(), T);
          for (const auto& k : simd) {
            std::fill(got.begin(), got.end(), -1.0f);
            k.score(bv, tile.data(), n, qp.data(), n_rows, got.data(), T);
            ASSERT_EQ(got, want) << "d=" << d << " T=" << T << " n_rows=" << n_rows
                                 << " rows=" << n;
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(PagedAttention, SplitPlan) {
  // Decode at 8k on 2 threads, 3 KV heads: 2 splits give 6 equal tasks.
  EXPECT_EQ(plan_kv_splits(3, 8192, 2), 2);
  EXPECT_EQ(plan_kv_splits(3, 500, 2), 1);   // too short to pay
  EXPECT_EQ(plan_kv_splits(3, 8192, 1), 1);  // one thread: nothing to balance
  EXPECT_EQ(plan_kv_splits(4, 8192, 2), 1);  // already balanced
  EXPECT_EQ(plan_kv_splits(96, 8192, 2), 1);
  EXPECT_EQ(plan_kv_splits(1, 8192, 4), 4);
  // Tasks: all 3 KV heads together with 2 splits at 8k on 2 threads; per head at 512.
  const PagedTaskPlan a = plan_paged_tasks(1, 3, 8192, 2);
  EXPECT_EQ(a.heads_per_task, 3);
  EXPECT_EQ(a.splits, 2);
  const PagedTaskPlan b = plan_paged_tasks(1, 3, 512, 2);
  EXPECT_EQ(b.heads_per_task, 1);
  EXPECT_EQ(b.splits, 1);
  EXPECT_EQ(plan_paged_tasks(1, 3, 512, 1).heads_per_task, 3);   // one thread: fuse the heads
  EXPECT_EQ(plan_paged_tasks(32, 3, 512, 2).heads_per_task, 3);  // prefill: enough tiles
}

// ---- PagedKvCache end to end ------------------------------------------------------------------

struct CacheCase {
  const char* k;
  const char* v;
  int window;
  bool rotate;
  int64_t swa = 0;  // attention's sliding window (0: none)
};

// The cache's attention of layer il for the last n queries vs the reference over its own storage.
class PagedCacheAttention : public ::testing::TestWithParam<CacheCase> {};

std::vector<PagedBlockView> cache_views(const PagedKvCache& c, int il) {
  const KvGeometry& g = c.geometry();
  const int d = g.head_dim, H = g.n_head_kv, B = c.layout().block_size;
  std::vector<PagedBlockView> views;
  for (const kv::BlockTableEntry& e : c.table()) {
    const bool f16 = e.pool == kv::PoolKind::kFp16;
    const KvFormat k = f16 ? kF16 : c.layout().k, v = f16 ? kF16 : c.layout().v;
    PagedBlockView bv;
    bv.tk = kv::kv_traits(k.type);
    bv.tv = kv::kv_traits(v.type);
    bv.gk = kv::kv_row_geom(k, d);
    bv.gv = kv::kv_row_geom(v, d);
    bv.k_tile_bytes = kv::kv_tile_bytes(k, d, B);
    bv.v_tile_bytes = kv::kv_tile_bytes(v, d, B);
    const size_t layer = H * (bv.k_tile_bytes + bv.v_tile_bytes);
    bv.k = c.block_storage(e) + il * layer;
    bv.v = bv.k + H * bv.k_tile_bytes;
    views.push_back(bv);
  }
  return views;
}

TEST_P(PagedCacheAttention, StoreAndAttendMatchReference) {
  const CacheCase cc = GetParam();
  KvGeometry g{2, 3, 64, {}};
  const int n_head = 9, d = 64;
  PagedKvCacheConfig cfg;
  cfg.geometry = g;
  cfg.layout.k = fmt(cc.k);
  cfg.layout.v = fmt(cc.v);
  cfg.layout.window_tokens = cc.window;
  cfg.layout.rotate = cc.rotate;
  cfg.max_tokens = 1400;
  // Pools with slack: a second prefill chunk during which a block leaves the window needs one
  // FP16 block more than the plan (docs/kv-cache.md §8).
  auto r = cfg.layout.mixed() ? PagedKvCache::create(cfg, 40, 100) : PagedKvCache::create(cfg);
  ASSERT_TRUE(r.ok()) << r.error();
  PagedKvCache& c = **r;
  CpuBackend pool(2);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t kv_dim = g.kv_dim(), q_dim = static_cast<int64_t>(n_head) * d;
  // Prefill 1100 tokens in chunks of 550, then decode 3 tokens; check the last step of each.
  for (int64_t chunk : {550, 550, 1, 1, 1}) {
    const int64_t pos0 = c.n_tokens();
    ASSERT_TRUE(c.append(chunk).ok());
    std::vector<float> k(chunk * kv_dim), v(chunk * kv_dim), q(chunk * q_dim), out(chunk * q_dim);
    for (float& x : k) x = nd(rng);
    for (float& x : v) x = nd(rng);
    for (float& x : q) x = nd(rng);
    for (int il = 0; il < g.n_layer; ++il) {
      c.store(il, pos0, chunk, k.data(), v.data());
      const auto views = cache_views(c, il);  // before the pass's migrations
      attention::attend(c, il, pos0, chunk, q.data(), n_head, 0.125f, out.data(), pool, cc.swa);
      for (int64_t i : {int64_t{0}, chunk - 1}) {
        for (int hk = 0; hk < g.n_head_kv; ++hk) {
          std::vector<float> qg(q.begin() + i * q_dim + hk * 3 * d,
                                q.begin() + i * q_dim + (hk + 1) * 3 * d);
          if (cc.rotate) {
            for (int h = 0; h < 3; ++h) kv::hadamard_rotate(qg.data() + h * d, d);
          }
          std::vector<float> ref(qg.size());
          attend_paged_reference(views.data(), 16, pos0 + i + 1, hk, 3, d, 0.125f, qg.data(),
                                 ref.data(), cc.swa);
          const bool any_f16 = true;  // sink/window blocks, or all-f16
          EXPECT_LT(max_diff(out.data() + i * q_dim + hk * 3 * d, ref.data(), ref.size()),
                    tolerance(any_f16))
              << "pos " << pos0 + i << " layer " << il << " head " << hk;
        }
      }
    }
    c.finish_pass();
    ASSERT_TRUE(c.check_integrity().ok());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PagedCacheAttention,
    ::testing::Values(CacheCase{"f16", "f16", 128, false},
                      CacheCase{"int4_asym_g64", "int4_asym_g64", 128, true},
                      CacheCase{"int4_channel_t16", "int4_asym_g64", 32, false},
                      CacheCase{"int8_channel_t16", "int8", 32, false},
                      CacheCase{"int8", "int8", 0, true}, CacheCase{"f16", "f16", 128, false, 300},
                      CacheCase{"int4_asym_g64", "int4_asym_g64", 128, false, 512},
                      CacheCase{"int8", "int8", 0, false, 33}));

// ContiguousKvCache's sliding window (dense kernels) against the paged f16 cache's, on a prefill
// longer than the window and decode steps after it; a window wider than the context changes no
// bit, a real one changes the result.
TEST(ContiguousCacheWindow, MatchesPagedF16) {
  const KvGeometry g{1, 2, 64, {}};
  const int n_head = 6, d = 64;
  const int64_t window = 100, kv_dim = g.kv_dim(), q_dim = int64_t{n_head} * d;
  ContiguousKvCache dense(g, 400);
  PagedKvCacheConfig cfg;
  cfg.geometry = g;
  cfg.layout.k = kF16;
  cfg.layout.v = kF16;
  cfg.max_tokens = 400;
  auto paged = PagedKvCache::create(cfg);
  ASSERT_TRUE(paged.ok()) << paged.error();
  CpuBackend pool(2);
  std::mt19937 rng(23);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t chunk : {300, 1, 1}) {
    const int64_t pos0 = dense.n_tokens();
    ASSERT_TRUE(dense.append(chunk).ok());
    ASSERT_TRUE((*paged)->append(chunk).ok());
    std::vector<float> k(chunk * kv_dim), v(chunk * kv_dim), q(chunk * q_dim);
    for (float& x : k) x = nd(rng);
    for (float& x : v) x = nd(rng);
    for (float& x : q) x = nd(rng);
    dense.store(0, pos0, chunk, k.data(), v.data());
    (*paged)->store(0, pos0, chunk, k.data(), v.data());
    std::vector<float> a(q.size()), b(q.size()), full(q.size()), wide(q.size());
    dense.attend(0, pos0, chunk, q.data(), n_head, 0.125f, a.data(), pool, window);
    attention::attend(**paged, 0, pos0, chunk, q.data(), n_head, 0.125f, b.data(), pool, window);
    (*paged)->finish_pass();
    dense.attend(0, pos0, chunk, q.data(), n_head, 0.125f, full.data(), pool, 0);
    dense.attend(0, pos0, chunk, q.data(), n_head, 0.125f, wide.data(), pool, pos0 + chunk);
    EXPECT_LT(max_diff(a.data(), b.data(), a.size()), 4e-3) << "pos0 " << pos0;
    EXPECT_EQ(full, wide) << "pos0 " << pos0;
    // The last query is past the window: masking moves its output.
    const float* al = a.data() + (chunk - 1) * q_dim;
    const float* fl = full.data() + (chunk - 1) * q_dim;
    EXPECT_GT(max_diff(al, fl, static_cast<size_t>(q_dim)), 1e-2) << "pos0 " << pos0;
  }
}

// With f16 storage, rotation only changes fp16 rounding of K: outputs agree to float tolerance.
TEST(PagedCacheRotate, F16RotatedEqualsUnrotated) {
  KvGeometry g{1, 3, 64, {}};
  std::vector<float> outs[2];
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t n = 300, kv_dim = g.kv_dim(), q_dim = 9 * 64;
  std::vector<float> k(n * kv_dim), v(n * kv_dim), q(n * q_dim);
  for (float& x : k) x = nd(rng);
  for (float& x : v) x = nd(rng);
  for (float& x : q) x = nd(rng);
  CpuBackend pool(2);
  for (int rot = 0; rot < 2; ++rot) {
    PagedKvCacheConfig cfg;
    cfg.geometry = g;
    cfg.layout.rotate = rot == 1;
    cfg.max_tokens = n;
    auto r = PagedKvCache::create(cfg);
    ASSERT_TRUE(r.ok()) << r.error();
    ASSERT_TRUE((*r)->append(n).ok());
    (*r)->store(0, 0, n, k.data(), v.data());
    outs[rot].resize(static_cast<size_t>(n * q_dim));
    attention::attend(**r, 0, 0, n, q.data(), 9, 0.125f, outs[rot].data(), pool);
  }
  const double e = max_diff(outs[0].data(), outs[1].data(), outs[0].size());
  EXPECT_LT(e, 3e-3);
  EXPECT_GT(e, 0.0);  // the rotation did happen (different fp16 rounding of K)
}

// Drives SmolLM2 through a ContiguousKvCache and feeds the same real K/V/queries to paged caches:
// paged[0] all-f16 (the baseline), the others quantised. Accumulates each one's attention output
// error against paged[0] over all layers and positions.
class TeeKvCache final : public KvCache {
 public:
  TeeKvCache(const KvGeometry& g, int64_t max_tokens,
             std::vector<std::unique_ptr<PagedKvCache>> paged)
      : inner_(g, max_tokens), paged_(std::move(paged)), err_(paged_.size(), 0.0) {}
  const KvGeometry& geometry() const override { return inner_.geometry(); }
  int64_t n_tokens() const override { return inner_.n_tokens(); }
  int64_t capacity() const override { return inner_.capacity(); }
  bool can_append(int64_t n) const override { return inner_.can_append(n); }
  Status append(int64_t n) override {
    for (auto& p : paged_) {
      if (Status s = p->append(n); !s) return s;
    }
    return inner_.append(n);
  }
  void store(int il, int64_t pos0, int64_t n, const float* k, const float* v) override {
    for (auto& p : paged_) p->store(il, pos0, n, k, v);
    inner_.store(il, pos0, n, k, v);
  }
  void attend(int il, int64_t pos0, int64_t n, const float* q, int n_head, float scale, float* out,
              Backend& pool, int64_t window = 0) override {
    const size_t len = static_cast<size_t>(n * n_head * geometry().head_dim);
    std::vector<std::vector<float>> outs(paged_.size(), std::vector<float>(len));
    for (size_t i = 0; i < paged_.size(); ++i) {
      attention::attend(*paged_[i], il, pos0, n, q, n_head, scale, outs[i].data(), pool, window);
    }
    for (size_t i = 1; i < paged_.size(); ++i) {
      for (size_t j = 0; j < len; ++j) {
        const double e = outs[i][j] - outs[0][j];
        err_[i] += e * e;
      }
    }
    inner_.attend(il, pos0, n, q, n_head, scale, out, pool, window);
  }
  void finish_pass() override {
    for (auto& p : paged_) p->finish_pass();
  }
  Status truncate(int64_t n) override { return inner_.truncate(n); }
  const std::vector<double>& errors() const { return err_; }

 private:
  ContiguousKvCache inner_;
  std::vector<std::unique_ptr<PagedKvCache>> paged_;
  std::vector<double> err_;
};

// int4_asym_g64 keys (V kept f16 to isolate K) on real SmolLM2 keys: the Hadamard rotation
// spreads the outlier channels, so the attention output is closer to f16's.
TEST(PagedCacheRotate, RotationReducesInt4KeyErrorOnSmolLM2) {
  BIE_REQUIRE_FILE(test::smollm2_path());
  auto m = load_model(test::smollm2_path());
  ASSERT_TRUE(m.ok()) << m.error() << " (run `make models`)";
  Model& model = **m;
  auto tok = tokenizer::Tokenizer::from_gguf(model.file());
  ASSERT_TRUE(tok.ok());
  const std::string text =
      test::read_file(test::source_dir() + "/../shared/data/tinyshakespeare.txt").substr(0, 2000);
  std::vector<int32_t> ids;
  for (auto t : tok->encode(text)) ids.push_back(static_cast<int32_t>(t));
  ASSERT_GE(ids.size(), 256u);
  ids.resize(256);
  const KvGeometry g = kv::kv_geometry(model.geometry());
  std::vector<std::unique_ptr<PagedKvCache>> paged;
  for (int i = 0; i < 3; ++i) {
    PagedKvCacheConfig cfg;
    cfg.geometry = g;
    cfg.layout.k = i == 0 ? planner::kKvF16 : fmt("int4_asym_g64");
    cfg.layout.window_tokens = i == 0 ? 128 : 16;  // quantise all but the sink and 16 tokens
    cfg.layout.rotate = i == 2;
    cfg.max_tokens = 256;
    auto r = PagedKvCache::create(cfg);
    ASSERT_TRUE(r.ok()) << r.error();
    paged.push_back(std::move(r).value());
  }
  TeeKvCache tee(g, 256, std::move(paged));
  CpuBackend pool(2);
  // Prefill 64 tokens, then decode token by token (planner-exact pools, docs/kv-cache.md §8).
  auto a = prompt_logits(model, tee, pool, std::vector<int32_t>(ids.begin(), ids.begin() + 64));
  ASSERT_TRUE(a.ok()) << a.error();
  std::vector<float> logits;
  for (size_t i = 64; i < ids.size(); ++i) {
    ASSERT_TRUE(forward_into(model, std::span<const int32_t>(&ids[i], 1), tee, pool, logits).ok());
  }
  const double plain = tee.errors()[1], rotated = tee.errors()[2];
  std::printf(
      "  SmolLM2 int4_asym_g64 K, attention output squared error vs f16: plain %.4g, "
      "rotated %.4g (ratio %.2f)\n",
      plain, rotated, rotated / plain);
  EXPECT_GT(plain, 0.0);
  EXPECT_LT(rotated, 0.8 * plain);
}

TEST(PagedCacheRotate, NeedsPowerOfTwoHeadDim) {
  PagedKvCacheConfig cfg;
  cfg.geometry = KvGeometry{1, 2, 48, {}};
  cfg.layout.rotate = true;
  cfg.max_tokens = 64;
  auto r = PagedKvCache::create(cfg);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("--kv-rotate needs a power-of-two head_dim, got 48"), std::string::npos)
      << r.error();
  cfg.layout.rotate = false;
  EXPECT_TRUE(PagedKvCache::create(cfg).ok());
}

}  // namespace
}  // namespace bie::attention
