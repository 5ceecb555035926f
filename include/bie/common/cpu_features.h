// Run-time CPU feature detection and the choice of kernel ISA. Kernels compiled with ISA flags
// (*_avx2.cpp: AVX2+FMA+F16C; *_avx512.cpp: AVX-512 F/BW/VL/VNNI) run only when the active ISA
// allows them: has_avx2() / has_avx512().
//
// The active ISA is the best the CPU and the OS support (the OS must save the wider register
// state: XGETBV), lowered by the environment variable BIE_ISA=scalar|avx2|avx512 (read once, at
// the first query; an unknown value is reported on stderr and ignored) or by set_isa() (tests run
// every path the machine has). A higher ISA than the machine supports is never chosen. Every
// kernel family follows the same choice, so one process runs one ISA throughout.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace bie {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool os_avx = false;  // XCR0 has the SSE and AVX state
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;
  bool os_avx512 = false;  // XCR0 has the opmask and ZMM state
};

// Ordered: a higher value runs everything a lower one does.
enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// Detected once, cached. Thread-safe.
[[nodiscard]] const CpuFeatures& cpu_features();

// The best ISA this CPU and OS support.
[[nodiscard]] Isa best_isa();

// The ISA the kernels use now (see above). Thread-safe.
[[nodiscard]] Isa active_isa();

// Makes `isa` the active ISA, lowered to best_isa() if the machine lacks it; returns the ISA now
// active. For tests and tools: call it while no kernel runs on another thread.
Isa set_isa(Isa isa);

[[nodiscard]] std::string_view isa_name(Isa isa);
[[nodiscard]] std::optional<Isa> isa_from_name(std::string_view name);

// "avx512 (best avx512; cpu avx2 fma f16c avx512f ...)" for bie info.
[[nodiscard]] std::string isa_report();

// True when the AVX2+FMA+F16C kernels may run.
[[nodiscard]] inline bool has_avx2() {
  return active_isa() >= Isa::kAvx2;
}

// True when the AVX-512 F/BW/VL/VNNI kernels may run.
[[nodiscard]] inline bool has_avx512() {
  return active_isa() >= Isa::kAvx512;
}

}  // namespace bie
