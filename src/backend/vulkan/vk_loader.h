// The Vulkan entry points BIE uses, fetched at run time: libvulkan.so.1 is opened with dlopen and
// every function comes through vkGetInstanceProcAddr / vkGetDeviceProcAddr, so the binary never
// links libvulkan and starts on machines without it. Tables are filled once and then read-only.
#pragma once

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan_core.h>

#include "bie/common/result.h"

namespace bie::vk {

// Global (pre-instance) functions.
#define BIE_VK_GLOBAL_FNS(X) \
  X(vkEnumerateInstanceVersion) X(vkEnumerateInstanceExtensionProperties) X(vkCreateInstance)

#define BIE_VK_INSTANCE_FNS(X)                                                        \
  X(vkDestroyInstance)                                                                \
  X(vkEnumeratePhysicalDevices)                                                       \
  X(vkGetPhysicalDeviceProperties)                                                    \
  X(vkGetPhysicalDeviceProperties2)                                                   \
  X(vkGetPhysicalDeviceFeatures2)                                                     \
  X(vkGetPhysicalDeviceMemoryProperties)                                              \
  X(vkGetPhysicalDeviceMemoryProperties2) X(vkGetPhysicalDeviceQueueFamilyProperties) \
      X(vkEnumerateDeviceExtensionProperties) X(vkCreateDevice) X(vkGetDeviceProcAddr)

#define BIE_VK_DEVICE_FNS(X)                                                                       \
  X(vkDestroyDevice)                                                                               \
  X(vkGetDeviceQueue)                                                                              \
  X(vkDeviceWaitIdle)                                                                              \
  X(vkCreateBuffer)                                                                                \
  X(vkDestroyBuffer)                                                                               \
  X(vkGetBufferMemoryRequirements) X(vkAllocateMemory) X(vkFreeMemory) X(vkBindBufferMemory)       \
      X(vkMapMemory) X(vkUnmapMemory) X(vkCreateShaderModule) X(vkDestroyShaderModule)             \
          X(vkCreateDescriptorSetLayout) X(vkDestroyDescriptorSetLayout) X(vkCreatePipelineLayout) \
              X(vkDestroyPipelineLayout) X(vkCreatePipelineCache) X(vkDestroyPipelineCache) X(     \
                  vkCreateComputePipelines) X(vkDestroyPipeline) X(vkCreateDescriptorPool)         \
                  X(vkDestroyDescriptorPool) X(vkResetDescriptorPool) X(vkAllocateDescriptorSets)  \
                      X(vkUpdateDescriptorSets) X(vkCreateCommandPool) X(vkDestroyCommandPool)     \
                          X(vkAllocateCommandBuffers) X(vkBeginCommandBuffer)                      \
                              X(vkEndCommandBuffer) X(vkResetCommandBuffer) X(vkCmdBindPipeline)   \
                                  X(vkCmdBindDescriptorSets) X(vkCmdPushConstants)                 \
                                      X(vkCmdDispatch) X(vkCmdPipelineBarrier) X(vkCmdCopyBuffer)  \
                                          X(vkCmdFillBuffer) X(vkQueueSubmit) X(vkCreateFence)     \
                                              X(vkDestroyFence) X(vkWaitForFences)                 \
                                                  X(vkResetFences) X(vkCreateSemaphore)            \
                                                      X(vkDestroySemaphore)                        \
                                                          X(vkGetSemaphoreCounterValue)            \
                                                              X(vkWaitSemaphores)

struct Fns {
  PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr = nullptr;
#define BIE_VK_DECLARE(name) PFN_##name name = nullptr;
  BIE_VK_GLOBAL_FNS(BIE_VK_DECLARE)
  BIE_VK_INSTANCE_FNS(BIE_VK_DECLARE)
  BIE_VK_DEVICE_FNS(BIE_VK_DECLARE)
#undef BIE_VK_DECLARE
};

// Opens `library` (default "libvulkan.so.1") once per process and fills the global functions.
// A failure (no loader installed) is a user-facing error naming the library and the fix; it is
// remembered, so later calls return the same error. The name is a parameter for tests only.
[[nodiscard]] Result<Fns*> load_vulkan(const char* library = "libvulkan.so.1");

// Fills the instance-level functions of `fns` for `instance`.
[[nodiscard]] Status load_instance_fns(Fns& fns, VkInstance instance);
// Fills the device-level functions of `fns` for `device` (instance functions first).
[[nodiscard]] Status load_device_fns(Fns& fns, VkDevice device);

// "VK_ERROR_OUT_OF_DEVICE_MEMORY", ... for error messages.
[[nodiscard]] const char* result_name(VkResult r);

}  // namespace bie::vk
