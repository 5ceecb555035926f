// KV storage formats and their exact byte cost per (token, KV head). This is the one table that
// both the planner and the KV cache's pools derive sizes from; docs/planner.md spells out each
// layout. Pure functions over plain data; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "bie/common/result.h"

namespace bie::planner {

enum class KvType : uint8_t {
  kF16,          // 2 B per value
  kFp8E4M3,      // 1 B per value + fp16 scale per (token, head)
  kInt8,         // symmetric, 1 B per value + fp16 scale per (token, head)
  kInt4Asym,     // 4-bit per value + fp16 (scale, zero) per `group` values along head_dim
  kInt4Channel,  // KIVI-style keys: 4-bit per value + fp16 (scale, zero) per channel per `group`
                 // tokens
  kQ8_0,         // llama.cpp block_q8_0: 32 values in 34 B (comparison only)
  kQ4_0,         // llama.cpp block_q4_0: 32 values in 18 B (comparison only)
  kInt8Channel,  // KIVI-style 8-bit keys: 1 B per value + fp16 (scale, zero) per channel per
                 // `group` tokens
};

struct KvFormat {
  KvType type = KvType::kF16;
  // kInt4Asym: values per (scale, zero) group along head_dim (32, 64 or 128).
  // kInt4Channel, kInt8Channel: tokens per per-channel (scale, zero) group; equals the paged
  // block size.
  // Other types: 0.
  int group = 0;

  friend bool operator==(const KvFormat&, const KvFormat&) = default;
};

inline constexpr KvFormat kKvF16{KvType::kF16, 0};

// What KvFormat::group counts for a type.
enum class KvGroupKind : uint8_t {
  kNone,       // no group: metadata, if any, is per (token, head)
  kAlongHead,  // `group` consecutive values of one head-token share fp16 metadata
  kTokens,     // per channel, `group` consecutive tokens share fp16 metadata (KIVI)
};

// One row per KvType: every fact about a format that is not a kernel. The planner's byte counts,
// the KV pools' sizes, parsing, naming and the sink/window routing all read this table.
// Bytes per (token, head) of d values:
//   d * value_bits / 8 + head_meta_bytes
//   + (d / group) * group_meta_bytes            (kAlongHead)
//   + d * group_meta_bytes / group              (kTokens: each channel's metadata over the tile)
struct KvFormatSpec {
  KvType type;
  std::string_view name;  // the base spelling; group types add _g<N> (kAlongHead) / _t<N>
  int value_bits;         // code bits per value
  int head_meta_bytes;    // fp16 metadata per (token, head): a scale
  KvGroupKind group_kind;
  int fixed_group;        // the group a type always has (q8_0 / q4_0: 32); 0: KvFormat::group
  int group_meta_bytes;   // fp16 metadata per group: (scale, zero) = 4, a scale = 2
  bool fp16_sink_window;  // BIE's own quantised formats: sinks and window stay FP16
};

// The row of `type` (every KvType has one).
[[nodiscard]] const KvFormatSpec& kv_format_spec(KvType type);

// Per-channel (KIVI) key formats: metadata spans a tile of `group` tokens = one paged block, so
// a body block is written whole and a chunk that is not a prompt's last ends on a block boundary.
[[nodiscard]] inline bool is_per_channel(KvType t) {
  return kv_format_spec(t).group_kind == KvGroupKind::kTokens;
}
[[nodiscard]] inline bool is_per_channel(KvFormat f) {
  return is_per_channel(f.type);
}

// Whether f.group is one its type accepts: kAlongHead 32, 64 or 128 (or the type's fixed group),
// kTokens 1..4096, kNone anything (ignored). parse_kv_format only returns formats that pass.
[[nodiscard]] bool kv_group_valid(KvFormat f);

// Canonical spelling, e.g. "f16", "int4_asym_g64", "int4_channel_t16", "q8_0".
[[nodiscard]] std::string kv_format_name(KvFormat f);

// Parses a user-facing name: f16 | fp16 | fp8 | fp8_e4m3 | int8 | int4_asym[_gN] |
// int4_channel[_tN] | int8_channel[_tN] | q8_0 | q4_0. `int4_group` is used for a bare
// "int4_asym", `block_size` for a bare "int4_channel" / "int8_channel".
[[nodiscard]] Result<KvFormat> parse_kv_format(std::string_view name, int int4_group = 64,
                                               int block_size = 16);

// Whether `f` can store heads of `head_dim` values (group divides head_dim, q8_0/q4_0 need a
// multiple of 32, ...). head_dim 0 (no V, as in MLA) is always fine.
[[nodiscard]] Status check_kv_format(KvFormat f, int head_dim);

// Exact bytes one (token, KV head) of `head_dim` values occupies, metadata included.
// int4_asym g64, head_dim 128: 64 B data + 2 groups x (fp16 scale + fp16 zero) = 72 B.
// note: call only if check_kv_format(f, head_dim).ok()
[[nodiscard]] uint64_t bytes_per_head_token(KvFormat f, int head_dim);

// True for BIE's own quantised formats, whose sequences keep sink and window tokens in FP16.
// f16 has nothing to route; q8_0/q4_0 model llama.cpp, which quantises every token.
[[nodiscard]] bool uses_fp16_sink_window(KvFormat f);

}  // namespace bie::planner
