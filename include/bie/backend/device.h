// Which device runs the model: `--device auto|cpu|vulkan[:N]`, the Vulkan devices this machine
// exposes (`bie info --devices`), and the rule that picks one. Built with or without the Vulkan
// backend (without it, listing returns an error naming the build). Thread-safe; no global state
// beyond the process-wide Vulkan loader handle.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "bie/common/result.h"

namespace bie {

struct DeviceSpec {
  enum class Kind : uint8_t { kAuto, kCpu, kVulkan };
  Kind kind = Kind::kAuto;
  int index = -1;  // vulkan:N; -1 = best Vulkan device
};

// "auto", "cpu", "vulkan", "vulkan:N" (case-insensitive); anything else is an error naming them.
[[nodiscard]] Result<DeviceSpec> parse_device_spec(std::string_view text);

struct GpuMemoryHeap {
  uint64_t size = 0;
  bool device_local = false;
  // VK_EXT_memory_budget (has_budget): what this process may still use and what it uses now.
  bool has_budget = false;
  uint64_t budget = 0;
  uint64_t usage = 0;
};

struct GpuDeviceInfo {
  int index = 0;            // N of vulkan:N (order of vkEnumeratePhysicalDevices)
  std::string name;         // "NVIDIA GeForce RTX 4060", "llvmpipe (LLVM 15.0.6, 256 bits)"
  std::string type;         // "discrete", "integrated", "virtual", "cpu", "other"
  bool is_cpu = false;      // a CPU implementation (lavapipe, SwiftShader): never picked by auto
  std::string driver;       // driver name and info, "llvmpipe (Mesa 22.3.6 (LLVM 15.0.6))"
  std::string api_version;  // "1.3.230"
  uint32_t vendor_id = 0;
  uint32_t device_id = 0;
  std::vector<GpuMemoryHeap> heaps;
  uint32_t subgroup_size = 0;
  bool subgroup_arithmetic = false;           // subgroupAdd & co. in compute shaders (needed)
  bool fp16_arithmetic = false;               // shaderFloat16
  bool int8_arithmetic = false;               // shaderInt8
  bool storage_16bit = false;                 // storageBuffer16BitAccess
  bool storage_8bit = false;                  // storageBuffer8BitAccess
  bool cooperative_matrix = false;            // VK_KHR_cooperative_matrix
  bool cooperative_matrix_nv = false;         // VK_NV_cooperative_matrix
  bool memory_budget = false;                 // VK_EXT_memory_budget
  uint64_t max_storage_buffer_range = 0;      // bytes one shader binding may span
  uint64_t min_storage_buffer_alignment = 0;  // a binding's offset is a multiple of this
  uint32_t max_compute_shared_memory = 0;
  uint32_t max_storage_buffers_per_stage = 0;  // storage-buffer bindings one compute shader may use
  // Bytes one buffer may hold: maxMemoryAllocationSize and maxBufferSize (0: not reported).
  uint64_t max_buffer_bytes = 0;

  // Bytes of the device-local heaps (budget when the extension reports one, else size).
  [[nodiscard]] uint64_t device_local_bytes() const;
  // The same apart: the heaps' sizes, and what VK_EXT_memory_budget says this process may use
  // (0 when the extension is missing).
  [[nodiscard]] uint64_t device_local_total() const;
  [[nodiscard]] uint64_t device_local_available() const;
  // Bytes one shader binding may span as BIE binds buffers: maxStorageBufferRange, at most 2^31
  // (shader offsets in 32-bit words and bytes never overflow), a multiple of 16.
  [[nodiscard]] uint64_t max_binding_bytes() const;
};

// The Vulkan devices of this machine, or why there are none: no loader, no driver (ICD), or a
// build without the Vulkan backend. Every error is one line a user can act on.
[[nodiscard]] Result<std::vector<GpuDeviceInfo>> list_vulkan_devices();

// The device a spec names, given the devices found (or the error finding them).
struct ResolvedDevice {
  bool cpu = true;
  int vulkan_index = -1;
  std::string description;  // "cpu", "vulkan:0 (llvmpipe ...)"
};
// auto: the first non-CPU Vulkan device (discrete before integrated before virtual), else the CPU;
// cpu: the CPU; vulkan: the best Vulkan device including CPU-type ones; vulkan:N: that one. A
// spelled device that is missing is an error naming what exists.
[[nodiscard]] Result<ResolvedDevice> resolve_device(
    const DeviceSpec& spec, const Result<std::vector<GpuDeviceInfo>>& devices);

// The backend name (create_backend's: "cpu", "vulkan:N") a device spec's text names on this
// machine: auto resolves to a real GPU or the CPU, a missing device is an error naming what
// exists (errors start "--device"). Devices are listed only when the spec is not "cpu".
[[nodiscard]] Result<std::string> backend_for_device(std::string_view text);

// One human-readable block per device (`bie info --devices`).
[[nodiscard]] std::string describe_devices(const std::vector<GpuDeviceInfo>& devices);

}  // namespace bie
