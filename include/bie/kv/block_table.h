// BlockTable: one sequence's map from logical block (tokens [i*B, (i+1)*B)) to a physical block,
// and the routing rule that says which pool each logical block belongs in. Plain data owned by
// the BlockManager; pure functions; thread-safe as ordinary values.
#pragma once

#include <cstdint>
#include <vector>

#include "bie/kv/block_pool.h"
#include "bie/planner/kv_bytes.h"

namespace bie::kv {

// Which pool a block lives in. In a mixed layout kFp16 holds the sink and window blocks and kBody
// the body format; in an unmixed layout (f16, q8_0, q4_0) every block is kBody and the kFp16
// pool is empty (planner::kv_block_count counts such blocks as body).
enum class PoolKind : uint8_t { kFp16 = 0, kBody = 1 };
inline constexpr int kPoolKinds = 2;

struct BlockTableEntry {
  PoolKind pool = PoolKind::kBody;
  BlockRef block;  // block.index == kNullBlock: dropped (outside a sliding window)
  friend bool operator==(const BlockTableEntry&, const BlockTableEntry&) = default;
};

using BlockTable = std::vector<BlockTableEntry>;

// Where logical block i of a sequence of n tokens belongs (docs/planner.md §2, the same rule
// planner::kv_block_count counts): kDropped if a sliding-window group (local_window > 0) no longer
// keeps it; else kFp16 in a mixed layout if it holds a sink token (global groups only) or one of
// the last window_tokens tokens; else kBody.
enum class BlockRole : uint8_t { kFp16, kBody, kDropped };

// note: call only if 0 <= i < ceil(n / block_size)
[[nodiscard]] inline BlockRole block_role(const planner::KvLayout& layout, int64_t local_window,
                                          int64_t i, int64_t n) {
  const int64_t B = layout.block_size;
  const int64_t nb = (n + B - 1) / B;
  const int64_t first_kept = local_window > 0 ? (n > local_window ? n - local_window : 0) / B : 0;
  if (i < first_kept) return BlockRole::kDropped;
  if (!layout.mixed()) return BlockRole::kBody;
  const int64_t sink_blocks = local_window > 0 ? 0 : (layout.sink_tokens + B - 1) / B;
  const int64_t win_first =
      layout.window_tokens > 0 ? (n > layout.window_tokens ? n - layout.window_tokens : 0) / B : nb;
  return i >= win_first || i < sink_blocks ? BlockRole::kFp16 : BlockRole::kBody;
}

}  // namespace bie::kv
