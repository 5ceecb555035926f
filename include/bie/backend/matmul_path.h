// MatmulPath: which kernel family computes a token's matrix products (see Backend::matmul).
#pragma once

#include <cstdint>

namespace bie {

// Which kernel computes a token decides its rounding, and the kernels differ in summation order.
// So that a token's result never depends on what else is in the batch (a sequence decoded alone
// or among 15 others, a prompt prefilled in one chunk or several), callers name the token class:
//   kDecode:  matrix-vector kernels, in groups of up to 4 tokens (each token's sums identical to
//             running it alone);
//   kPrefill: the tiled kernels for any token count (each token's sums independent of the count);
//   kAuto:    whichever is fastest for n_tokens (benchmarks and kernels tests).
enum class MatmulPath : uint8_t { kAuto, kDecode, kPrefill };

}  // namespace bie
