// GGML tensor type ids and per-type size helpers. Pure data, no state; thread-safe.
// Ids are ggml's (they are what GGUF files store), so a type read from a file can be named even
// when BIE cannot compute with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace bie::quant {

enum class GgmlType : int32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  // 4, 5: Q4_2, Q4_3 (removed from ggml)
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  // 31..33: Q4_0_4_4, Q4_0_4_8, Q4_0_8_8 (removed: repacking is now done at load time)
  TQ1_0 = 34,
  TQ2_0 = 35,
  // 36..38: IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8 (removed)
  MXFP4 = 39,
};

// Number of ids we know a name for (ids >= this are unknown).
inline constexpr int32_t kGgmlTypeIdLimit = 40;

// "q4_K", "f16", ... (ggml's spelling); "unknown" for ids ggml never assigned or removed.
[[nodiscard]] std::string_view type_name(GgmlType type);

// Inverse of type_name, case-insensitive; std::nullopt when no known type has that name.
[[nodiscard]] std::optional<GgmlType> type_from_name(std::string_view name);

// True when the id is a type ggml defines (supported here or not).
[[nodiscard]] bool is_known(GgmlType type);

// True when BIE can dequantise and dot this type (it has a TypeTraits entry).
[[nodiscard]] bool is_supported(GgmlType type);

// Values per block (1 for F32/F16/BF16, 32 for Q4_0.., 256 for K-quants). 0 if unsupported.
[[nodiscard]] int64_t block_size(GgmlType type);

// Bytes per block. 0 if unsupported.
[[nodiscard]] size_t type_size(GgmlType type);

// Bytes of a row of n values. note: call only if is_supported(type) and n % block_size == 0.
[[nodiscard]] size_t row_size(GgmlType type, int64_t n);

}  // namespace bie::quant
