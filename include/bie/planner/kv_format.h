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

// Per-channel (KIVI) key formats: metadata spans a tile of `group` tokens = one paged block, so
// a body block is written whole and a chunk that is not a prompt's last ends on a block boundary.
[[nodiscard]] inline bool is_per_channel(KvFormat f) {
  return f.type == KvType::kInt4Channel || f.type == KvType::kInt8Channel;
}

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
