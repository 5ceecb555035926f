// The Vulkan device the tests run on: Mesa's lavapipe (llvmpipe) when it is installed, as in CI,
// else the first device listed; and one backend on it shared by a test binary's kernel tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "backend/vulkan/vulkan_backend.h"
#include "bie/backend/device.h"

namespace bie::test {

// lavapipe's index, else the first device's, else -1 (no device: opening it fails the test).
inline int lavapipe_index() {
  auto list = list_vulkan_devices();
  if (!list.ok() || list->empty()) return -1;
  for (const GpuDeviceInfo& d : *list) {
    if (d.name.find("llvmpipe") != std::string::npos) return d.index;
  }
  return list->front().index;
}

// One VulkanBackend on lavapipe_index() for the whole binary (pipelines compiled once).
inline VulkanBackend& shared_vulkan_backend() {
  static std::unique_ptr<VulkanBackend> be = [] {
    VulkanBackendOptions o;
    o.device_index = lavapipe_index();
    auto r = VulkanBackend::create(o);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error());
    return r.ok() ? std::move(*r) : nullptr;
  }();
  if (!be) std::abort();  // no Vulkan device: every test here fails (never skips)
  return *be;
}

}  // namespace bie::test
