// Storage facts of every ggml tensor type id a GGUF file can name: block size and bytes per block.
// The GGUF reader needs them to bound-check tensor extents, including types BIE cannot compute with
// (those are reported by name). Which types BIE can run is the quant module's business.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace bie::gguf {

struct GgmlTypeInfo {
  std::string_view name;  // ggml's name, e.g. "q4_K"
  int64_t block_size;     // values per block
  size_t type_size;       // bytes per block
};

// nullopt for ids that are not (or no longer) ggml types.
[[nodiscard]] std::optional<GgmlTypeInfo> ggml_type_info(uint32_t type_id);

}  // namespace bie::gguf
