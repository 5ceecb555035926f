#include "backend/vulkan/vk_context.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "backend/vulkan/spirv_registry.h"

// Vulkan structs are initialised the C way, `T x{VK_STRUCTURE_TYPE_...}` (the rest zero).
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace bie::vk {

namespace {

constexpr uint32_t kDescriptorSetsPerPool = 1024;
constexpr uint32_t kMaxBuffersPerSet = 13;  // attn_paged_kv: q, 8 KV pool parts, table, meta, out, scratch

std::string version_string(uint32_t v) {
  return fmt::format("{}.{}.{}", VK_API_VERSION_MAJOR(v), VK_API_VERSION_MINOR(v),
                     VK_API_VERSION_PATCH(v));
}

const char* type_name(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
      return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
      return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
      return "cpu";
    default:
      return "other";
  }
}

size_t round_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

}  // namespace

// ---- instance ---------------------------------------------------------------------------------

Result<std::shared_ptr<Instance>> Instance::get() {
  static std::mutex mu;
  static std::shared_ptr<Instance> instance;
  static std::string error;
  std::lock_guard<std::mutex> lock(mu);
  if (instance) return instance;
  if (!error.empty()) return Error{error};
  auto fail = [&](std::string e) -> Result<std::shared_ptr<Instance>> {
    error = std::move(e);
    return Error{error};
  };
  auto loaded = load_vulkan();
  if (!loaded.ok()) return fail(loaded.error());
  std::shared_ptr<Instance> inst(new Instance());
  inst->fns_ = **loaded;
  Fns& f = inst->fns_;
  uint32_t api = VK_API_VERSION_1_0;
  if (f.vkEnumerateInstanceVersion(&api) != VK_SUCCESS || api < VK_API_VERSION_1_2) {
    return fail(
        fmt::format("the Vulkan loader is version {}; BIE needs Vulkan 1.2", version_string(api)));
  }
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "bie";
  app.pEngineName = "bie";
  app.apiVersion = VK_API_VERSION_1_2;
  VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ci.pApplicationInfo = &app;
  VkResult r = f.vkCreateInstance(&ci, nullptr, &inst->instance_);
  if (r != VK_SUCCESS) {
    return fail(
        fmt::format("no Vulkan driver found (vkCreateInstance: {}); install a GPU "
                    "driver with Vulkan support, or mesa-vulkan-drivers",
                    result_name(r)));
  }
  if (Status s = load_instance_fns(f, inst->instance_); !s.ok()) {
    auto destroy = reinterpret_cast<PFN_vkDestroyInstance>(
        f.vkGetInstanceProcAddr(inst->instance_, "vkDestroyInstance"));
    if (destroy != nullptr) destroy(inst->instance_, nullptr);
    inst->instance_ = VK_NULL_HANDLE;
    return fail(s.error());
  }
  uint32_t n = 0;
  r = f.vkEnumeratePhysicalDevices(inst->instance_, &n, nullptr);
  if (r == VK_SUCCESS && n > 0) {
    inst->phys_.resize(n);
    r = f.vkEnumeratePhysicalDevices(inst->instance_, &n, inst->phys_.data());
    inst->phys_.resize(n);
  }
  if (r != VK_SUCCESS && r != VK_INCOMPLETE) {
    return fail(fmt::format("vkEnumeratePhysicalDevices: {}", result_name(r)));
  }
  instance = inst;
  return instance;
}

Instance::~Instance() {
  if (instance_ != VK_NULL_HANDLE) fns_.vkDestroyInstance(instance_, nullptr);
}

GpuDeviceInfo Instance::describe(int index) const {
  const Fns& f = fns_;
  VkPhysicalDevice pd = phys_.at(static_cast<size_t>(index));
  GpuDeviceInfo d;
  d.index = index;

  uint32_t n_ext = 0;
  f.vkEnumerateDeviceExtensionProperties(pd, nullptr, &n_ext, nullptr);
  std::vector<VkExtensionProperties> exts(n_ext);
  f.vkEnumerateDeviceExtensionProperties(pd, nullptr, &n_ext, exts.data());
  auto has_ext = [&](const char* name) {
    return std::any_of(exts.begin(), exts.end(), [&](const VkExtensionProperties& e) {
      return std::strcmp(e.extensionName, name) == 0;
    });
  };
  d.memory_budget = has_ext(VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
  d.cooperative_matrix = has_ext("VK_KHR_cooperative_matrix");
  d.cooperative_matrix_nv = has_ext("VK_NV_cooperative_matrix");

  VkPhysicalDeviceMaintenance3Properties maint3{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
  VkPhysicalDeviceDriverProperties driver{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
  driver.pNext = &maint3;
  VkPhysicalDeviceSubgroupProperties subgroup{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  subgroup.pNext = &driver;
  VkPhysicalDeviceProperties2 props{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  props.pNext = &subgroup;
  f.vkGetPhysicalDeviceProperties2(pd, &props);
  const VkPhysicalDeviceProperties& p = props.properties;
  d.name = p.deviceName;
  d.type = type_name(p.deviceType);
  d.is_cpu = p.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
  d.api_version = version_string(p.apiVersion);
  d.vendor_id = p.vendorID;
  d.device_id = p.deviceID;
  d.driver = fmt::format("{} ({})", driver.driverName, driver.driverInfo);
  d.subgroup_size = subgroup.subgroupSize;
  d.subgroup_arithmetic =
      (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) != 0 &&
      (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0;
  d.max_storage_buffer_range = p.limits.maxStorageBufferRange;
  d.min_storage_buffer_alignment = p.limits.minStorageBufferOffsetAlignment;
  d.max_compute_shared_memory = p.limits.maxComputeSharedMemorySize;
  d.max_storage_buffers_per_stage = p.limits.maxPerStageDescriptorStorageBuffers;
  d.max_buffer_bytes = maint3.maxMemoryAllocationSize;

  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  f11.pNext = &f12;
  VkPhysicalDeviceFeatures2 feats{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  feats.pNext = &f11;
  f.vkGetPhysicalDeviceFeatures2(pd, &feats);
  d.fp16_arithmetic = f12.shaderFloat16 == VK_TRUE;
  d.int8_arithmetic = f12.shaderInt8 == VK_TRUE;
  d.storage_16bit = f11.storageBuffer16BitAccess == VK_TRUE;
  d.storage_8bit = f12.storageBuffer8BitAccess == VK_TRUE;

  VkPhysicalDeviceMemoryBudgetPropertiesEXT budget{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT};
  VkPhysicalDeviceMemoryProperties2 mem{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2};
  if (d.memory_budget) mem.pNext = &budget;
  f.vkGetPhysicalDeviceMemoryProperties2(pd, &mem);
  for (uint32_t i = 0; i < mem.memoryProperties.memoryHeapCount; ++i) {
    GpuMemoryHeap h;
    h.size = mem.memoryProperties.memoryHeaps[i].size;
    h.device_local =
        (mem.memoryProperties.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) != 0;
    if (d.memory_budget) {
      h.has_budget = true;
      h.budget = budget.heapBudget[i];
      h.usage = budget.heapUsage[i];
    }
    d.heaps.push_back(h);
  }
  return d;
}

Result<std::vector<GpuDeviceInfo>> enumerate_devices() {
  auto inst = Instance::get();
  if (!inst.ok()) return Error{inst.error()};
  std::vector<GpuDeviceInfo> out;
  for (size_t i = 0; i < (*inst)->physical_devices().size(); ++i) {
    out.push_back((*inst)->describe(static_cast<int>(i)));
  }
  if (out.empty()) {
    return Error{
        "no Vulkan device found (the loader found no driver); install a GPU driver "
        "with Vulkan support, or mesa-vulkan-drivers"};
  }
  return out;
}

// ---- device -----------------------------------------------------------------------------------

Status Device::check(VkResult r, const char* what) {
  if (r == VK_SUCCESS) return {};
  return Error{fmt::format("Vulkan {} on {}: {}", what, info_.name, result_name(r))};
}

Result<std::unique_ptr<Device>> Device::open(int index, const DeviceOptions& opts) {
  auto inst = Instance::get();
  if (!inst.ok()) return Error{inst.error()};
  const auto& phys = (*inst)->physical_devices();
  if (index < 0 || static_cast<size_t>(index) >= phys.size()) {
    return Error{
        fmt::format("vulkan:{}: this machine has {} Vulkan device(s)", index, phys.size())};
  }
  std::unique_ptr<Device> d(new Device());
  d->instance_ = *inst;
  d->dfns_ = (*inst)->fns();
  d->f_ = &d->dfns_;
  d->opts_ = opts;
  d->phys_ = phys[static_cast<size_t>(index)];
  d->info_ = (*inst)->describe(index);
  Fns& f = d->dfns_;

  uint32_t n_fam = 0;
  f.vkGetPhysicalDeviceQueueFamilyProperties(d->phys_, &n_fam, nullptr);
  std::vector<VkQueueFamilyProperties> fams(n_fam);
  f.vkGetPhysicalDeviceQueueFamilyProperties(d->phys_, &n_fam, fams.data());
  uint32_t family = UINT32_MAX;
  for (uint32_t i = 0; i < n_fam; ++i) {
    const bool compute = (fams[i].queueFlags & VK_QUEUE_COMPUTE_BIT) != 0;
    const bool graphics = (fams[i].queueFlags & VK_QUEUE_GRAPHICS_BIT) != 0;
    if (compute && (family == UINT32_MAX || !graphics)) family = i;  // prefer compute-only
  }
  if (family == UINT32_MAX) return Error{d->info_.name + " has no compute queue"};
  d->queue_family_ = family;

  const float priority = 1.0f;
  VkDeviceQueueCreateInfo qci{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qci.queueFamilyIndex = family;
  qci.queueCount = 1;
  qci.pQueuePriorities = &priority;
  VkDeviceCreateInfo dci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  dci.queueCreateInfoCount = 1;
  dci.pQueueCreateInfos = &qci;
  if (Status s = d->check(f.vkCreateDevice(d->phys_, &dci, nullptr, &d->device_), "vkCreateDevice");
      !s.ok()) {
    return Error{s.error()};
  }
  if (Status s = load_device_fns(f, d->device_); !s.ok()) return Error{s.error()};
  f.vkGetDeviceQueue(d->device_, family, 0, &d->queue_);

  f.vkGetPhysicalDeviceMemoryProperties(d->phys_, &d->mem_props_);
  for (uint32_t i = 0; i < d->mem_props_.memoryTypeCount; ++i) {
    const VkMemoryPropertyFlags fl = d->mem_props_.memoryTypes[i].propertyFlags;
    const bool local = (fl & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) != 0;
    const bool host = (fl & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) != 0 &&
                      (fl & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) != 0;
    if (local && d->device_type_index_ == UINT32_MAX) {
      d->device_type_index_ = i;
      d->device_memory_mappable_ = host;
    }
    if (host && d->staging_type_index_ == UINT32_MAX) d->staging_type_index_ = i;
  }
  if (d->device_type_index_ == UINT32_MAX || d->staging_type_index_ == UINT32_MAX) {
    return Error{d->info_.name + ": no device-local or no host-visible memory type"};
  }
  if (opts.force_staging) d->device_memory_mappable_ = false;

  VkPipelineCacheCreateInfo pcci{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
  if (Status s = d->check(f.vkCreatePipelineCache(d->device_, &pcci, nullptr, &d->cache_),
                          "vkCreatePipelineCache");
      !s.ok()) {
    return Error{s.error()};
  }
  VkCommandPoolCreateInfo cpci{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  cpci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  cpci.queueFamilyIndex = family;
  if (Status s = d->check(f.vkCreateCommandPool(d->device_, &cpci, nullptr, &d->cmd_pool_),
                          "vkCreateCommandPool");
      !s.ok()) {
    return Error{s.error()};
  }
  VkCommandBufferAllocateInfo cbai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  cbai.commandPool = d->cmd_pool_;
  cbai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  cbai.commandBufferCount = 1;
  if (Status s = d->check(f.vkAllocateCommandBuffers(d->device_, &cbai, &d->cmd_),
                          "vkAllocateCommandBuffers");
      !s.ok()) {
    return Error{s.error()};
  }
  VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  if (Status s = d->check(f.vkCreateFence(d->device_, &fci, nullptr, &d->fence_), "vkCreateFence");
      !s.ok()) {
    return Error{s.error()};
  }
  VkDescriptorPoolSize ps{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                          kDescriptorSetsPerPool * kMaxBuffersPerSet};
  VkDescriptorPoolCreateInfo dpci{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
  dpci.maxSets = kDescriptorSetsPerPool;
  dpci.poolSizeCount = 1;
  dpci.pPoolSizes = &ps;
  if (Status s = d->check(f.vkCreateDescriptorPool(d->device_, &dpci, nullptr, &d->desc_pool_),
                          "vkCreateDescriptorPool");
      !s.ok()) {
    return Error{s.error()};
  }
  d->desc_sets_left_ = kDescriptorSetsPerPool;
  if (!d->device_memory_mappable_) {
    auto st = d->make_buffer(opts.staging_bytes, /*staging=*/true);
    if (!st.ok()) return Error{st.error()};
    d->staging_ = *st;
  }
  return d;
}

Device::~Device() {
  if (device_ == VK_NULL_HANDLE) return;
  const Fns& f = *f_;
  f.vkDeviceWaitIdle(device_);
  for (auto& [name, p] : pipelines_) {
    f.vkDestroyPipeline(device_, p.pipeline, nullptr);
    f.vkDestroyPipelineLayout(device_, p.layout, nullptr);
    f.vkDestroyDescriptorSetLayout(device_, p.set_layout, nullptr);
  }
  destroy(staging_);
  if (desc_pool_ != VK_NULL_HANDLE) f.vkDestroyDescriptorPool(device_, desc_pool_, nullptr);
  if (fence_ != VK_NULL_HANDLE) f.vkDestroyFence(device_, fence_, nullptr);
  if (cmd_pool_ != VK_NULL_HANDLE) f.vkDestroyCommandPool(device_, cmd_pool_, nullptr);
  if (cache_ != VK_NULL_HANDLE) f.vkDestroyPipelineCache(device_, cache_, nullptr);
  f.vkDestroyDevice(device_, nullptr);
}

Result<Buffer> Device::make_buffer(size_t bytes, bool staging) {
  const Fns& f = *f_;
  Buffer b;
  b.size = bytes;
  VkBufferCreateInfo bci{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bci.size = round_up(std::max<size_t>(bytes, 16), 16);
  bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
              VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  if (Status s = check(f.vkCreateBuffer(device_, &bci, nullptr, &b.buffer), "vkCreateBuffer");
      !s.ok()) {
    return Error{s.error()};
  }
  VkMemoryRequirements req{};
  f.vkGetBufferMemoryRequirements(device_, b.buffer, &req);
  uint32_t type = staging ? staging_type_index_ : device_type_index_;
  if ((req.memoryTypeBits & (1u << type)) == 0) {
    f.vkDestroyBuffer(device_, b.buffer, nullptr);
    return Error{info_.name + ": the buffer's memory type is not usable"};
  }
  VkMemoryAllocateInfo mai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  mai.allocationSize = req.size;
  mai.memoryTypeIndex = type;
  VkResult r = f.vkAllocateMemory(device_, &mai, nullptr, &b.memory);
  if (r != VK_SUCCESS) {
    f.vkDestroyBuffer(device_, b.buffer, nullptr);
    return Error{fmt::format("cannot allocate {} bytes of {} memory on {}: {}", req.size,
                             staging ? "staging" : "device", info_.name, result_name(r))};
  }
  b.alloc_size = req.size;
  b.host = staging;
  f.vkBindBufferMemory(device_, b.buffer, b.memory, 0);
  const bool mappable = staging || (device_memory_mappable_ && !opts_.force_staging);
  if (mappable) {
    if (Status s =
            check(f.vkMapMemory(device_, b.memory, 0, VK_WHOLE_SIZE, 0, &b.mapped), "vkMapMemory");
        !s.ok()) {
      destroy(b);
      return Error{s.error()};
    }
  }
  allocated_bytes_ += b.alloc_size;
  if (!b.host) {
    device_bytes_ += b.size;
    device_alloc_bytes_ += b.alloc_size;
    peak_device_bytes_ = std::max(peak_device_bytes_, device_bytes_);
    ++device_buffers_;
  }
  return b;
}

Result<Buffer> Device::create_buffer(size_t bytes) {
  auto b = make_buffer(bytes, /*staging=*/false);
  if (!b.ok()) return b;
  if (b->mapped != nullptr) {
    std::memset(b->mapped, 0, b->alloc_size);
  } else {
    if (Status s = begin_if_needed(); !s.ok()) return Error{s.error()};
    f_->vkCmdFillBuffer(cmd_, b->buffer, 0, VK_WHOLE_SIZE, 0);
    if (Status s = sync(); !s.ok()) return Error{s.error()};
  }
  return b;
}

Result<Buffer> Device::create_host_buffer(size_t bytes) {
  return make_buffer(bytes, true);
}

void Device::destroy(Buffer& b) {
  if (!b.valid()) return;
  if (b.mapped != nullptr) f_->vkUnmapMemory(device_, b.memory);
  f_->vkDestroyBuffer(device_, b.buffer, nullptr);
  f_->vkFreeMemory(device_, b.memory, nullptr);
  allocated_bytes_ -= b.alloc_size;
  if (!b.host) {
    device_bytes_ -= b.size;
    device_alloc_bytes_ -= b.alloc_size;
    --device_buffers_;
  }
  b = Buffer{};
}

Status Device::upload(const Buffer& dst, size_t offset, const void* src, size_t bytes) {
  if (offset + bytes > dst.size) return Error{"upload past the end of a device buffer"};
  if (Status s = sync(); !s.ok()) return s;
  if (dst.mapped != nullptr) {
    std::memcpy(static_cast<uint8_t*>(dst.mapped) + offset, src, bytes);
    return {};
  }
  const auto* p = static_cast<const uint8_t*>(src);
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(bytes - done, staging_.size);
    std::memcpy(staging_.mapped, p + done, n);
    if (Status s = copy(staging_, 0, dst, offset + done, n); !s.ok()) return s;
    if (Status s = sync(); !s.ok()) return s;
    done += n;
  }
  return {};
}

Status Device::download(const Buffer& src, size_t offset, void* dst, size_t bytes) {
  if (offset + bytes > src.size) return Error{"download past the end of a device buffer"};
  if (Status s = sync(); !s.ok()) return s;
  if (src.mapped != nullptr) {
    std::memcpy(dst, static_cast<const uint8_t*>(src.mapped) + offset, bytes);
    return {};
  }
  auto* p = static_cast<uint8_t*>(dst);
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(bytes - done, staging_.size);
    if (Status s = copy(src, offset + done, staging_, 0, n); !s.ok()) return s;
    if (Status s = sync(); !s.ok()) return s;
    std::memcpy(p + done, staging_.mapped, n);
    done += n;
  }
  return {};
}

Result<const Pipeline*> Device::pipeline(const std::string& name, uint32_t n_buffers,
                                         uint32_t push_bytes) {
  if (auto it = pipelines_.find(name); it != pipelines_.end()) {
    if (it->second.n_buffers != n_buffers || it->second.push_bytes != push_bytes) {
      return Error{"pipeline " + name + " asked for with a different layout"};
    }
    return &it->second;
  }
  const SpirvModule* mod = nullptr;
  for (const SpirvModule& m : spirv_modules()) {
    if (name == m.name) mod = &m;
  }
  if (mod == nullptr) return Error{"no embedded shader named " + name};
  if (n_buffers > kMaxBuffersPerSet) return Error{"too many buffers for shader " + name};
  if (n_buffers > info_.max_storage_buffers_per_stage) {
    return Error{fmt::format(
        "the Vulkan device {} binds at most {} storage buffers per shader; shader {} needs {} "
        "(use --device cpu)",
        info_.name, info_.max_storage_buffers_per_stage, name, n_buffers)};
  }
  const Fns& f = *f_;
  Pipeline p;
  p.n_buffers = n_buffers;
  p.push_bytes = push_bytes;
  std::vector<VkDescriptorSetLayoutBinding> binds(n_buffers);
  for (uint32_t i = 0; i < n_buffers; ++i) {
    binds[i] = {i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  }
  VkDescriptorSetLayoutCreateInfo dslci{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  dslci.bindingCount = n_buffers;
  dslci.pBindings = binds.data();
  if (Status s = check(f.vkCreateDescriptorSetLayout(device_, &dslci, nullptr, &p.set_layout),
                       "vkCreateDescriptorSetLayout");
      !s.ok()) {
    return Error{s.error()};
  }
  VkPushConstantRange pcr{VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes};
  VkPipelineLayoutCreateInfo plci{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  plci.setLayoutCount = 1;
  plci.pSetLayouts = &p.set_layout;
  plci.pushConstantRangeCount = push_bytes > 0 ? 1 : 0;
  plci.pPushConstantRanges = &pcr;
  if (Status s = check(f.vkCreatePipelineLayout(device_, &plci, nullptr, &p.layout),
                       "vkCreatePipelineLayout");
      !s.ok()) {
    f.vkDestroyDescriptorSetLayout(device_, p.set_layout, nullptr);
    return Error{s.error()};
  }
  VkShaderModuleCreateInfo smci{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  smci.codeSize = mod->n_words * 4;
  smci.pCode = mod->words;
  VkShaderModule sm = VK_NULL_HANDLE;
  VkResult r = f.vkCreateShaderModule(device_, &smci, nullptr, &sm);
  if (r == VK_SUCCESS) {
    VkComputePipelineCreateInfo cpci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
    cpci.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO};
    cpci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    cpci.stage.module = sm;
    cpci.stage.pName = "main";
    cpci.layout = p.layout;
    r = f.vkCreateComputePipelines(device_, cache_, 1, &cpci, nullptr, &p.pipeline);
    f.vkDestroyShaderModule(device_, sm, nullptr);
  }
  if (r != VK_SUCCESS) {
    f.vkDestroyPipelineLayout(device_, p.layout, nullptr);
    f.vkDestroyDescriptorSetLayout(device_, p.set_layout, nullptr);
    return Error{fmt::format("cannot build shader {} on {}: {}", name, info_.name, result_name(r))};
  }
  auto [it, ok] = pipelines_.emplace(name, p);
  return &it->second;
}

size_t Device::max_binding_bytes() const {
  return static_cast<size_t>(info_.max_binding_bytes());
}

size_t Device::binding_alignment() const {
  return static_cast<size_t>(std::max<uint64_t>(info_.min_storage_buffer_alignment, 16));
}

Status Device::begin_if_needed() {
  if (recording_) return {};
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  if (Status s = check(f_->vkBeginCommandBuffer(cmd_, &bi), "vkBeginCommandBuffer"); !s.ok()) {
    return s;
  }
  recording_ = true;
  return {};
}

namespace {

void barrier(const Fns& f, VkCommandBuffer cmd) {
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                     VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  const VkPipelineStageFlags stages =
      VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
  f.vkCmdPipelineBarrier(cmd, stages, stages, 0, 1, &mb, 0, nullptr, 0, nullptr);
}

}  // namespace

Status Device::dispatch(const Pipeline& p, std::initializer_list<BufferRef> buffers,
                        const void* push, uint32_t gx, uint32_t gy, uint32_t gz) {
  if (buffers.size() != p.n_buffers) return Error{"dispatch: wrong number of buffers"};
  if (gx == 0 || gy == 0 || gz == 0) return {};
  if (desc_sets_left_ == 0) {
    if (Status s = sync(); !s.ok()) return s;  // resets the descriptor pool
  }
  if (Status s = begin_if_needed(); !s.ok()) return s;
  const Fns& f = *f_;
  VkDescriptorSetAllocateInfo dsai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
  dsai.descriptorPool = desc_pool_;
  dsai.descriptorSetCount = 1;
  dsai.pSetLayouts = &p.set_layout;
  VkDescriptorSet set = VK_NULL_HANDLE;
  if (Status s =
          check(f.vkAllocateDescriptorSets(device_, &dsai, &set), "vkAllocateDescriptorSets");
      !s.ok()) {
    return s;
  }
  --desc_sets_left_;
  VkDescriptorBufferInfo infos[kMaxBuffersPerSet];
  VkWriteDescriptorSet writes[kMaxBuffersPerSet];
  uint32_t i = 0;
  for (const BufferRef& b : buffers) {
    if (b.buffer == nullptr || !b.buffer->valid()) return Error{"dispatch: unset buffer"};
    // Size 0: to the end of the buffer, but never past what one binding may span.
    const size_t avail = b.buffer->alloc_size - b.offset;
    infos[i] = {b.buffer->buffer, b.offset,
                std::min(b.size == 0 ? avail : b.size, max_binding_bytes())};
    writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    writes[i].dstSet = set;
    writes[i].dstBinding = i;
    writes[i].descriptorCount = 1;
    writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    writes[i].pBufferInfo = &infos[i];
    ++i;
  }
  f.vkUpdateDescriptorSets(device_, i, writes, 0, nullptr);
  f.vkCmdBindPipeline(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline);
  f.vkCmdBindDescriptorSets(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, p.layout, 0, 1, &set, 0, nullptr);
  if (p.push_bytes > 0) {
    f.vkCmdPushConstants(cmd_, p.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, p.push_bytes, push);
  }
  f.vkCmdDispatch(cmd_, gx, gy, gz);
  barrier(f, cmd_);
  ++dispatches_;
  return {};
}

Status Device::copy(const Buffer& src, size_t src_offset, const Buffer& dst, size_t dst_offset,
                    size_t bytes) {
  if (bytes == 0) return {};
  if (Status s = begin_if_needed(); !s.ok()) return s;
  VkBufferCopy region{src_offset, dst_offset, bytes};
  f_->vkCmdCopyBuffer(cmd_, src.buffer, dst.buffer, 1, &region);
  barrier(*f_, cmd_);
  return {};
}

Status Device::sync() {
  if (!recording_) return {};
  const Fns& f = *f_;
  recording_ = false;
  if (Status s = check(f.vkEndCommandBuffer(cmd_), "vkEndCommandBuffer"); !s.ok()) return s;
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cmd_;
  if (Status s = check(f.vkQueueSubmit(queue_, 1, &si, fence_), "vkQueueSubmit"); !s.ok()) {
    return s;
  }
  if (Status s =
          check(f.vkWaitForFences(device_, 1, &fence_, VK_TRUE, UINT64_MAX), "vkWaitForFences");
      !s.ok()) {
    return s;
  }
  f.vkResetFences(device_, 1, &fence_);
  f.vkResetCommandBuffer(cmd_, 0);
  f.vkResetDescriptorPool(device_, desc_pool_, 0);
  desc_sets_left_ = kDescriptorSetsPerPool;
  return {};
}

}  // namespace bie::vk
