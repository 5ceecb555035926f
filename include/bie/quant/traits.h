// One trait table per supported type (ggml's type_traits): sizes, row (de)quantisers and the dot
// kernel with the activation format it expects. Tables are immutable after static init; all
// functions are thread-safe and allocate nothing.
#pragma once

#include <cstddef>
#include <cstdint>

#include "bie/quant/types.h"

namespace bie::quant {

// Dequantise n values (n % block_size == 0) from `src` blocks into floats.
using ToFloatFn = void (*)(const void* src, float* dst, int64_t n);
// Quantise n floats (n % block_size == 0) into blocks at `dst`.
using FromFloatFn = void (*)(const float* src, void* dst, int64_t n);
// Dot of one row `x` (this type) with one row `y` already in vec_dot_type, n values.
using VecDotFn = float (*)(int64_t n, const void* x, const void* y);

struct TypeTraits {
  GgmlType type;
  const char* name;
  int64_t block_size;  // values per block
  size_t type_size;    // bytes per block
  bool is_quantized;
  ToFloatFn to_float;
  FromFloatFn from_float;  // for K-quants a simple reference quantiser, not ggml's optimised one
  VecDotFn vec_dot;        // nullptr for activation-only formats (Q8_1, Q8_K)
  GgmlType vec_dot_type;   // format vec_dot expects its second operand in (ggml's pairing)
};

// Best table for this machine (AVX2 when has_avx2()), nullptr if the type is unsupported.
[[nodiscard]] const TypeTraits* traits(GgmlType type);
// The scalar reference table, available everywhere.
[[nodiscard]] const TypeTraits* traits_scalar(GgmlType type);
// The AVX2+FMA+F16C table; nullptr if unsupported type, not built, or the CPU lacks the ISA.
[[nodiscard]] const TypeTraits* traits_avx2(GgmlType type);

}  // namespace bie::quant
