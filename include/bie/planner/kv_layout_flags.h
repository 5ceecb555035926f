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

// Rules:
//  * --kv-cache-dtype int4_asym (or int4): K and V int4_asym_g<group> (per-token groups), keys
//    Hadamard-rotated: 4.5 bits per value at g64, the bytes the planner's 8B-at-64k headline uses.
//    It collapses on Qwen2.5, whose keys carry bias channels ~80x the others (docs/kv-quality.md
//    "Why the old int4_asym collapsed on Qwen2.5"); the outlier-robust recipes are named below and
//    are not the default yet (docs/kv-quality.md "Defaults").
//  * --kv-cache-dtype int4_channel: K int4_channel_t<block> (KIVI keys: fp16 scale and zero per
//    channel over each block) and V int4_asym_g<group>: 5.25 bits per value at the default
//    16-token block, 4.5 with --paged-block-size 64.
//  * --kv-cache-dtype int8_channel: K int8_channel_t<block> (10 bits at 16, 8.5 at 64) and V int8
//    (8.125). --kv-cache-dtype int8: per-token int8 K and V.
//  * The rotation defaults to on whenever K is int4_asym; --kv-rotate / --no-kv-rotate override.
//  * --kv-cache-dtype-k / -v are taken literally and override --kv-cache-dtype.
//  * Other names: parse_kv_format.
// Errors name the flag and the accepted spellings.
[[nodiscard]] Result<KvLayout> resolve_kv_layout(const KvLayoutFlags& f);

// A short label for a layout, e.g. "f16", "int8", "k=int4_channel_t16 v=int4_asym_g64",
// with " +rotate" appended when rotation is on.
[[nodiscard]] std::string kv_layout_label(const KvLayout& l);

}  // namespace bie::planner
