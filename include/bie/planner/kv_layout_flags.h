// The KV flags every command shares (--kv-cache-dtype[-k|-v], --kv-group-size, --paged-block-size,
// --kv-sink-tokens, --kv-window, --kv-rotate) and the one rule that turns them into a KvLayout,
// so `bie run`, `bie bench`, `bie quality` and `bie plan` read them identically.
// Pure function over plain data; thread-safe.
#pragma once

#include <optional>
#include <string>

#include "bie/common/result.h"
#include "bie/planner/kv_bytes.h"

namespace bie::planner {

struct KvLayoutFlags {
  std::string dtype = "f16";  // both K and V, unless dtype_k / dtype_v say otherwise
  std::string dtype_k;        // empty: from dtype
  std::string dtype_v;
  int group_size = 64;  // int4_asym values per group when a name has no _gN
  int block_size = 16;  // tokens per paged block (and per int4/int8_channel key tile)
  int sink_tokens = 8;
  int window_tokens = 128;
  std::optional<bool> rotate;  // --kv-rotate / --no-kv-rotate; unset: on for int4_asym keys
};

// Tokens per paged block, and so per KIVI key tile, of the default 4-bit and int8 recipes. 64-token
// tiles cost less (4.5 bits per value over K and V instead of 5.25) and are what
// docs/kv-quality.md measured, but with 64-token blocks prefix caching changed Gemma 3's greedy
// output (Gemma3Golden.PrefixCachingOnAndOffGiveTheSameOutput: cached KV of generated tokens,
// computed on the decode path, re-encodes a whole 64-token key tile) and several block-count
// expectations were never re-derived; until that is understood the default stays 16 and
// --paged-block-size 64 gives the 4.5-bit form.
inline constexpr int kDefault4BitTile = 16;

// Rules:
//  * --kv-cache-dtype int4_asym (or int4) is BIE's default 4-bit recipe: K int4_channel_t<block>
//    (KIVI keys: fp16 scale and zero per channel over each block) and V int4_asym_g<group>, with
//    blocks of kDefault4BitTile = 16 tokens unless --paged-block-size is given (5.25 bits per
//    value over K and V at g64; with --paged-block-size 64, 4.5, what llama.cpp's q4_0 costs).
//    Per-token key groups collapse on Qwen2.5, whose keys carry bias channels ~80x the others
//    (docs/kv-quality.md "Why the old int4_asym collapsed on Qwen2.5"); per-channel scales do not.
//    The old recipe (rotated g64 keys) is spelled --kv-cache-dtype int4_asym_g64.
//    int4_channel: the same KIVI recipe with the ordinary block size (16 unless given).
//  * --kv-cache-dtype int8: K int8_channel_t<block> (10 bits at t16, 8.5 at t64) and V int8
//  (8.125),
//    blocks of kDefault4BitTile tokens unless given; per-token int8 keys lose 5x to q8_0 on
//    Qwen2.5 for the same reason. --kv-cache-dtype-k int8 gives the per-token format.
//  * The rotation defaults to on whenever K is int4_asym, and for the default 4-bit recipe's keys;
//    --kv-rotate / --no-kv-rotate override.
//  * --kv-cache-dtype-k / -v are taken literally and override --kv-cache-dtype.
//  * Other names: parse_kv_format.
// Errors name the flag and the accepted spellings.
[[nodiscard]] Result<KvLayout> resolve_kv_layout(const KvLayoutFlags& f);

// A short label for a layout, e.g. "f16", "int8", "k=int4_channel_t16 v=int4_asym_g64",
// with " +rotate" appended when rotation is on.
[[nodiscard]] std::string kv_layout_label(const KvLayout& l);

}  // namespace bie::planner
