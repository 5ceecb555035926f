// The compute shaders of src/backend/vulkan/shaders/, compiled to SPIR-V by glslc at build time and
// embedded as word arrays (cmake/embed_spirv.cmake generates the table). Immutable data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace bie::vk {

struct SpirvModule {
  const char* name;  // "matvec_q4_k", "rms_norm", ... (cmake/BieVulkan.cmake's variant names)
  const uint32_t* words;
  size_t n_words;
};

[[nodiscard]] std::span<const SpirvModule> spirv_modules();

}  // namespace bie::vk
