#include "backend/cpu/paged_attention.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <vector>

#include "bie/common/cpu_features.h"
#include "bie/quant/fp16.h"

namespace bie::attention {

void f16_dot_dense_order_avx2(int head_dim, const float* q, const uint8_t* tile, int n,
                              float* scores);

namespace {

// Pointer arrays live on the stack; PagedKvCache keeps n_q * n_kv * group within this.
constexpr int kMaxTileRows = 256;

inline float round_fp16(float x) {
  return quant::fp16_to_fp32(quant::fp32_to_fp16(x));
}

// A block's tiles are a few hundred bytes to a few KiB each, one block (all layers) apart: too
// short and too far apart for the hardware prefetcher. So while a head's tile of the current
// block is computed, the same head's tile of the next block is requested, into L2 (prefetcht1),
// one tile at a time. (Requesting the next block's every K and V tile at once into L1 made
// decode attention at 8k slower than no prefetch at all on an AMD EPYC: a single thread's
// SmolLM2 f16 block took 2.3 us against 2.1 without and 1.5 this way, docs/performance.md.)
void prefetch_tile(const uint8_t* tile, size_t bytes) {
  for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(tile + o, 0, 2);
}

void generic_score(const PagedBlockView& bv, const uint8_t* tile, int rows, const float* const* q,
                   int n_rows, float* s, int s_stride) {
  const int d = bv.gk.head_dim;
  const bool dense_order = bv.k_f16 && has_avx2() && d % 8 == 0;
  for (int r = 0; r < n_rows; ++r) {
    if (dense_order) {
      f16_dot_dense_order_avx2(d, q[r], tile, rows, s + r * s_stride);
    } else {
      bv.tk->dot(bv.gk, q[r], tile, 0, rows, s + r * s_stride);
    }
  }
}

void generic_accum(const PagedBlockView& bv, const uint8_t* tile, int rows, const float* p,
                   int p_stride, float* const* acc, int n_rows) {
  for (int r = 0; r < n_rows; ++r) bv.tv->axpy(bv.gv, p + r * p_stride, tile, 0, rows, acc[r]);
}

void generic_update(float* sr, int rows, int lim, float scale, float* m, float* l, float* acc,
                    int d) {
  float mx = -INFINITY;
  for (int j = 0; j < lim; ++j) {
    sr[j] *= scale;
    mx = std::max(mx, sr[j]);
  }
  const float m_old = *m;
  const float m_new = std::max(m_old, mx);
  for (int j = 0; j < lim; ++j) sr[j] = std::exp(sr[j] - m_new);
  std::fill(sr + lim, sr + rows, 0.0f);
  if (m_new > m_old) {  // rescale what was accumulated against the old max
    const float alpha = std::exp(m_old - m_new);  // 0 when m_old = -inf
    *l *= alpha;
    for (int c = 0; c < d; ++c) acc[c] *= alpha;
  }
  *m = m_new;
}

void generic_round_fp16(const float* x, int n, float* out) {
  for (int c = 0; c < n; ++c) out[c] = round_fp16(x[c]);
}

// Rows interleaved: n_rows independent chains instead of one chain per row.
void generic_add_row_sums(const float* s, int n_rows, int stride, int cols, float* l) {
  float sum[kMaxTileRows];
  std::fill(sum, sum + n_rows, 0.0f);
  for (int j = 0; j < cols; ++j) {
    for (int r = 0; r < n_rows; ++r) sum[r] += s[r * stride + j];
  }
  for (int r = 0; r < n_rows; ++r) l[r] += sum[r];
}

}  // namespace

namespace detail {

TileKernels generic_kernels() {
  return TileKernels{generic_score, generic_accum, generic_update, generic_round_fp16,
                     generic_add_row_sums};
}

void attend_paged_tile_with(const TileKernels& kern, const PagedAttnTile& t, float* scratch,
                            const PagedAttnPartial& part) {
  const int d = t.head_dim, B = t.block_size, G = t.group;
  const int QG = t.n_q * G;   // rows per KV head
  const int R = t.n_kv * QG;  // row r = (h, i, g): KV head h, query i, group head g
  assert(t.n_q >= 1 && t.n_q <= kMaxTileQ && t.n_kv >= 1 && R <= kMaxTileRows && d <= 512);
  float* qr = scratch;    // [R, d] queries rounded to fp16 (for FP16 K tiles)
  float* s = qr + R * d;  // [R, B] one block's scores, then its weights exp(s - m)
  const float* qf[kMaxTileRows];
  const float* qh[kMaxTileRows];
  float* acc[kMaxTileRows];
  for (int r = 0; r < R; ++r) {
    const int h = r / QG, i = r % QG / G, g = r % G;
    qf[r] = t.q + i * t.q_stride + static_cast<int64_t>(h * G + g) * d;
    kern.round_fp16(qf[r], d, qr + r * d);
    qh[r] = qr + r * d;
    acc[r] = part.acc + static_cast<int64_t>(r) * d;
    std::fill(acc[r], acc[r] + d, 0.0f);
    part.m[r] = -INFINITY;
    part.l[r] = 0.0f;
  }
  const int64_t vis_end = t.q_pos0 + t.n_q;  // the last query sees positions < vis_end
  for (int64_t b = t.block_begin; b < t.block_end; ++b) {
    const int64_t kv0 = b * B;
    if (kv0 >= vis_end) break;
    const int rows = static_cast<int>(std::min<int64_t>(B, vis_end - kv0));
    const PagedBlockView& bv = t.blocks[b];
    // The next block this tile reads (null: none).
    const PagedBlockView* next =
        b + 1 < t.block_end && (b + 1) * B < vis_end ? &t.blocks[b + 1] : nullptr;
    // The tile's KV heads' K tiles are adjacent in the block: one sequential read.
    for (int h = 0; h < t.n_kv; ++h) {
      if (next != nullptr) {
        prefetch_tile(next->k + static_cast<size_t>(t.kv_head + h) * next->k_tile_bytes,
                      next->k_tile_bytes);
      }
      const uint8_t* kt = bv.k + static_cast<size_t>(t.kv_head + h) * bv.k_tile_bytes;
      kern.score(bv, kt, rows, (bv.k_f16 ? qh : qf) + h * QG, QG, s + h * QG * B, B);
    }
    for (int r = 0; r < R; ++r) {
      float* sr = s + r * B;
      const int i = r % QG / G;
      const int lim = static_cast<int>(std::clamp<int64_t>(t.q_pos0 + i + 1 - kv0, 0, rows));
      // Sliding window: rows [0, lo) are older than the query's window.
      const int lo =
          t.window > 0
              ? static_cast<int>(std::clamp<int64_t>(t.q_pos0 + i + 1 - t.window - kv0, 0, rows))
              : 0;
      if (lim <= lo) {  // the whole block is in this query's future (or before its window)
        std::fill(sr, sr + rows, 0.0f);
        continue;
      }
      // The kernel sees the visible run [lo, lim) as its rows [0, lim - lo) (lo = 0 without a
      // window: the unwindowed arithmetic, bit for bit); the weights before it are 0.
      std::fill(sr, sr + lo, 0.0f);
      kern.update(sr + lo, rows - lo, lim - lo, t.scale, part.m + r, part.l + r, acc[r], d);
    }
    // l += the block's weights, summed in index order per row (SmolLM2's golden logits sit close
    // enough to the 0.6 bar that a lane-wise order moved one past it). Masked weights are 0.
    kern.add_row_sums(s, R, B, rows, part.l);
    for (int h = 0; h < t.n_kv; ++h) {
      if (next != nullptr) {
        prefetch_tile(next->v + static_cast<size_t>(t.kv_head + h) * next->v_tile_bytes,
                      next->v_tile_bytes);
      }
      const uint8_t* vt = bv.v + static_cast<size_t>(t.kv_head + h) * bv.v_tile_bytes;
      kern.accum(bv, vt, rows, s + h * QG * B, B, acc + h * QG, QG);
    }
  }
}

void int4_channel_scores_i8q(int d, const uint8_t* tile, int rows, const float* const* q,
                             int n_rows, float* s, int ss) {
  assert(d % 64 == 0 && d <= 512);
  constexpr int kBlockBytes = 32;  // block k: channels 32k.. and half + 32k.. (64 channels)
  const int half = d / 2, nb = half / kBlockBytes;
  const auto param = [&](int c, int k) {
    uint16_t h;
    std::memcpy(&h, tile + 4 * c + 2 * k, 2);
    return quant::fp16_to_fp32(h);
  };
  const uint8_t* codes = tile + 4 * static_cast<size_t>(d);
  std::vector<float> qs(static_cast<size_t>(d)), sq(static_cast<size_t>(nb));
  std::vector<int32_t> q1(static_cast<size_t>(d)), q2(static_cast<size_t>(d));
  std::vector<std::vector<int>> blocks(static_cast<size_t>(nb));  // each block's 64 channels
  for (int k = 0; k < nb; ++k) {
    for (const int c0 : {kBlockBytes * k, half + kBlockBytes * k}) {
      for (int i = 0; i < kBlockBytes; ++i) blocks[static_cast<size_t>(k)].push_back(c0 + i);
    }
  }
  const auto channels = [&](int k) -> const std::vector<int>& {
    return blocks[static_cast<size_t>(k)];
  };
  const auto code = [&](int j, int c) {
    const uint8_t b = codes[static_cast<size_t>(j) * half + c % half];
    return c < half ? b & 0x0F : b >> 4;
  };
  for (int r = 0; r < n_rows; ++r) {
    // fold_channel_params: qs = q * scale; zt = q . zero in 8 lanes, summed as simd::hsum does.
    float lane[8] = {};
    for (int c = 0; c < d; ++c) {
      qs[static_cast<size_t>(c)] = q[r][c] * param(c, 0);
      lane[c % 8] = std::fma(q[r][c], param(c, 1), lane[c % 8]);
    }
    const float zt =
        ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
    for (int k = 0; k < nb; ++k) {
      float amax = 0.0f;
      for (const int c : channels(k)) amax = std::max(amax, std::fabs(qs[static_cast<size_t>(c)]));
      sq[static_cast<size_t>(k)] = amax / 127.0f * 0.0078125f;
      const float u = amax > 0.0f ? 127.0f / amax : 0.0f;
      for (const int c : channels(k)) {
        const float t = qs[static_cast<size_t>(c)] * u;
        const float t1 = std::nearbyint(t);
        q1[static_cast<size_t>(c)] = static_cast<int32_t>(t1);
        q2[static_cast<size_t>(c)] = static_cast<int32_t>(std::nearbyint((t - t1) * 128.0f));
      }
    }
    for (int j = 0; j < rows; ++j) {
      float score = zt;
      for (int k = 0; k < nb; ++k) {
        int32_t s1 = 0, s2 = 0;
        for (const int c : channels(k)) {
          s1 += q1[static_cast<size_t>(c)] * code(j, c);
          s2 += q2[static_cast<size_t>(c)] * code(j, c);
        }
        score = std::fma(static_cast<float>(128 * s1 + s2), sq[static_cast<size_t>(k)], score);
      }
      s[r * ss + j] = score;
    }
  }
}

}  // namespace detail

int plan_kv_splits(int64_t tiles, int64_t visible_tokens, int n_threads) {
  const int64_t max_s = std::clamp<int64_t>(visible_tokens / kMinSplitTokens, 1, kMaxKvSplits);
  int best = 1;
  double best_span = 0.0;
  for (int s = 1; s <= max_s; ++s) {
    const int64_t tasks = tiles * s;
    const double span = static_cast<double>((tasks + n_threads - 1) / n_threads) / s;
    if (s == 1 || span < best_span - 1e-9) {
      best = s;
      best_span = span;
    }
  }
  return best;
}

PagedTaskPlan plan_paged_tasks(int64_t tiles, int n_kv_heads, int64_t visible_tokens,
                               int n_threads) {
  // Makespans in units of one (tile, KV head) over the whole context.
  const auto span = [&](int64_t tasks, int s, int heads) {
    return static_cast<double>((tasks * s + n_threads - 1) / n_threads) / s * heads;
  };
  const int s_all = plan_kv_splits(tiles, visible_tokens, n_threads);
  const int s_one = plan_kv_splits(tiles * n_kv_heads, visible_tokens, n_threads);
  if (span(tiles, s_all, n_kv_heads) <= span(tiles * n_kv_heads, s_one, 1) + 1e-9) {
    return PagedTaskPlan{n_kv_heads, s_all};
  }
  return PagedTaskPlan{1, s_one};
}

void attend_paged_tile(const PagedAttnTile& t, float* scratch, const PagedAttnPartial& part) {
  // The active ISA is read per call (tests switch it); the kernel tables are built once.
  static const detail::TileKernels kAvx512 = detail::avx512_kernels(cpu_features().avx512bf16);
  static const detail::TileKernels kAvx2 = detail::avx2_kernels();
  static const detail::TileKernels kGeneric = detail::generic_kernels();
  detail::attend_paged_tile_with(has_avx512() ? kAvx512
                                 : has_avx2() ? kAvx2
                                              : kGeneric,
                                 t, scratch, part);
}

void merge_paged_partials(const PagedAttnPartial* parts, int n_parts, int n_q, int n_kv, int group,
                          int head_dim, float* out, int64_t out_stride) {
  const int d = head_dim, QG = n_q * group;
  for (int r = 0; r < n_kv * QG; ++r) {
    const int h = r / QG, i = r % QG / group, g = r % group;
    float* o = out + i * out_stride + static_cast<int64_t>(h * group + g) * d;
    float M = -INFINITY;
    for (int p = 0; p < n_parts; ++p) M = std::max(M, parts[p].m[r]);
    std::fill(o, o + d, 0.0f);
    if (M == -INFINITY) continue;
    float L = 0.0f;
    for (int p = 0; p < n_parts; ++p) {
      if (parts[p].m[r] == -INFINITY) continue;
      const float w = std::exp(parts[p].m[r] - M);
      L += w * parts[p].l[r];
      const float* a = parts[p].acc + static_cast<int64_t>(r) * d;
      for (int c = 0; c < d; ++c) o[c] += w * a[c];
    }
    const float inv = 1.0f / L;
    for (int c = 0; c < d; ++c) o[c] *= inv;
  }
}

void attend_paged_reference(const PagedBlockView* blocks, int block_size, int64_t n_kv_tokens,
                            int kv_head, int group, int head_dim, float scale, const float* q,
                            float* out, int64_t window) {
  const int d = head_dim;
  const int64_t first = window > 0 ? std::max<int64_t>(0, n_kv_tokens - window) : 0;
  const auto n = static_cast<size_t>(n_kv_tokens);
  std::vector<float> k(n * d), v(n * d);
  for (int64_t t = first; t < n_kv_tokens; ++t) {
    const PagedBlockView& bv = blocks[t / block_size];
    const int j = static_cast<int>(t % block_size);
    kv::kv_traits_scalar(bv.tk->type)
        ->load(bv.gk, bv.k + kv_head * bv.k_tile_bytes, j, 1, k.data() + t * d);
    kv::kv_traits_scalar(bv.tv->type)
        ->load(bv.gv, bv.v + kv_head * bv.v_tile_bytes, j, 1, v.data() + t * d);
  }
  std::vector<double> p(n);
  for (int g = 0; g < group; ++g) {
    const float* qg = q + static_cast<size_t>(g) * d;
    double mx = -INFINITY;
    for (size_t t = 0; t < n; ++t) {
      if (static_cast<int64_t>(t) < first) {  // outside the sliding window
        p[t] = -INFINITY;
        continue;
      }
      double s = 0.0;
      for (int c = 0; c < d; ++c) s += static_cast<double>(qg[c]) * k[t * d + c];
      p[t] = s * scale;
      mx = std::max(mx, p[t]);
    }
    double sum = 0.0;
    for (size_t t = 0; t < n; ++t) {
      p[t] = std::exp(p[t] - mx);
      sum += p[t];
    }
    for (int c = 0; c < d; ++c) {
      double o = 0.0;
      for (size_t t = 0; t < n; ++t) o += p[t] * v[t * d + c];
      out[static_cast<size_t>(g) * d + c] = static_cast<float>(o / sum);
    }
  }
}

}  // namespace bie::attention
