// The KV flags every command shares (--kv-cache-dtype[-k|-v], --kv-group-size, --paged-block-size,
// --kv-sink-tokens, --kv-window, --kv-rotate) and the one rule that turns them into a KvLayout,
// so `bie run`, `bie bench`, `bie quality` and `bie plan` read them identically.
// Pure function over plain data; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "bie/common/result.h"
#include "bie/planner/kv_bytes.h"

namespace bie::planner {

// One layer's K and V format names in a --kv-layer-map file (parse_kv_format spellings).
struct KvLayerNames {
  std::string k;
  std::string v;
};

struct KvLayoutFlags {
  std::string dtype = "f16";  // both K and V, unless dtype_k / dtype_v say otherwise
  std::string dtype_k;        // empty: from dtype
  std::string dtype_v;
  int group_size = 64;  // int4_asym values per group when a name has no _gN
  // Tokens per paged block (and per int4/int8_channel key tile); 0: kDefaultChannelBlock for the
  // recipes with per-channel keys (int4, int4_asym, int4_channel, int8, int8_channel), else 16.
  int block_size = 0;
  int sink_tokens = 8;
  int window_tokens = 128;
  std::optional<bool> rotate;  // --kv-rotate / --no-kv-rotate; unset: on for int4_asym_gN keys
  // --kv-layer-map FILE's entries (read_kv_layer_map), one per layer; empty: no map. They replace
  // the dtype flags' body formats layer by layer (KvLayout::per_layer).
  std::vector<KvLayerNames> layer_map;
};

// The block (and key tile) of the recipes with per-channel keys: a 64-token tile costs a key
// 4.5 bits at 4-bit codes (the planner's 8B-at-64k headline) and 8.5 at 8-bit (q8_0's bytes).
inline constexpr int kDefaultChannelBlock = 64;

// Rules (docs/kv-quality.md has the measurements behind each):
//  * --kv-cache-dtype int4_asym, int4 or int4_channel (the 4-bit recipe): K int4_channel_t<block>
//    (KIVI keys: fp16 scale and zero per channel over each block) and V int4_asym_g<group>, in
//    blocks of kDefaultChannelBlock = 64 tokens unless --paged-block-size is given: 4.5 + 4.5 bits
//    per value at g64. Per-token 4-bit keys collapse on Qwen2.5, whose keys carry bias channels
//    ~80x the others (docs/kv-quality.md "Why the old int4_asym collapsed on Qwen2.5").
//  * --kv-cache-dtype int8 or int8_channel (the 8-bit recipe): K int8_channel_t<block> and V int8
//    (one fp16 scale per token-head), in blocks of 64 unless given: 8.5 + 8.125 bits per value.
//  * The per-token recipes are spelled with the format's own name: --kv-cache-dtype int4_asym_g64
//    (or _g32, _g128: K and V per-token groups, keys Hadamard-rotated, 16-token blocks), and
//    --kv-cache-dtype-k int8 for per-token int8 keys.
//  * The rotation defaults to on whenever K is int4_asym_gN; --kv-rotate / --no-kv-rotate override.
//  * --kv-cache-dtype-k / -v are taken literally and override --kv-cache-dtype.
//  * --kv-layer-map: each layer's body formats from the map; blocks of kDefaultChannelBlock
//    unless --paged-block-size is given; rotation on when some layer's K is int4_asym_gN.
//  * Other names: parse_kv_format.
// Errors name the flag and the accepted spellings.
[[nodiscard]] Result<KvLayout> resolve_kv_layout(const KvLayoutFlags& f);

// A short label for a layout, e.g. "f16", "int8", "k=int4_channel_t16 v=int4_asym_g64",
// with " +rotate" appended when rotation is on. A mapped layout counts its layers' formats:
// "layer-map k=int4_channel_t64 x26,int8_channel_t64 x2 v=int4_asym_g64 x28".
[[nodiscard]] std::string kv_layout_label(const KvLayout& l);

}  // namespace bie::planner
