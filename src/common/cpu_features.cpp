#include "bie/common/cpu_features.h"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace bie {

namespace {

#if defined(__x86_64__) || defined(__i386__)
// XCR0 (the register state the OS saves); needs OSXSAVE, checked by the caller. Encoded by hand
// so that this file needs no -mxsave.
uint64_t xgetbv0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}
#endif

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0) return f;
  const bool osxsave = (c >> 27) & 1;
  const bool avx = (c >> 28) & 1;
  f.fma = (c >> 12) & 1;
  f.f16c = (c >> 29) & 1;
  uint64_t xcr0 = 0;
  if (osxsave) xcr0 = xgetbv0();
  f.os_avx = avx && (xcr0 & 0x6) == 0x6;            // XMM, YMM
  f.os_avx512 = f.os_avx && (xcr0 & 0xE0) == 0xE0;  // opmask, ZMM_Hi256, Hi16_ZMM
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) != 0) {
    const unsigned max_sub = a;
    f.avx2 = (b >> 5) & 1;
    f.avx512f = (b >> 16) & 1;
    f.avx512bw = (b >> 30) & 1;
    f.avx512vl = (b >> 31) & 1;
    f.avx512vnni = (c >> 11) & 1;
    if (max_sub >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d) != 0) f.avx512bf16 = (a >> 5) & 1;
  }
#endif
  return f;
}

Isa detect_best(const CpuFeatures& f) {
  if (!f.os_avx || !f.avx2 || !f.fma || !f.f16c) return Isa::kScalar;
  if (f.os_avx512 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni) return Isa::kAvx512;
  return Isa::kAvx2;
}

Isa clamp(Isa want) {
  const Isa best = best_isa();
  return static_cast<int>(want) < static_cast<int>(best) ? want : best;
}

Isa initial_isa() {
  const char* env = std::getenv("BIE_ISA");
  if (env == nullptr || *env == '\0') return best_isa();
  const std::optional<Isa> want = isa_from_name(env);
  if (!want) {
    std::fprintf(stderr, "bie: BIE_ISA='%s' is not one of scalar, avx2, avx512; ignored\n", env);
    return best_isa();
  }
  return clamp(*want);
}

std::atomic<int>& active_slot() {
  static std::atomic<int> slot{static_cast<int>(initial_isa())};
  return slot;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

Isa best_isa() {
  static const Isa best = detect_best(cpu_features());
  return best;
}

Isa active_isa() {
  return static_cast<Isa>(active_slot().load(std::memory_order_relaxed));
}

Isa set_isa(Isa isa) {
  const Isa now = clamp(isa);
  active_slot().store(static_cast<int>(now), std::memory_order_relaxed);
  return now;
}

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "?";
}

std::optional<Isa> isa_from_name(std::string_view name) {
  for (Isa i : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (isa_name(i) == name) return i;
  }
  return std::nullopt;
}

std::string isa_report() {
  const CpuFeatures& f = cpu_features();
  std::string s(isa_name(active_isa()));
  s += " (best ";
  s += isa_name(best_isa());
  s += "; cpu";
  const std::pair<bool, const char*> flags[] = {{f.avx2, "avx2"},
                                                {f.fma, "fma"},
                                                {f.f16c, "f16c"},
                                                {f.avx512f, "avx512f"},
                                                {f.avx512bw, "avx512bw"},
                                                {f.avx512vl, "avx512vl"},
                                                {f.avx512vnni, "avx512vnni"},
                                                {f.avx512bf16, "avx512bf16"}};
  for (const auto& [on, name] : flags) {
    if (on) {
      s += ' ';
      s += name;
    }
  }
  if (f.avx512f && !f.os_avx512) s += "; the OS does not enable the AVX-512 state";
  s += "; BIE_ISA=scalar|avx2|avx512 lowers it)";
  return s;
}

}  // namespace bie
