// --kv-rotate: the normalised fast Walsh–Hadamard transform H/sqrt(n) applied in place to each K
// row before it is quantised and to each query head before the dot. H/sqrt(n) is orthogonal and
// symmetric, so (Hq).(Hk) = q.k: scores are unchanged while an outlier channel of K is spread
// over all channels, which shrinks the range per-token int4 groups must cover. V is not rotated.
// Stateless and thread-safe.
#pragma once

namespace bie::kv {

// x[n] <- H_n x / sqrt(n) (Sylvester ordering). Applying it twice gives x back.
// note: call only if n is a power of two, 1 <= n <= 4096
void hadamard_rotate_scalar(float* x, int n);
// AVX2 twin of hadamard_rotate_scalar (same butterflies in the same order for n >= 8).
// note: call only if has_avx2()
void hadamard_rotate_avx2(float* x, int n);
// Best implementation for this machine.
void hadamard_rotate(float* x, int n);

}  // namespace bie::kv
