# Vulkan backend: on by default when the Vulkan headers and glslc are found. The binary never
# links libvulkan: src/backend/vulkan/vk_loader.cpp opens libvulkan.so.1 with dlopen at run time,
# so a machine without a Vulkan loader still runs the CPU backend.
find_path(BIE_VULKAN_INCLUDE_DIR vulkan/vulkan_core.h)
find_program(BIE_GLSLC glslc)
set(_bie_vulkan_default OFF)
if(BIE_VULKAN_INCLUDE_DIR AND BIE_GLSLC)
  set(_bie_vulkan_default ON)
endif()
option(BIE_VULKAN "Build the Vulkan GPU backend (needs libvulkan-dev headers and glslc)" ${_bie_vulkan_default})

set(BIE_VULKAN_SOURCES "")
if(BIE_VULKAN)
  if(NOT BIE_VULKAN_INCLUDE_DIR OR NOT BIE_GLSLC)
    message(FATAL_ERROR "BIE_VULKAN=ON needs the Vulkan headers (libvulkan-dev) and glslc")
  endif()
  set(_shader_dir ${CMAKE_SOURCE_DIR}/src/backend/vulkan/shaders)
  set(_spv_dir ${CMAKE_BINARY_DIR}/shaders)
  file(MAKE_DIRECTORY ${_spv_dir})
  file(GLOB _shader_includes CONFIGURE_DEPENDS ${_shader_dir}/*.glsl)
  # Each variant: NAME SOURCE [DEFINES...] ('|'-separated in one string).
  set(_variants
      "add|add.comp" "silu_mul|glu.comp|OP_SILU" "gelu_mul|glu.comp|OP_GELU" "softcap|softcap.comp"
      "rms_norm|rms_norm.comp" "rope|rope.comp" "scale|scale.comp"
      "kv_write_f16|kv_write.comp"
      "attn_paged_kv|attn_paged_kv.comp" "attn_split_merge|attn_split_merge.comp" "kv_write_q|kv_write_q.comp" "kv_quantise|kv_quantise.comp"
      "kv_chan|kv_chan.comp" "kv_rotate|kv_rotate.comp")
  foreach(t F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K)
    string(TOLOWER ${t} tl)
    list(APPEND _variants "matvec_${tl}|matvec.comp|WTYPE_${t}" "matmul_${tl}|matmul.comp|WTYPE_${t}"
         "get_rows_${tl}|get_rows.comp|WTYPE_${t}")
  endforeach()
  set(_names "")
  set(_files "")
  foreach(v ${_variants})
    string(REPLACE "|" ";" parts "${v}")
    list(POP_FRONT parts name src)
    set(defs "")
    foreach(d ${parts})
      list(APPEND defs "-D${d}=1")
    endforeach()
    set(spv ${_spv_dir}/${name}.spv)
    add_custom_command(OUTPUT ${spv}
      COMMAND ${BIE_GLSLC} --target-env=vulkan1.2 -O -I${_shader_dir} ${defs} -o ${spv} ${_shader_dir}/${src}
      DEPENDS ${_shader_dir}/${src} ${_shader_includes}
      COMMENT "glslc ${name}" VERBATIM)
    list(APPEND _names ${name})
    list(APPEND _files ${spv})
  endforeach()
  string(REPLACE ";" "|" _names_arg "${_names}")
  string(REPLACE ";" "|" _files_arg "${_files}")
  set(_gen ${CMAKE_BINARY_DIR}/generated/spirv_modules.cpp)
  add_custom_command(OUTPUT ${_gen}
    COMMAND ${CMAKE_COMMAND} -DOUT=${_gen} "-DNAMES=${_names_arg}" "-DFILES=${_files_arg}"
            -P ${CMAKE_SOURCE_DIR}/cmake/embed_spirv.cmake
    DEPENDS ${_files} ${CMAKE_SOURCE_DIR}/cmake/embed_spirv.cmake
    COMMENT "embedding SPIR-V" VERBATIM)
  set(BIE_VULKAN_SOURCES ${_gen})
endif()
