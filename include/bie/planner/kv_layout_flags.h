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
  int block_size = 16;
  int sink_tokens = 8;
  int window_tokens = 128;
  std::optional<bool> rotate;  // --kv-rotate / --no-kv-rotate; unset: on for int4_asym keys
};

// Rules:
//  * --kv-cache-dtype int4_asym (or int4) is BIE's default 4-bit recipe: K and V int4_asym_g<group>
//    with the Hadamard rotation of K and Q on. It costs exactly what llama.cpp's q4_0 costs at
//    d = 64/128 (Llama-3-8B: 36 KiB per token); on SmolLM2 the rotation halves plain g64's mean
//    KLD against f16 (0.069 -> 0.036, docs/kv-quality.md). int4_channel selects the KIVI-style
//    recipe: K int4_channel_t<block> (per-channel scales over a block; the best measured 4-bit
//    quality, KLD 0.012, at 17 % more bytes than q4_0) and V int4_asym_g<group>.
//  * The rotation defaults to on whenever K is int4_asym; --kv-rotate / --no-kv-rotate override.
//  * --kv-cache-dtype-k / -v are taken literally and override --kv-cache-dtype.
//  * Other names: parse_kv_format.
// Errors name the flag and the accepted spellings.
[[nodiscard]] Result<KvLayout> resolve_kv_layout(const KvLayoutFlags& f);

// A short label for a layout, e.g. "f16", "int8", "k=int4_channel_t16 v=int4_asym_g64",
// with " +rotate" appended when rotation is on.
[[nodiscard]] std::string kv_layout_label(const KvLayout& l);

}  // namespace bie::planner
