// Vulkan device layer: one instance per process (shared), a logical device with one compute queue,
// device buffers (device-local, written through a staging buffer when the memory is not host
// visible), compute pipelines built from the embedded SPIR-V and cached by name, and one command
// stream that records dispatches and waits on a fence. A Device is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/vulkan/vk_loader.h"
#include "bie/backend/device.h"
#include "bie/common/result.h"

namespace bie::vk {

class Instance {
 public:
  // The process's instance (created on first use; a failure is remembered and returned again).
  [[nodiscard]] static Result<std::shared_ptr<Instance>> get();
  ~Instance();
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  [[nodiscard]] const Fns& fns() const { return fns_; }
  [[nodiscard]] VkInstance handle() const { return instance_; }
  [[nodiscard]] const std::vector<VkPhysicalDevice>& physical_devices() const { return phys_; }
  [[nodiscard]] GpuDeviceInfo describe(int index) const;

 private:
  Instance() = default;
  Fns fns_;
  VkInstance instance_ = VK_NULL_HANDLE;
  std::vector<VkPhysicalDevice> phys_;
};

// Every device of the process's instance (see bie::list_vulkan_devices).
[[nodiscard]] Result<std::vector<GpuDeviceInfo>> enumerate_devices();

struct Buffer {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  size_t size = 0;         // bytes asked for
  size_t alloc_size = 0;   // bytes the driver allocated
  void* mapped = nullptr;  // host pointer when the memory is host visible and mapped
  bool host = false;       // host-visible memory (staging, parameters), not device-local
  [[nodiscard]] bool valid() const { return buffer != VK_NULL_HANDLE; }
};

// A range of a buffer bound to one binding of a shader.
struct BufferRef {
  const Buffer* buffer;
  size_t offset = 0;
  size_t size = 0;  // 0: to the end (at most max_binding_bytes())
};

struct Pipeline {
  VkPipeline pipeline = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  uint32_t n_buffers = 0;
  uint32_t push_bytes = 0;
};

struct DeviceOptions {
  // Write and read device buffers through the staging buffer even when device memory is host
  // visible (tests use it so the staging path runs on lavapipe and integrated GPUs).
  bool force_staging = false;
  size_t staging_bytes = size_t{32} << 20;
};

class Device {
 public:
  [[nodiscard]] static Result<std::unique_ptr<Device>> open(int index,
                                                            const DeviceOptions& opts = {});
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  [[nodiscard]] const GpuDeviceInfo& info() const { return info_; }

  // A device-local storage buffer of `bytes` (rounded up to 16), zero-filled.
  [[nodiscard]] Result<Buffer> create_buffer(size_t bytes);
  // A host-visible, coherent, mapped storage buffer of `bytes` (small per-dispatch parameters the
  // host writes while earlier work is recorded: write only bytes no pending work reads).
  [[nodiscard]] Result<Buffer> create_host_buffer(size_t bytes);
  void destroy(Buffer& b);
  // note: call only with no recorded work pending on the bytes touched (they sync first).
  [[nodiscard]] Status upload(const Buffer& dst, size_t offset, const void* src, size_t bytes);
  [[nodiscard]] Status download(const Buffer& src, size_t offset, void* dst, size_t bytes);

  // The pipeline of embedded shader `name` (built once, cached); its shader declares `n_buffers`
  // storage buffers at bindings 0.. of set 0 and `push_bytes` of push constants.
  [[nodiscard]] Result<const Pipeline*> pipeline(const std::string& name, uint32_t n_buffers,
                                                 uint32_t push_bytes);

  // Records one dispatch (and a barrier after it, so the next dispatch sees its writes).
  [[nodiscard]] Status dispatch(const Pipeline& p, std::initializer_list<BufferRef> buffers,
                                const void* push, uint32_t gx, uint32_t gy = 1, uint32_t gz = 1);
  // Records a buffer-to-buffer copy (and a barrier).
  [[nodiscard]] Status copy(const Buffer& src, size_t src_offset, const Buffer& dst,
                            size_t dst_offset, size_t bytes);
  // Submits what was recorded and waits for it (a fence). A no-op when nothing is recorded.
  [[nodiscard]] Status sync();

  // Bytes of memory this Device holds now (buffers and staging), as the driver allocated them.
  [[nodiscard]] uint64_t allocated_bytes() const { return allocated_bytes_; }
  // Device-local buffers now and at most so far: the bytes asked for (what the memory plan
  // counts) and what the driver allocated for them (alignment may round each up). Host-visible
  // buffers (staging, per-dispatch parameters) are counted apart.
  [[nodiscard]] uint64_t device_bytes() const { return device_bytes_; }
  [[nodiscard]] uint64_t device_alloc_bytes() const { return device_alloc_bytes_; }
  [[nodiscard]] uint64_t peak_device_bytes() const { return peak_device_bytes_; }
  [[nodiscard]] uint64_t device_buffers() const { return device_buffers_; }
  [[nodiscard]] uint64_t host_alloc_bytes() const { return allocated_bytes_ - device_alloc_bytes_; }
  [[nodiscard]] uint64_t dispatch_count() const { return dispatches_; }
  // Bytes one binding may span (maxStorageBufferRange, at most 2^31 so that shader offsets in
  // 32-bit words and bytes never overflow) and the alignment of a binding's offset.
  [[nodiscard]] size_t max_binding_bytes() const;
  [[nodiscard]] size_t binding_alignment() const;

 private:
  Device() = default;
  [[nodiscard]] Result<Buffer> make_buffer(size_t bytes, bool staging);
  [[nodiscard]] Status begin_if_needed();
  [[nodiscard]] Status check(VkResult r, const char* what);

  std::shared_ptr<Instance> instance_;
  const Fns* f_ = nullptr;
  Fns dfns_;  // with device-level functions
  GpuDeviceInfo info_;
  DeviceOptions opts_;
  VkPhysicalDevice phys_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;
  VkPhysicalDeviceMemoryProperties mem_props_{};
  uint32_t device_type_index_ = UINT32_MAX;   // device-local memory type
  uint32_t staging_type_index_ = UINT32_MAX;  // host-visible + coherent memory type
  bool device_memory_mappable_ = false;
  VkPipelineCache cache_ = VK_NULL_HANDLE;
  VkCommandPool cmd_pool_ = VK_NULL_HANDLE;
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  VkDescriptorPool desc_pool_ = VK_NULL_HANDLE;
  uint32_t desc_sets_left_ = 0;
  bool recording_ = false;
  Buffer staging_;
  std::map<std::string, Pipeline> pipelines_;
  uint64_t allocated_bytes_ = 0;
  uint64_t device_bytes_ = 0;
  uint64_t device_alloc_bytes_ = 0;
  uint64_t peak_device_bytes_ = 0;
  uint64_t device_buffers_ = 0;
  uint64_t dispatches_ = 0;
};

}  // namespace bie::vk
