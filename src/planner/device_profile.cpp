#include "bie/planner/device_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace bie::planner {

namespace {

// Shares of device memory a runtime can use: NVIDIA 92 % default / 96 % tuned, Apple 75 % default
// / 88 % with iogpu.wired_limit_mb raised (VRAMLab, ../shared/BRIEF.md §4). macOS gives machines of
// 36 GB and less about two thirds by default (Metal recommendedMaxWorkingSetSize).
constexpr double kNvUsable = 0.92;
constexpr double kNvTuned = 0.96;
constexpr double kAppleUsable = 0.75;
constexpr double kAppleSmallUsable = 2.0 / 3.0;
constexpr double kAppleTuned = 0.88;
// CUDA context + cuBLAS workspace + graphs: the seed's 0.55 GiB on an 8 GB card (BRIEF §1).
constexpr double kCudaWorkspaceGib = 0.55;
// Metal command buffers and library: an estimate, not a measurement.
constexpr double kMetalWorkspaceGib = 0.25;

constexpr std::string_view kBrief = "VRAMLab table, ../shared/BRIEF.md §4";

DeviceProfile nv(std::string name, std::string desc, double gib, double gbs, std::string source) {
  return {std::move(name), std::move(desc),   DeviceKind::kNvidia, gib, gbs, kNvUsable,
          kNvTuned,        kCudaWorkspaceGib, std::move(source)};
}

DeviceProfile apple(std::string name, std::string desc, double gib, double gbs,
                    std::string source) {
  const double usable = gib <= 36 ? kAppleSmallUsable : kAppleUsable;
  return {std::move(name), std::move(desc),    DeviceKind::kApple, gib, gbs, usable,
          kAppleTuned,     kMetalWorkspaceGib, std::move(source)};
}

const std::vector<DeviceProfile>& table() {
  static const std::vector<DeviceProfile> t = [] {
    const std::string nvspec = "NVIDIA product specifications (nvidia.com)";
    const std::string appspec = "Apple tech specs (support.apple.com/specs)";
    const std::string brief(kBrief);
    return std::vector<DeviceProfile>{
        nv("rtx-3060-8gb", "NVIDIA GeForce RTX 3060 8 GB (128-bit)", 8, 240, nvspec),
        nv("rtx-3060-12gb", "NVIDIA GeForce RTX 3060 12 GB", 12, 360, nvspec),
        nv("rtx-4060-8gb", "NVIDIA GeForce RTX 4060 8 GB", 8, 272, nvspec),
        nv("rtx-4060ti-8gb", "NVIDIA GeForce RTX 4060 Ti 8 GB", 8, 288,
           nvspec + "; 288 GB/s also in ../shared/BRIEF.md §1"),
        nv("rtx-4060ti-16gb", "NVIDIA GeForce RTX 4060 Ti 16 GB", 16, 288, nvspec),
        nv("rtx-4070-laptop-8gb", "NVIDIA GeForce RTX 4070 Laptop GPU 8 GB", 8, 256, nvspec),
        nv("rtx-4080", "NVIDIA GeForce RTX 4080 16 GB", 16, 716.8, nvspec),
        nv("rtx-3090", "NVIDIA GeForce RTX 3090 24 GB", 24, 936, brief),
        nv("rtx-4090", "NVIDIA GeForce RTX 4090 24 GB", 24, 1008, brief),
        nv("rtx-5090", "NVIDIA GeForce RTX 5090 32 GB", 32, 1792, brief),
        nv("l4", "NVIDIA L4 24 GB", 24, 300, nvspec),
        nv("a100-80gb", "NVIDIA A100 80 GB SXM", 80, 2039, brief),
        nv("h100-sxm-80gb", "NVIDIA H100 SXM 80 GB", 80, 3350, brief),
        nv("h200", "NVIDIA H200 141 GB (nvidia-smi shows 140.4 GiB)", 141, 4800, nvspec),
        apple("m1-pro-32gb", "Apple M1 Pro 32 GB", 32, 200, appspec),
        apple("m2-pro-32gb", "Apple M2 Pro 32 GB", 32, 200, appspec),
        apple("m3-pro-36gb", "Apple M3 Pro 36 GB", 36, 150, appspec),
        apple("m4-pro-48gb", "Apple M4 Pro 48 GB", 48, 273, appspec),
        apple("m1-max-64gb", "Apple M1 Max 64 GB", 64, 400, appspec),
        apple("m2-max-96gb", "Apple M2 Max 96 GB", 96, 400, appspec),
        apple("m3-max-128gb", "Apple M3 Max 128 GB (16-core CPU)", 128, 400, appspec),
        apple("m4-max-64gb", "Apple M4 Max 64 GB (the BRIEF's 'M-Max 64 GB')", 64, 546, brief),
        apple("m4-max-128gb", "Apple Mac Studio M4 Max 128 GB", 128, 546, brief),
        apple("m1-ultra-128gb", "Apple M1 Ultra 128 GB", 128, 800, appspec),
        apple("m2-ultra-192gb", "Apple M2 Ultra 192 GB", 192, 800, brief),
        apple("m3-ultra-256gb", "Apple M3 Ultra 256 GB", 256, 819, appspec),
    };
  }();
  return t;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::span<const DeviceProfile> device_profiles() {
  return table();
}

Result<DeviceProfile> find_device(std::string_view name, bool measure_cpu) {
  const std::string want = lower(name);
  if (want == "cpu") return cpu_device_profile(measure_cpu);
  for (const DeviceProfile& d : table()) {
    if (d.name == want) return d;
  }
  return Error{
      fmt::format("unknown device '{}'; see `bie plan --list-devices`, or give --vram and "
                  "--bandwidth",
                  name)};
}

Result<DeviceProfile> cpu_device_profile(bool measure) {
  std::ifstream in("/proc/meminfo");
  std::string key;
  long long kib = 0;
  std::string unit;
  double total_gib = 0;
  while (in >> key >> kib >> unit) {
    if (key == "MemTotal:") {
      total_gib = static_cast<double>(kib) / (1024.0 * 1024.0);
      break;
    }
  }
  if (total_gib <= 0) return Error{"cannot read MemTotal from /proc/meminfo"};
  DeviceProfile d;
  d.name = "cpu";
  d.description = fmt::format("this host's CPU and RAM ({} hardware threads)",
                              std::max(1u, std::thread::hardware_concurrency()));
  d.kind = DeviceKind::kCpu;
  d.memory_gib = total_gib;
  d.bandwidth_gbs = measure ? measure_memory_bandwidth_gbs() : 0.0;
  d.usable_fraction = 0.90;  // leaves the OS and other processes room; an estimate
  d.tuned_fraction = 0.95;
  d.workspace_gib = 0.0625;
  d.source = measure ? "MemTotal from /proc/meminfo; bandwidth measured now (STREAM-style copy)"
                     : "MemTotal from /proc/meminfo; bandwidth not measured";
  return d;
}

double measure_memory_bandwidth_gbs(double seconds) {
  const unsigned n_threads = std::clamp(std::thread::hardware_concurrency(), 1u, 16u);
  constexpr size_t kBytesPerThread = size_t{32} << 20;  // 2 x 32 MiB each: far beyond any LLC share
  std::vector<std::unique_ptr<char[]>> src(n_threads), dst(n_threads);
  for (unsigned t = 0; t < n_threads; ++t) {
    src[t] = std::make_unique<char[]>(kBytesPerThread);
    dst[t] = std::make_unique<char[]>(kBytesPerThread);
    std::memset(src[t].get(), 1, kBytesPerThread);  // fault the pages in before timing
    std::memset(dst[t].get(), 0, kBytesPerThread);
  }
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration<double>(seconds);
  std::vector<size_t> copies(n_threads, 0);
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < n_threads; ++t) {
    workers.emplace_back([&, t] {
      do {
        std::memcpy(dst[t].get(), src[t].get(), kBytesPerThread);
        ++copies[t];
      } while (Clock::now() < deadline);
    });
  }
  for (auto& w : workers) w.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  size_t total = 0;
  for (size_t c : copies) total += c;
  // Each copy reads and writes kBytesPerThread (STREAM "Copy" counts both).
  return 2.0 * static_cast<double>(total) * static_cast<double>(kBytesPerThread) / elapsed / 1e9;
}

}  // namespace bie::planner
