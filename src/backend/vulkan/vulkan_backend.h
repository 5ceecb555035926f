// VulkanBackend: the Backend on one Vulkan device. Weights are copied once into device-local
// buffers in their GGUF block formats (the shaders decode the blocks; no dequantised copy);
// activations and the KV pools live in device buffers. Operations are recorded into one
// command stream in program order (a barrier after each) and run when the host needs a result
// (download, synchronize) or when parameters must be uploaded. Buffers' host_ptr() is nullptr
// (even where the memory is mapped): the host reaches device memory only through
// upload()/download(), so no caller can read a result before the device has written it.
//
// Errors: the Backend operations return void, so the first failure (a shader that cannot be
// built, device memory exhausted, a device lost) is kept, later operations are skipped, and
// status() reports it; callers check status() after synchronize().
#pragma once

#include <array>
#include <memory>
#include <span>
#include <string>

#include "backend/vulkan/vk_context.h"
#include "bie/backend/backend.h"
#include "bie/backend/thread_pool.h"

namespace bie {

struct VulkanBackendOptions {
  int device_index = 0;
  int n_host_threads = 1;
  vk::DeviceOptions device;
  // > 0: bind weights in windows of at most this many bytes (tests use it to exercise the split
  // that weights larger than the device's maxStorageBufferRange take).
  size_t max_weight_window_bytes = 0;
  // > 0: hold each KV pool in buffers of at most this many bytes (whole blocks), below the
  // device's binding limit; the environment variable BIE_VULKAN_KV_PART_BYTES sets it for the
  // engine (tests and debugging: the split an 8 GB card's 64k pool takes, on small contexts).
  size_t max_kv_part_bytes = 0;
  // > 0: allocate no buffer larger than this (below the device's maxMemoryAllocationSize); the
  // environment variable BIE_VULKAN_MAX_BUFFER_BYTES sets it for the engine (tests: a small
  // model's weights in pieces, as an 8B model's are on most drivers).
  size_t max_buffer_bytes = 0;
};

class VulkanBackend final : public Backend {
 public:
  [[nodiscard]] static Result<std::unique_ptr<VulkanBackend>> create(const VulkanBackendOptions& o);
  ~VulkanBackend() override;

  [[nodiscard]] std::string name() const override;  // "vulkan:N"
  [[nodiscard]] ThreadPool& host_threads() override { return pool_; }
  [[nodiscard]] Status status() const override { return error_; }
  [[nodiscard]] vk::Device& device() { return *dev_; }
  [[nodiscard]] std::optional<DeviceMemoryInfo> device_memory() const override;
  [[nodiscard]] DeviceMemoryUse device_memory_use() const override;

  [[nodiscard]] Result<std::unique_ptr<DeviceBuffer>> alloc(size_t bytes) override;
  [[nodiscard]] Result<std::unique_ptr<DeviceBuffer>> upload_weights(
      std::span<const uint8_t> bytes) override;
  void upload(const Tensor& dst, const void* src) override;
  void download(const Tensor& src, void* dst) override;
  void synchronize() override;

  // F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K.
  [[nodiscard]] bool supports_weight_type(quant::GgmlType type) const override;
  void matmul(const Tensor& w, const Tensor& x, const Tensor& y, MatmulPath path) override;
  void get_rows(const Tensor& table, const Tensor& ids, const Tensor& out, float scale) override;
  void rms_norm(const Tensor& x, const Tensor& w, const Tensor& out, float eps) override;
  void add(const Tensor& x, const Tensor& y) override;
  void scale(const Tensor& x, float s) override;
  void silu_mul(const Tensor& gate, const Tensor& up) override;
  void gelu_mul(const Tensor& gate, const Tensor& up) override;
  void rope_cache(const RopeConfig& rope, const Tensor& pos, const Tensor& cs) override;
  void rope(const RopeConfig& rope, const Tensor& cs, const Tensor& x, int n_heads,
            int head_dim) override;
  void softcap(const Tensor& x, float cap) override;

  // KV pools of BIE's formats (the rows of f16, fp8_e4m3, int8, int4_asym g32/64/128; the tiles
  // of int4_channel and int8_channel), blocks byte-identical to the CPU's
  // (src/backend/vulkan/shaders/kv_codec.glsl), keys Hadamard-rotated or not (per-channel keys:
  // not); the rest is refused with an error naming it.
  [[nodiscard]] bool supports_paged_kv() const override { return true; }
  [[nodiscard]] uint64_t kv_pool_part_bytes() const override { return kv_part_bytes_; }
  [[nodiscard]] uint64_t max_buffer_bytes() const override { return max_buffer_bytes_; }
  [[nodiscard]] bool supports_kv_types(uint8_t k_type, uint8_t v_type) const override;
  [[nodiscard]] Status paged_attention(const AttnMetadata& meta) override;
  // Paged attention's splits: the shortest split of a token's context (a multiple of 64 keys;
  // default 256), and whether a pass whose partials fit the scratch may spread a token's splits
  // over several workgroups (default true; false: one workgroup per token). Tests lower the
  // first so that short contexts are split, and compare the two ways bit for bit.
  void set_attention_splits(int min_keys, bool split_pass) {
    attn_split_min_ = min_keys;
    attn_split_pass_ = split_pass;
  }
  // kv_write of whole per-channel key tiles with rotated keys rotates their rows into the
  // attention scratch, as many tiles per dispatch as it holds; tests cap that number (0: no cap)
  // so that a write takes several rounds.
  void set_rotated_tiles_per_round(size_t max_tiles) { rotated_tiles_max_ = max_tiles; }
  [[nodiscard]] Status kv_write(const KvWriteMetadata& meta) override;
  [[nodiscard]] Status copy_blocks(std::span<const KvPoolDesc> pools,
                                   std::span<const KvBlockCopy> copies) override;
  [[nodiscard]] Status quantise_blocks(std::span<const KvPoolDesc> pools,
                                       std::span<const KvBlockQuantise> moves,
                                       int n_layers_in_group, int n_head_kv, int head_dim,
                                       int block_size) override;

 private:
  VulkanBackend(std::unique_ptr<vk::Device> dev, const VulkanBackendOptions& o);
  // Rows of w per binding window (all of them when they fit).
  [[nodiscard]] int64_t rows_per_window(const Tensor& w) const;
  // Records a dispatch of shader `name`; keeps the first error.
  template <class Push>
  void run(const char* name, std::initializer_list<vk::BufferRef> bufs, const Push& push,
           uint32_t gx, uint32_t gy = 1, uint32_t gz = 1);
  void fail(const std::string& what);
  // a (and b) in the parameter ring, a host-visible buffer written front to back: bytes of the
  // ring are rewritten only after a wrap, and a wrap first runs everything recorded, so a ref
  // stays valid for dispatches recorded until the next params() call (take every parameter of a
  // dispatch from one call). Empty refs on failure (recorded in status()).
  [[nodiscard]] std::array<vk::BufferRef, 2> params(std::span<const uint8_t> a,
                                                    std::span<const uint8_t> b = {});

  std::unique_ptr<vk::Device> dev_;
  ThreadPool pool_;
  Status error_;
  vk::Buffer ring_;
  size_t ring_used_ = 0;
  size_t weight_window_bytes_ = 0;
  uint64_t kv_part_bytes_ = 0;
  uint64_t max_buffer_bytes_ = 0;
  uint32_t subgroup_size_ = 0;  // the device's reported subgroup size (matvec rows per group)
  // Paged attention's split pass: at most kAttnSplitsMax splits per token, each at least
  // attn_split_min_ keys, their partials in attn_scratch_ (planner::kDeviceAttnScratchBytes).
  static constexpr int kAttnSplitsMax = 32;
  int attn_split_min_ = 256;
  bool attn_split_pass_ = true;
  size_t rotated_tiles_max_ = 0;
  vk::Buffer attn_scratch_;
};

// The backend `cfg.device` ("vulkan", "vulkan:N") names; create_backend's Vulkan branch.
[[nodiscard]] Result<std::unique_ptr<Backend>> create_vulkan_backend(const BackendConfig& cfg);

}  // namespace bie
