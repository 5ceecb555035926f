#include "bie/backend/device.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>

#if BIE_HAVE_VULKAN
#include "backend/vulkan/vk_context.h"
#endif

namespace bie {

Result<DeviceSpec> parse_device_spec(std::string_view text) {
  std::string t(text);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  DeviceSpec s;
  if (t == "auto") return s;
  if (t == "cpu") {
    s.kind = DeviceSpec::Kind::kCpu;
    return s;
  }
  if (t == "vulkan" || t == "vk") {
    s.kind = DeviceSpec::Kind::kVulkan;
    return s;
  }
  for (std::string_view prefix : {"vulkan:", "vk:"}) {
    if (t.rfind(prefix, 0) != 0) continue;
    const std::string_view num = std::string_view(t).substr(prefix.size());
    int n = -1;
    auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), n);
    if (ec == std::errc() && p == num.data() + num.size() && !num.empty() && n >= 0) {
      s.kind = DeviceSpec::Kind::kVulkan;
      s.index = n;
      return s;
    }
  }
  return Error{fmt::format("unknown device '{}'; use auto, cpu, vulkan or vulkan:N", text)};
}

uint64_t GpuDeviceInfo::device_local_bytes() const {
  uint64_t total = 0;
  for (const GpuMemoryHeap& h : heaps) {
    if (h.device_local) total += h.has_budget ? h.budget : h.size;
  }
  return total;
}

uint64_t GpuDeviceInfo::device_local_total() const {
  uint64_t total = 0;
  for (const GpuMemoryHeap& h : heaps) {
    if (h.device_local) total += h.size;
  }
  return total;
}

uint64_t GpuDeviceInfo::device_local_available() const {
  uint64_t total = 0;
  for (const GpuMemoryHeap& h : heaps) {
    if (h.device_local && h.has_budget) total += h.budget;
  }
  return total;
}

uint64_t GpuDeviceInfo::max_binding_bytes() const {
  return std::min<uint64_t>(max_storage_buffer_range, uint64_t{1} << 31) / 16 * 16;
}

Result<std::vector<GpuDeviceInfo>> list_vulkan_devices() {
#if BIE_HAVE_VULKAN
  return vk::enumerate_devices();
#else
  return Error{"this bie was built without the Vulkan backend (configure with -DBIE_VULKAN=ON)"};
#endif
}

namespace {

int type_rank(const GpuDeviceInfo& d) {
  if (d.type == "discrete") return 0;
  if (d.type == "integrated") return 1;
  if (d.type == "virtual") return 2;
  if (d.is_cpu) return 4;
  return 3;
}

std::string describe_one(const GpuDeviceInfo& d) {
  return fmt::format("vulkan:{} ({}, {})", d.index, d.name, d.type);
}

}  // namespace

Result<ResolvedDevice> resolve_device(const DeviceSpec& spec,
                                      const Result<std::vector<GpuDeviceInfo>>& devices) {
  ResolvedDevice cpu{true, -1, "cpu"};
  if (spec.kind == DeviceSpec::Kind::kCpu) return cpu;
  if (!devices.ok()) {
    if (spec.kind == DeviceSpec::Kind::kAuto) return cpu;
    return Error{"--device vulkan: " + devices.error()};
  }
  const std::vector<GpuDeviceInfo>& list = devices.value();
  if (spec.kind == DeviceSpec::Kind::kVulkan && spec.index >= 0) {
    for (const GpuDeviceInfo& d : list) {
      if (d.index == spec.index) return ResolvedDevice{false, d.index, describe_one(d)};
    }
    return Error{fmt::format("--device vulkan:{}: this machine has {} Vulkan device(s){}",
                             spec.index, list.size(),
                             list.empty() ? "" : " (see `bie info --devices`)")};
  }
  const GpuDeviceInfo* best = nullptr;
  for (const GpuDeviceInfo& d : list) {
    if (spec.kind == DeviceSpec::Kind::kAuto && d.is_cpu) continue;  // lavapipe only by name
    if (best == nullptr || type_rank(d) < type_rank(*best)) best = &d;
  }
  if (best != nullptr) return ResolvedDevice{false, best->index, describe_one(*best)};
  if (spec.kind == DeviceSpec::Kind::kAuto) return cpu;
  return Error{"--device vulkan: no Vulkan device found (is a Vulkan driver installed?)"};
}

std::string describe_devices(const std::vector<GpuDeviceInfo>& devices) {
  std::string out;
  auto yes = [](bool b) { return b ? "yes" : "no"; };
  for (const GpuDeviceInfo& d : devices) {
    out += fmt::format("vulkan:{}  {}\n", d.index, d.name);
    out += fmt::format("  type                {}{}\n", d.type,
                       d.is_cpu ? "  (CPU implementation: used only when asked for by name)" : "");
    out += fmt::format("  driver              {}\n", d.driver);
    out += fmt::format("  api version         {}\n", d.api_version);
    out += fmt::format("  vendor / device id  0x{:04x} / 0x{:04x}\n", d.vendor_id, d.device_id);
    for (size_t i = 0; i < d.heaps.size(); ++i) {
      const GpuMemoryHeap& h = d.heaps[i];
      out += fmt::format("  memory heap {}       {:.2f} GiB{}", i, h.size / 1073741824.0,
                         h.device_local ? ", device-local" : "");
      if (h.has_budget) {
        out += fmt::format(", budget {:.2f} GiB, in use {:.2f} GiB", h.budget / 1073741824.0,
                           h.usage / 1073741824.0);
      }
      out += "\n";
    }
    out += fmt::format("  subgroup size       {}{}\n", d.subgroup_size,
                       d.subgroup_arithmetic ? " (arithmetic in compute)" : " (no arithmetic)");
    out += fmt::format("  fp16 / int8 math    {} / {}\n", yes(d.fp16_arithmetic),
                       yes(d.int8_arithmetic));
    out +=
        fmt::format("  16/8-bit storage    {} / {}\n", yes(d.storage_16bit), yes(d.storage_8bit));
    out += fmt::format("  cooperative matrix  {}{}\n", yes(d.cooperative_matrix),
                       d.cooperative_matrix_nv ? " (NV extension present)" : "");
    out += fmt::format("  memory budget ext   {}\n", yes(d.memory_budget));
    out +=
        fmt::format("  max storage buffer  {:.2f} GiB, shared memory {} KiB\n",
                    d.max_storage_buffer_range / 1073741824.0, d.max_compute_shared_memory / 1024);
  }
  return out;
}

Result<std::string> backend_for_device(std::string_view text) {
  auto spec = parse_device_spec(text);
  if (!spec.ok()) return Error{"--device: " + spec.error()};
  if (spec->kind == DeviceSpec::Kind::kCpu) return std::string("cpu");
  auto d = resolve_device(*spec, list_vulkan_devices());
  if (!d.ok()) return Error{d.error()};
  if (d->cpu) return std::string("cpu");
  return fmt::format("vulkan:{}", d->vulkan_index);
}

}  // namespace bie
