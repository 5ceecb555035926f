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
  // Tokens per paged block (and per int4/int8_channel key tile); 0: kDefaultInt8Block for int8,
  // else 16.
  int block_size = 0;
  int sink_tokens = 8;
  int window_tokens = 128;
  std::optional<bool> rotate;  // --kv-rotate / --no-kv-rotate; unset: on for int4_asym keys
};

// The block (and key tile) of the default int8 recipe: 8.5-bit keys, q8_0's bytes.
inline constexpr int kDefaultInt8Block = 64;

// Rules:
//  * --kv-cache-dtype int4_asym (or int4): K and V int4_asym_g<group> (per-token groups), keys
//    Hadamard-rotated: 4.5 bits per value at g64, the bytes the planner's 8B-at-64k headline uses.
//    It collapses on Qwen2.5, whose keys carry bias channels ~80x the others (docs/kv-quality.md
//    "Why the old int4_asym collapsed on Qwen2.5"); the outlier-robust recipes are named below and
//    are not the default yet (docs/kv-quality.md "Defaults").
//  * --kv-cache-dtype int4_channel: K int4_channel_t<block> (KIVI keys: fp16 scale and zero per
//    channel over each block) and V int4_asym_g<group>: 5.25 bits per value at the default
//    16-token block, 4.5 with --paged-block-size 64.
//  * --kv-cache-dtype int8 (the default 8-bit recipe): K int8_channel_t<block> (8-bit KIVI keys:
//    fp16 scale and zero per channel over each block) and V int8 (one fp16 scale per token-head),
//    in blocks of kDefaultInt8Block = 64 tokens unless --paged-block-size is given: 8.5 + 8.125
//    bits per value. Per-token int8 keys lose 5x to llama.cpp's q8_0 on Qwen2.5 (one scale spans
//    its bias channels, docs/kv-quality.md); per-channel ones beat it. The per-token recipe is
//    spelled --kv-cache-dtype-k int8 (with --kv-cache-dtype int8) or k=int8:v=int8 in bie quality.
//  * --kv-cache-dtype int8_channel: the same keys and values with the ordinary block size (16
//    unless given; 10-bit keys at 16).
//  * The rotation defaults to on whenever K is int4_asym; --kv-rotate / --no-kv-rotate override.
//  * --kv-cache-dtype-k / -v are taken literally and override --kv-cache-dtype.
//  * Other names: parse_kv_format.
// Errors name the flag and the accepted spellings.
[[nodiscard]] Result<KvLayout> resolve_kv_layout(const KvLayoutFlags& f);

// A short label for a layout, e.g. "f16", "int8", "k=int4_channel_t16 v=int4_asym_g64",
// with " +rotate" appended when rotation is on.
[[nodiscard]] std::string kv_layout_label(const KvLayout& l);

}  // namespace bie::planner
