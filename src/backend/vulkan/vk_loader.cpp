#include "backend/vulkan/vk_loader.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <map>
#include <mutex>
#include <string>

namespace bie::vk {

namespace {

struct Loaded {
  Fns fns;
  std::string error;  // empty when loaded
};

}  // namespace

Result<Fns*> load_vulkan(const char* library) {
  static std::mutex mu;
  static std::map<std::string, Loaded> by_library;  // one entry per library name tried
  std::lock_guard<std::mutex> lock(mu);
  auto [it, inserted] = by_library.try_emplace(library);
  Loaded& l = it->second;
  if (inserted) {
    void* handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      l.error = fmt::format(
          "no Vulkan loader ({}); install a GPU driver with Vulkan support, or "
          "mesa-vulkan-drivers + libvulkan1 for the CPU driver",
          why != nullptr ? why : library);
    } else {
      l.fns.vkGetInstanceProcAddr =
          reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(handle, "vkGetInstanceProcAddr"));
      if (l.fns.vkGetInstanceProcAddr == nullptr) {
        l.error = fmt::format("{} has no vkGetInstanceProcAddr (not a Vulkan loader)", library);
      } else {
#define BIE_VK_LOAD(name)                                                                 \
  l.fns.name = reinterpret_cast<PFN_##name>(l.fns.vkGetInstanceProcAddr(nullptr, #name)); \
  if (l.fns.name == nullptr && l.error.empty()) l.error = fmt::format("{} lacks " #name, library);
        BIE_VK_GLOBAL_FNS(BIE_VK_LOAD)
#undef BIE_VK_LOAD
      }
      // The handle stays open for the life of the process (drivers must not be unloaded while
      // any instance may exist).
    }
  }
  if (!l.error.empty()) return Error{l.error};
  return &l.fns;
}

Status load_instance_fns(Fns& fns, VkInstance instance) {
#define BIE_VK_LOAD(name)                                                              \
  fns.name = reinterpret_cast<PFN_##name>(fns.vkGetInstanceProcAddr(instance, #name)); \
  if (fns.name == nullptr) return Error{"the Vulkan loader lacks " #name};
  BIE_VK_INSTANCE_FNS(BIE_VK_LOAD)
#undef BIE_VK_LOAD
  return {};
}

Status load_device_fns(Fns& fns, VkDevice device) {
#define BIE_VK_LOAD(name)                                                          \
  fns.name = reinterpret_cast<PFN_##name>(fns.vkGetDeviceProcAddr(device, #name)); \
  if (fns.name == nullptr) return Error{"the Vulkan driver lacks " #name};
  BIE_VK_DEVICE_FNS(BIE_VK_LOAD)
#undef BIE_VK_LOAD
  return {};
}

const char* result_name(VkResult r) {
  switch (r) {
    case VK_SUCCESS:
      return "VK_SUCCESS";
    case VK_NOT_READY:
      return "VK_NOT_READY";
    case VK_TIMEOUT:
      return "VK_TIMEOUT";
    case VK_INCOMPLETE:
      return "VK_INCOMPLETE";
    case VK_ERROR_OUT_OF_HOST_MEMORY:
      return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY:
      return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED:
      return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST:
      return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_MEMORY_MAP_FAILED:
      return "VK_ERROR_MEMORY_MAP_FAILED";
    case VK_ERROR_LAYER_NOT_PRESENT:
      return "VK_ERROR_LAYER_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT:
      return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_FEATURE_NOT_PRESENT:
      return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER:
      return "VK_ERROR_INCOMPATIBLE_DRIVER";
    case VK_ERROR_TOO_MANY_OBJECTS:
      return "VK_ERROR_TOO_MANY_OBJECTS";
    case VK_ERROR_FORMAT_NOT_SUPPORTED:
      return "VK_ERROR_FORMAT_NOT_SUPPORTED";
    case VK_ERROR_OUT_OF_POOL_MEMORY:
      return "VK_ERROR_OUT_OF_POOL_MEMORY";
    default:
      return "VK_ERROR_(other)";
  }
}

}  // namespace bie::vk
