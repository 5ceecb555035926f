// Accelerator profiles: memory, default usable fraction, peak bandwidth and where each number comes
// from; plus the `cpu` profile, whose bandwidth is measured at run time. The table is constant
// data; measure_memory_bandwidth_gbs() spawns worker threads and takes ~0.2 s.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "bie/common/result.h"

namespace bie::planner {

// kVulkan: a Vulkan device of this machine (`bie plan --device vulkan[:N]`), planned as the
// engine allocates on it: the GGUF data section as the weights, the exact device workspace, KV
// pools no larger than one shader binding.
enum class DeviceKind { kNvidia, kApple, kCpu, kCustom, kVulkan };

struct DeviceProfile {
  std::string name;         // "rtx-4060ti-8gb"
  std::string description;  // "NVIDIA GeForce RTX 4060 Ti 8 GB"
  DeviceKind kind = DeviceKind::kCustom;
  double memory_gib = 0;       // device memory; vendors' "GB" for GPU memory are GiB (2^30 B)
  double bandwidth_gbs = 0;    // peak memory bandwidth, 10^9 B/s
  double usable_fraction = 1;  // default share of memory a runtime can take
  double tuned_fraction = 1;   // share after tuning (Apple: iogpu.wired_limit_mb)
  double workspace_gib = 0;    // runtime workspace (CUDA context, cuBLAS, graphs)
  std::string source;
  // kVulkan: what VK_EXT_memory_budget says this process may use (0: not reported), and the
  // bytes one KV pool may span (one shader binding).
  uint64_t available_bytes = 0;
  uint64_t max_pool_bytes = 0;
};

[[nodiscard]] std::span<const DeviceProfile> device_profiles();

// A profile by name (case-insensitive). "cpu" returns the host with its memory from
// /proc/meminfo and, if measure_cpu, its bandwidth measured now (otherwise 0).
[[nodiscard]] Result<DeviceProfile> find_device(std::string_view name, bool measure_cpu = true);

// The host as a device: total memory from /proc/meminfo, bandwidth measured when `measure`.
[[nodiscard]] Result<DeviceProfile> cpu_device_profile(bool measure);

// STREAM-style copy bandwidth in 10^9 B/s (bytes read + bytes written per second), using all
// hardware threads on buffers far larger than the caches, for about `seconds`.
[[nodiscard]] double measure_memory_bandwidth_gbs(double seconds = 0.2);

}  // namespace bie::planner
