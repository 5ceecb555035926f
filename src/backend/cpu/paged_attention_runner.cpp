#include "backend/cpu/paged_attention_runner.h"

#include <algorithm>
#include <cassert>

#include "backend/cpu/paged_attention.h"
#include "bie/backend/kv_format_rotate.h"
#include "bie/backend/thread_pool.h"

namespace bie::attention {

void PagedAttentionRunner::run_blocks(const kv::HostKvBlocks& blocks, int n_head_kv, int head_dim,
                                      int64_t pos0, int64_t n, const float* q, int n_head,
                                      float scale, float* out, ThreadPool& pool, int64_t window) {
  const int B = blocks.block_size;
  const int d = head_dim;
  const int H = n_head_kv;
  const int group = n_head / H;
  const int64_t n_ctx = pos0 + n;
  const int64_t q_stride = static_cast<int64_t>(n_head) * d;
  assert(n >= 1 && n_head % H == 0);
  assert(static_cast<int64_t>(blocks.blocks.size()) * B >= n_ctx);
  if (blocks.rotate_keys) {
    // Scores against rotated keys need rotated queries: (Hq).(Hk) = q.k.
    q_rot_.assign(q, q + n * q_stride);
    for (int64_t r = 0; r < n * n_head; ++r) kv::hadamard_rotate(q_rot_.data() + r * d, d);
    q = q_rot_.data();
  }
  // Tasks: (query tile x KV heads x context part). A tile of up to kMaxTileQ queries reads each
  // block once for all its rows. Parts lie on a fixed grid of absolute block indices
  // (kSplitGridTokens), so a query's partial sums and their merge order depend only on
  // its own position: the same bits whether it runs alone (decode), in a prefill chunk of any
  // size, or with speculative drafts. Parts also let one decode token fill every thread.
  const int tile_q = static_cast<int>(std::min<int64_t>({kMaxTileQ, n, std::max(1, 128 / group)}));
  const int64_t n_tiles = (n + tile_q - 1) / tile_q;
  const int64_t grid = std::max<int64_t>(1, kSplitGridTokens / B);  // blocks per part
  const int64_t nb_all = (n_ctx + B - 1) / B;
  const int splits = static_cast<int>((nb_all + grid - 1) / grid);
  const int hpt = tile_q * H * group > 256
                      ? 1
                      : plan_paged_tasks(n_tiles * splits, H, 0, pool.size()).heads_per_task;
  const int head_tasks = H / hpt;
  const int rows = tile_q * hpt * group;
  const size_t part_floats = paged_partial_floats(rows, d);
  const size_t per_thread = paged_attn_scratch_floats(rows, d, B);
  scratch_.resize(static_cast<size_t>(pool.size()) * per_thread);
  // One (tile, KV heads, part) task into `part`.
  const auto run_task = [&](int64_t tile, int ht, int sp, float* sc, const PagedAttnPartial& part) {
    PagedAttnTile a;
    a.blocks = blocks.blocks.data();
    a.block_size = B;
    a.q_pos0 = pos0 + tile * tile_q;
    a.n_q = static_cast<int>(std::min<int64_t>(tile_q, n - tile * tile_q));
    const int64_t nb = (a.q_pos0 + a.n_q + B - 1) / B;  // blocks the tile can see
    // With a window, blocks before the first query's window hold no key any query here sees.
    const int64_t nb_skip = window > 0 ? std::max<int64_t>(0, a.q_pos0 - window + 1) / B : 0;
    a.block_begin = std::min<int64_t>(nb, std::max<int64_t>(nb_skip, sp * grid));
    a.block_end = std::min<int64_t>(nb, (sp + 1) * grid);  // empty part: m = -inf, skipped
    a.kv_head = ht * hpt;
    a.n_kv = hpt;
    a.group = group;
    a.head_dim = d;
    a.scale = scale;
    a.window = window;
    a.q = q + (a.q_pos0 - pos0) * q_stride + static_cast<int64_t>(a.kv_head) * group * d;
    a.q_stride = q_stride;
    attend_paged_tile(a, sc, part);
  };
  // Merges one (tile, KV heads)'s parts, in part order, into out.
  const auto merge = [&](int64_t th, const PagedAttnPartial* parts) {
    const int64_t tile = th / head_tasks;
    const int ht = static_cast<int>(th % head_tasks);
    const int n_q = static_cast<int>(std::min<int64_t>(tile_q, n - tile * tile_q));
    merge_paged_partials(
        parts, splits, n_q, hpt, group, d,
        out + tile * tile_q * q_stride + static_cast<int64_t>(ht * hpt) * group * d, q_stride);
  };
  const int64_t tile_tasks = n_tiles * head_tasks;
  if (splits > 1 && tile_tasks >= 2 * static_cast<int64_t>(pool.size())) {
    // Prefill: enough (tile, KV heads) tasks to fill every thread, so each runs its parts in turn
    // into its thread's buffer and merges them. Same parts, same merge, same bits as below, but
    // the partials take threads x splits instead of tiles x heads x splits (which grows with
    // chunk x context: 270 MB for a 512-token chunk at 32k with Gemma 3's head_dim 256).
    partials_.resize(static_cast<size_t>(pool.size()) * static_cast<size_t>(splits) * part_floats);
    pool.parallel_for(tile_tasks, [&](int64_t begin, int64_t end, int ith) {
      float* sc = scratch_.data() + static_cast<size_t>(ith) * per_thread;
      float* mine = partials_.data() + static_cast<size_t>(ith) * splits * part_floats;
      std::vector<PagedAttnPartial> parts(static_cast<size_t>(splits));
      for (int64_t th = begin; th < end; ++th) {
        for (int sp = 0; sp < splits; ++sp) {
          parts[static_cast<size_t>(sp)] =
              partial_at(mine + static_cast<size_t>(sp) * part_floats, rows, d);
          run_task(th / head_tasks, static_cast<int>(th % head_tasks), sp, sc,
                   parts[static_cast<size_t>(sp)]);
        }
        merge(th, parts.data());
      }
    });
    return;
  }
  // Decode and short passes: every part is a task of its own (a decode token's context is split
  // over the threads), then a merge per (tile, KV heads).
  const int64_t n_tasks = tile_tasks * splits;
  partials_.resize(static_cast<size_t>(n_tasks) * part_floats);
  const auto partial = [&](int64_t task) {
    return partial_at(partials_.data() + static_cast<size_t>(task) * part_floats, rows, d);
  };
  pool.parallel_for(n_tasks, [&](int64_t begin, int64_t end, int ith) {
    float* sc = scratch_.data() + static_cast<size_t>(ith) * per_thread;
    for (int64_t task = begin; task < end; ++task) {
      run_task(task / splits / head_tasks, static_cast<int>(task / splits % head_tasks),
               static_cast<int>(task % splits), sc, partial(task));
    }
  });
  pool.parallel_for(tile_tasks, [&](int64_t begin, int64_t end, int) {
    std::vector<PagedAttnPartial> parts(static_cast<size_t>(splits));
    for (int64_t th = begin; th < end; ++th) {
      for (int sp = 0; sp < splits; ++sp) {
        parts[static_cast<size_t>(sp)] = partial(th * splits + sp);
      }
      merge(th, parts.data());
    }
  });
}

}  // namespace bie::attention
