// Run-time CPU feature detection. Kernels compiled with AVX2/FMA/F16C flags are only called when
// has_avx2() is true; BIE_FORCE_SCALAR is not read — tests pick ISA paths explicitly instead.
#pragma once

namespace bie {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
};

// Detected once, cached. Thread-safe.
[[nodiscard]] const CpuFeatures& cpu_features();

// True when the AVX2+FMA+F16C kernels may run on this machine.
[[nodiscard]] inline bool has_avx2() {
  const CpuFeatures& f = cpu_features();
  return f.avx2 && f.fma && f.f16c;
}

}  // namespace bie
