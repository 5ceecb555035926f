// The Backend base class, the registry of built-in backends and the tensor helpers.
#include "bie/backend/backend.h"

#include <fmt/format.h>

#include <atomic>

#include "backend/cpu/cpu_backend.h"
#if BIE_HAVE_VULKAN
#include "backend/vulkan/vulkan_backend.h"
#endif
#include "bie/quant/types.h"

namespace bie {

namespace {

std::atomic<uint64_t> g_next_backend_id{1};

Status unsupported(const Backend& be, const char* op) {
  return Error{
      fmt::format("the {} backend has no {} (its KV storage lives on the host)", be.name(), op)};
}

}  // namespace

Backend::Backend() : id_(g_next_backend_id.fetch_add(1)) {}

Status Backend::paged_attention(const AttnMetadata& /*meta*/) {
  return unsupported(*this, "paged_attention");
}
Status Backend::kv_write(const KvWriteMetadata& /*meta*/) {
  return unsupported(*this, "kv_write");
}
int KvPoolDesc::n_parts() const {
  if (part_blocks <= 0) return 1;
  int n = 1;
  while (n < kMaxKvPoolParts && !more_parts[static_cast<size_t>(n - 1)].empty()) ++n;
  return n;
}

uint64_t Backend::max_kv_pool_bytes() const {
  const uint64_t part = kv_pool_part_bytes();
  return part > UINT64_MAX / kMaxKvPoolParts ? UINT64_MAX : part * kMaxKvPoolParts;
}

Status Backend::copy_blocks(std::span<const KvPoolDesc> /*pools*/,
                            std::span<const KvBlockCopy> /*copies*/) {
  return unsupported(*this, "copy_blocks");
}
Status Backend::quantise_blocks(std::span<const KvPoolDesc> /*pools*/,
                                std::span<const KvBlockQuantise> /*moves*/,
                                int /*n_layers_in_group*/, int /*n_head_kv*/, int /*head_dim*/,
                                int /*block_size*/) {
  return unsupported(*this, "quantise_blocks");
}

std::vector<std::string> available_devices() {
  return {"cpu"};
}

Result<std::unique_ptr<Backend>> create_backend(const BackendConfig& cfg) {
  if (cfg.n_threads < 0) return Error{fmt::format("threads must be >= 0 (got {})", cfg.n_threads)};
  if (cfg.device == "cpu") {
    return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(cfg.n_threads));
  }
#if BIE_HAVE_VULKAN
  if (cfg.device.rfind("vulkan", 0) == 0) return create_vulkan_backend(cfg);
#endif
  return Error{fmt::format("unknown device '{}' (available: {})", cfg.device,
                           fmt::join(available_devices(), ", "))};
}

Tensor tensor_of(DeviceBuffer& buf, quant::GgmlType type, int64_t rows, int64_t cols,
                 size_t offset) {
  Tensor t;
  t.buffer = &buf;
  t.offset = offset;
  t.type = type;
  t.rows = rows;
  t.cols = cols;
  size_t elem = 0;  // bytes per element of the non-block types
  if (type == quant::GgmlType::I32) elem = 4;
  if (type == quant::GgmlType::I8) elem = 1;
  t.row_bytes = elem != 0 ? elem * static_cast<size_t>(cols) : quant::row_size(type, cols);
  return t;
}

}  // namespace bie
