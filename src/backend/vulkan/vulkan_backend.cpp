#include "backend/vulkan/vulkan_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <span>
#include <tuple>
#include <vector>

#include "bie/backend/ops.h"
#include "bie/planner/kv_format.h"
#include "bie/planner/planner.h"
#include "bie/quant/types.h"

namespace bie {

namespace {

class VulkanBuffer final : public DeviceBuffer {
 public:
  VulkanBuffer(uint64_t backend_id, vk::Device& dev, vk::Buffer b)
      : DeviceBuffer(backend_id, b.size, nullptr), dev_(dev), buf_(b) {}
  ~VulkanBuffer() override { dev_.destroy(buf_); }
  [[nodiscard]] const vk::Buffer& buf() const { return buf_; }

 private:
  vk::Device& dev_;
  vk::Buffer buf_;
};

const vk::Buffer& vbuf(const Tensor& t) {
  return static_cast<const VulkanBuffer*>(t.buffer)->buf();
}
vk::BufferRef whole(const Tensor& t) {
  return vk::BufferRef{&vbuf(t)};
}
// Offsets and strides of F32 / I32 views in 4-byte elements.
uint32_t off4(const Tensor& t) {
  return static_cast<uint32_t>(t.offset / 4);
}
uint32_t stride4(const Tensor& t) {
  return static_cast<uint32_t>(t.row_bytes / 4);
}
// A small read-only view (a norm weight, a bias) that may lie anywhere in the model's weight
// buffer: bound from an aligned offset at or before it (a whole-buffer binding spans at most
// max_binding_bytes, and the data section of a large model is longer); *off4 is its first
// element within the binding.
vk::BufferRef near_ref(vk::Device& dev, const Tensor& t, uint32_t* off4) {
  if (t.offset + t.bytes() <= dev.max_binding_bytes()) {
    *off4 = static_cast<uint32_t>(t.offset / 4);
    return vk::BufferRef{&vbuf(t)};
  }
  const size_t align = dev.binding_alignment();
  const size_t bind = t.offset / align * align;
  *off4 = static_cast<uint32_t>((t.offset - bind) / 4);
  return vk::BufferRef{&vbuf(t), bind, (t.offset - bind + t.bytes() + 3) / 4 * 4};
}
uint32_t div_up(int64_t a, int64_t b) {
  return static_cast<uint32_t>((a + b - 1) / b);
}

std::string shader_type_suffix(quant::GgmlType type) {
  std::string s(quant::type_name(type));
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

bool gpu_weight_type(quant::GgmlType t) {
  using quant::GgmlType;
  switch (t) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q8_0:
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
      return true;
    default:
      return false;
  }
}

struct MatPush {
  uint32_t n_in, n_out, row_bytes, w_off, x_off, x_stride, y_off, y_stride, n_tokens;
};
struct RowsPush {
  uint32_t n_in, row_bytes, w_off, ids_off, y_off, y_stride;
  float scale;
};
struct NormPush {
  uint32_t rows, n, x_off, x_stride, w_off, y_off, y_stride;
  float eps;
};
struct BinPush {
  uint32_t rows, cols, x_off, x_stride, y_off, y_stride;
};
struct UnaryPush {
  uint32_t rows, cols, x_off, x_stride;
  float s;
};
struct RopePush {
  uint32_t n_tokens, n_heads, head_dim, n_rot, neox, x_off, x_stride, cs_off, cs_stride;
};
struct KvWritePush {
  uint32_t n_tokens, n_head_kv, head_dim, block_stride, head_stride, k_off, v_off, k_src_off,
      k_src_stride, v_src_off, v_src_stride;
};

}  // namespace

Result<std::unique_ptr<VulkanBackend>> VulkanBackend::create(const VulkanBackendOptions& o) {
  auto dev = vk::Device::open(o.device_index, o.device);
  if (!dev.ok()) return Error{dev.error()};
  if (!(*dev)->info().subgroup_arithmetic) {
    return Error{(*dev)->info().name +
                 ": no subgroup arithmetic in compute shaders (the matrix-vector kernels need it)"};
  }
  std::unique_ptr<VulkanBackend> be(new VulkanBackend(std::move(*dev), o));
  // Held from creation, so the device memory in use is the plan from the start
  // (planner::device_workspace_bytes counts it).
  auto scratch = be->dev_->create_buffer(planner::kDeviceAttnScratchBytes);
  if (!scratch.ok()) return Error{scratch.error()};
  be->attn_scratch_ = *scratch;
  return be;
}

VulkanBackend::VulkanBackend(std::unique_ptr<vk::Device> dev, const VulkanBackendOptions& o)
    : dev_(std::move(dev)), pool_(std::max(1, o.n_host_threads)) {
  weight_window_bytes_ = dev_->max_binding_bytes();
  subgroup_size_ = dev_->info().subgroup_size;
  if (o.max_weight_window_bytes > 0) {
    weight_window_bytes_ = std::min(weight_window_bytes_, o.max_weight_window_bytes);
  }
  max_buffer_bytes_ =
      dev_->info().max_buffer_bytes > 0 ? dev_->info().max_buffer_bytes : UINT64_MAX;
  if (o.max_buffer_bytes > 0) {
    max_buffer_bytes_ = std::min<uint64_t>(max_buffer_bytes_, o.max_buffer_bytes);
  }
  kv_part_bytes_ = std::min<uint64_t>(dev_->max_binding_bytes(), max_buffer_bytes_);
  if (o.max_kv_part_bytes > 0)
    kv_part_bytes_ = std::min<uint64_t>(kv_part_bytes_, o.max_kv_part_bytes);
}

VulkanBackend::~VulkanBackend() {
  (void)dev_->sync();
  dev_->destroy(ring_);
  dev_->destroy(attn_scratch_);
}

std::string VulkanBackend::name() const {
  return fmt::format("vulkan:{}", dev_->info().index);
}

bool VulkanBackend::supports_weight_type(quant::GgmlType type) const {
  return gpu_weight_type(type);
}

std::optional<DeviceMemoryInfo> VulkanBackend::device_memory() const {
  const GpuDeviceInfo& d = dev_->info();
  DeviceMemoryInfo m;
  m.device = fmt::format("{} ({})", name(), d.name);
  m.total = d.device_local_total();
  m.available = d.device_local_available();
  return m;
}

DeviceMemoryUse VulkanBackend::device_memory_use() const {
  DeviceMemoryUse u;
  u.bytes = dev_->device_bytes();
  u.alloc_bytes = dev_->device_alloc_bytes();
  u.peak_bytes = dev_->peak_device_bytes();
  u.buffers = dev_->device_buffers();
  u.host_bytes = dev_->host_alloc_bytes();
  return u;
}

void VulkanBackend::fail(const std::string& what) {
  if (error_.ok()) error_ = Error{what};
}

template <class Push>
void VulkanBackend::run(const char* name, std::initializer_list<vk::BufferRef> bufs,
                        const Push& push, uint32_t gx, uint32_t gy, uint32_t gz) {
  if (!error_.ok()) return;
  auto p = dev_->pipeline(name, static_cast<uint32_t>(bufs.size()), sizeof(Push));
  if (!p.ok()) return fail(p.error());
  if (Status s = dev_->dispatch(**p, bufs, &push, gx, gy, gz); !s.ok()) fail(s.error());
}

std::array<vk::BufferRef, 2> VulkanBackend::params(std::span<const uint8_t> a,
                                                   std::span<const uint8_t> b) {
  const size_t align = std::max<size_t>(dev_->binding_alignment(), 16);
  const auto up = [](size_t n, size_t k) { return (n + k - 1) / k * k; };
  const size_t na = up(std::max<size_t>(a.size(), 4), 16);
  const size_t nb = up(std::max<size_t>(b.size(), 4), 16);
  const size_t b_at = up(na, align);  // b's offset from a's
  const size_t need = b_at + nb;
  size_t off = up(ring_used_, align);
  if (!ring_.valid() || off + need > ring_.size) {
    // Wrap: everything recorded so far (which may read any byte of the ring) runs first.
    if (Status st = dev_->sync(); !st.ok()) {
      fail(st.error());
      return {vk::BufferRef{nullptr}, vk::BufferRef{nullptr}};
    }
    off = 0;
    if (!ring_.valid() || need > ring_.size) {
      dev_->destroy(ring_);
      auto r = dev_->create_host_buffer(std::max<size_t>(need * 2, size_t{4} << 20));
      if (!r.ok()) {
        fail(r.error());
        return {vk::BufferRef{nullptr}, vk::BufferRef{nullptr}};
      }
      ring_ = *r;
    }
  }
  auto* base = static_cast<uint8_t*>(ring_.mapped) + off;
  if (!a.empty()) std::memcpy(base, a.data(), a.size());
  if (!b.empty()) std::memcpy(base + b_at, b.data(), b.size());
  ring_used_ = off + need;
  return {vk::BufferRef{&ring_, off, na}, vk::BufferRef{&ring_, off + b_at, nb}};
}

// ---- memory -------------------------------------------------------------------------------------

Result<std::unique_ptr<DeviceBuffer>> VulkanBackend::alloc(size_t bytes) {
  auto b = dev_->create_buffer(bytes);
  if (!b.ok()) return Error{b.error()};
  return std::unique_ptr<DeviceBuffer>(std::make_unique<VulkanBuffer>(id(), *dev_, *b));
}

Result<std::unique_ptr<DeviceBuffer>> VulkanBackend::upload_weights(
    std::span<const uint8_t> bytes) {
  auto b = dev_->create_buffer(bytes.size());
  if (!b.ok()) return Error{b.error()};
  auto buf = std::make_unique<VulkanBuffer>(id(), *dev_, *b);
  if (Status s = dev_->upload(buf->buf(), 0, bytes.data(), bytes.size()); !s.ok()) {
    return Error{s.error()};
  }
  return std::unique_ptr<DeviceBuffer>(std::move(buf));
}

void VulkanBackend::upload(const Tensor& dst, const void* src) {
  if (!error_.ok() || dst.bytes() == 0) return;
  if (Status s = dev_->upload(vbuf(dst), dst.offset, src, dst.bytes()); !s.ok()) fail(s.error());
}

void VulkanBackend::download(const Tensor& src, void* dst) {
  if (!error_.ok() || src.bytes() == 0) return;
  if (Status s = dev_->download(vbuf(src), src.offset, dst, src.bytes()); !s.ok()) {
    fail(s.error());
  }
}

void VulkanBackend::synchronize() {
  if (!error_.ok()) return;
  if (Status s = dev_->sync(); !s.ok()) fail(s.error());
}

// ---- dense operations
// -----------------------------------------------------------------------------

// A weight view bound as a window of its buffer: rows [r0, r0 + n) start at byte w_off of a
// binding that begins at an aligned offset and spans at most max_binding_bytes() (Gemma 3's
// 262k-row embedding is larger than lavapipe's 128 MiB binding limit).
namespace {

struct WeightWindow {
  vk::BufferRef ref;
  uint32_t w_off;
};

WeightWindow weight_window(vk::Device& dev, const Tensor& w, int64_t r0, int64_t n) {
  const size_t align = dev.binding_alignment();
  const size_t byte0 = w.offset + static_cast<size_t>(r0) * w.row_bytes;
  const size_t bind = byte0 / align * align;
  const size_t span = byte0 - bind + static_cast<size_t>(n) * w.row_bytes;
  return WeightWindow{vk::BufferRef{&vbuf(w), bind, (span + 3) / 4 * 4},
                      static_cast<uint32_t>(byte0 - bind)};
}

}  // namespace

int64_t VulkanBackend::rows_per_window(const Tensor& w) const {
  const size_t room = weight_window_bytes_ - dev_->binding_alignment();
  return std::max<int64_t>(1, std::min<int64_t>(w.rows, static_cast<int64_t>(room / w.row_bytes)));
}

void VulkanBackend::matmul(const Tensor& w, const Tensor& x, const Tensor& y, MatmulPath path) {
  if (!gpu_weight_type(w.type)) {
    return fail(
        fmt::format("the Vulkan backend has no kernel for {} weights", quant::type_name(w.type)));
  }
  const int64_t n = x.rows;
  const bool vec = path == MatmulPath::kDecode || (path == MatmulPath::kAuto && n <= 4);
  const std::string name = (vec ? "matvec_" : "matmul_") + shader_type_suffix(w.type);
  const int64_t chunk = rows_per_window(w);
  for (int64_t r0 = 0; r0 < w.rows; r0 += chunk) {
    const int64_t rows = std::min(chunk, w.rows - r0);
    const WeightWindow win = weight_window(*dev_, w, r0, rows);
    MatPush p{static_cast<uint32_t>(w.cols),
              static_cast<uint32_t>(rows),
              static_cast<uint32_t>(w.row_bytes),
              win.w_off,
              off4(x),
              stride4(x),
              off4(y) + static_cast<uint32_t>(r0),
              stride4(y),
              static_cast<uint32_t>(n)};
    if (vec) {
      // One subgroup per row: as many rows per 64-lane workgroup as it has subgroups.
      const uint32_t per = std::max<uint32_t>(1, 64 / std::max<uint32_t>(1, subgroup_size_));
      const int64_t groups = div_up(rows, per);
      const auto gx = static_cast<uint32_t>(std::min<int64_t>(groups, 32768));
      struct {
        uint32_t a[10];
      } mv{{p.n_in, p.n_out, p.row_bytes, p.w_off, p.x_off, p.x_stride, p.y_off, p.y_stride, per,
            static_cast<uint32_t>(n)}};
      run(name.c_str(), {win.ref, whole(x), whole(y)}, mv, gx, div_up(n, 8), div_up(groups, gx));
    } else {
      run(name.c_str(), {win.ref, whole(x), whole(y)}, p, div_up(rows, 32), div_up(n, 32));
    }
  }
}

void VulkanBackend::get_rows(const Tensor& table, const Tensor& ids, const Tensor& out,
                             float scale) {
  if (!gpu_weight_type(table.type)) {
    return fail(
        fmt::format("the Vulkan backend cannot gather {} rows", quant::type_name(table.type)));
  }
  const std::string name = "get_rows_" + shader_type_suffix(table.type);
  const int64_t n = ids.rows * ids.cols;
  const uint32_t gx = std::min<uint32_t>(div_up(table.cols, 64), 64);
  if (rows_per_window(table) >= table.rows) {
    const WeightWindow win = weight_window(*dev_, table, 0, table.rows);
    RowsPush p{static_cast<uint32_t>(table.cols),
               static_cast<uint32_t>(table.row_bytes),
               win.w_off,
               off4(ids),
               off4(out),
               stride4(out),
               scale};
    run(name.c_str(), {win.ref, whole(ids), whole(out)}, p, gx, static_cast<uint32_t>(n));
    return;
  }
  // A table larger than one binding: each token's row through its own window (ids are read back
  // first; embedding lookups are a few hundred rows per step at most).
  std::vector<int32_t> host_ids(static_cast<size_t>(n));
  download(ids, host_ids.data());
  const int32_t zero = 0;
  const vk::BufferRef zero_id = params({reinterpret_cast<const uint8_t*>(&zero), sizeof zero})[0];
  if (zero_id.buffer == nullptr) return;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = host_ids[static_cast<size_t>(i)];
    if (id < 0 || id >= table.rows)
      return fail(fmt::format("get_rows: token id {} out of range", id));
    const WeightWindow win = weight_window(*dev_, table, id, 1);
    RowsPush p{static_cast<uint32_t>(table.cols),
               static_cast<uint32_t>(table.row_bytes),
               win.w_off,
               0u,
               off4(out) + static_cast<uint32_t>(i) * stride4(out),
               0u,
               scale};
    run(name.c_str(), {win.ref, zero_id, whole(out)}, p, gx, 1);
  }
}

void VulkanBackend::rms_norm(const Tensor& x, const Tensor& w, const Tensor& out, float eps) {
  uint32_t w_off = 0;
  const vk::BufferRef wref = near_ref(*dev_, w, &w_off);
  NormPush p{static_cast<uint32_t>(x.rows),
             static_cast<uint32_t>(x.cols),
             off4(x),
             stride4(x),
             w_off,
             off4(out),
             stride4(out),
             eps};
  const auto gx = static_cast<uint32_t>(std::min<int64_t>(x.rows, 65535));
  run("rms_norm", {whole(x), wref, whole(out)}, p, gx, div_up(x.rows, gx));
}

void VulkanBackend::add(const Tensor& x, const Tensor& y) {
  uint32_t y_off = 0;
  const vk::BufferRef yref = near_ref(*dev_, y, &y_off);  // y may be a bias in the weights
  BinPush p{
      static_cast<uint32_t>(x.rows), static_cast<uint32_t>(x.cols), off4(x), stride4(x), y_off,
      y.rows == 1 ? 0u : stride4(y)};
  run("add", {whole(x), yref}, p, div_up(x.cols, 256), static_cast<uint32_t>(x.rows));
}

void VulkanBackend::scale(const Tensor& x, float s) {
  UnaryPush p{static_cast<uint32_t>(x.rows), static_cast<uint32_t>(x.cols), off4(x), stride4(x), s};
  run("scale", {whole(x)}, p, div_up(x.cols, 256), static_cast<uint32_t>(x.rows));
}

void VulkanBackend::softcap(const Tensor& x, float cap) {
  UnaryPush p{static_cast<uint32_t>(x.rows), static_cast<uint32_t>(x.cols), off4(x), stride4(x),
              cap};
  run("softcap", {whole(x)}, p, div_up(x.cols, 256), static_cast<uint32_t>(x.rows));
}

void VulkanBackend::silu_mul(const Tensor& gate, const Tensor& up) {
  BinPush p{static_cast<uint32_t>(gate.rows),
            static_cast<uint32_t>(gate.cols),
            off4(gate),
            stride4(gate),
            off4(up),
            stride4(up)};
  run("silu_mul", {whole(gate), whole(up)}, p, div_up(gate.cols, 256),
      static_cast<uint32_t>(gate.rows));
}

void VulkanBackend::gelu_mul(const Tensor& gate, const Tensor& up) {
  BinPush p{static_cast<uint32_t>(gate.rows),
            static_cast<uint32_t>(gate.cols),
            off4(gate),
            stride4(gate),
            off4(up),
            stride4(up)};
  run("gelu_mul", {whole(gate), whole(up)}, p, div_up(gate.cols, 256),
      static_cast<uint32_t>(gate.rows));
}

void VulkanBackend::rope_cache(const RopeConfig& rope, const Tensor& pos, const Tensor& cs) {
  // The angles are computed on the host with the CPU's code (ops::rope_cache), so they match the
  // CPU backend bit for bit; the table is tokens x n_rot floats, small next to a layer's work.
  if (!error_.ok()) return;
  std::vector<int32_t> ps(static_cast<size_t>(pos.rows * pos.cols));
  download(pos, ps.data());
  std::vector<float> ff;
  ops::RopeParams p;
  p.n_rot = rope.n_rot;
  p.freq_base = rope.freq_base;
  p.freq_scale = rope.freq_scale;
  p.neox = rope.neox;
  if (!rope.freq_factors.empty()) {
    ff.resize(static_cast<size_t>(rope.freq_factors.rows * rope.freq_factors.cols));
    download(rope.freq_factors, ff.data());
    p.freq_factors = ff.data();
  }
  const size_t stride = cs.row_bytes / 4;
  std::vector<float> table(static_cast<size_t>(cs.rows) * stride, 0.0f);
  for (int64_t i = 0; i < cs.rows; ++i)
    ops::rope_cache(p, ps[static_cast<size_t>(i)], &table[i * stride]);
  upload(cs, table.data());
}

void VulkanBackend::rope(const RopeConfig& rope, const Tensor& cs, const Tensor& x, int n_heads,
                         int head_dim) {
  RopePush p{static_cast<uint32_t>(x.rows),
             static_cast<uint32_t>(n_heads),
             static_cast<uint32_t>(head_dim),
             static_cast<uint32_t>(rope.n_rot),
             rope.neox ? 1u : 0u,
             off4(x),
             stride4(x),
             off4(cs),
             stride4(cs)};
  run("rope", {whole(x), whole(cs)}, p, div_up(rope.n_rot / 2, 64), static_cast<uint32_t>(n_heads),
      static_cast<uint32_t>(x.rows));
}

// ---- KV data path
// -----------------------------------------------------------------------------------

namespace {

using planner::KvType;

// The KV formats the device kernels read and write (kv_codec.glsl): the per-token row formats and
// the per-channel tiles (int4_channel, int8_channel), keys Hadamard-rotated or not (a per-channel
// tile's rows are rotated before its channels are fitted, as on the CPU).
bool device_kv_type(uint8_t t) {
  switch (static_cast<KvType>(t)) {
    case KvType::kF16:
    case KvType::kFp8E4M3:
    case KvType::kInt8:
    case KvType::kInt4Asym:
    case KvType::kInt4Channel:
    case KvType::kInt8Channel:
      return true;
    default:
      return false;
  }
}

bool is_f16(uint8_t t) {
  return static_cast<KvType>(t) == KvType::kF16;
}

bool is_chan(uint8_t t) {
  return planner::is_per_channel(static_cast<KvType>(t));
}

// Bytes of one tile of `block_size` rows: a per-token format stores exactly the planner's bytes per
// head-token in each row; a per-channel tile (its group is the block) holds every channel's
// metadata once, then the rows' codes (kv_row_offset in kv_codec.glsl is the shaders' copy).
size_t kv_tile_bytes(uint8_t type, int d, int g, int block_size) {
  const planner::KvFormatSpec& s = planner::kv_format_spec(static_cast<KvType>(type));
  const auto dd = static_cast<size_t>(d);
  if (is_chan(type)) {
    return dd * static_cast<size_t>(s.group_meta_bytes) +
           static_cast<size_t>(block_size) * dd * static_cast<size_t>(s.value_bits) / 8;
  }
  return static_cast<size_t>(block_size) * static_cast<size_t>(planner::bytes_per_head_token(
                                               planner::KvFormat{static_cast<KvType>(type), g}, d));
}

Status check_pool(const KvPoolDesc& pool, int block_size, int head_dim) {
  if (!device_kv_type(pool.k_type) || !device_kv_type(pool.v_type)) {
    return Error{fmt::format(
        "the Vulkan backend runs f16, fp8_e4m3, int8, int4_asym, int4_channel and int8_channel "
        "KV pools only (not K type {} / V type {}; use --kv-cache-dtype f16, or --device cpu)",
        pool.k_type, pool.v_type)};
  }
  for (const auto& [type, group, tile] :
       {std::tuple{pool.k_type, pool.k_group, pool.k_tile_bytes},
        std::tuple{pool.v_type, pool.v_group, pool.v_tile_bytes}}) {
    const bool int4 = static_cast<KvType>(type) == KvType::kInt4Asym;
    if (int4 && (group != 32 && group != 64 && group != 128)) {
      return Error{fmt::format("vulkan: int4_asym group {} (32, 64 or 128)", group)};
    }
    // A per-channel tile spans the block; its codes are written four channels (int4_channel:
    // with their partners d/2 apart) to a 32-bit word.
    if (is_chan(type) && (group != block_size || head_dim % 8 != 0)) {
      return Error{
          fmt::format("vulkan: a per-channel KV tile of {} tokens in blocks of {}, head "
                      "width {} (the block and a multiple of 8)",
                      group, block_size, head_dim)};
    }
    if ((int4 && head_dim % group != 0) ||
        tile != kv_tile_bytes(type, head_dim, group, block_size)) {
      return Error{"vulkan: unexpected KV tile layout"};
    }
  }
  for (int i = 1; i < pool.n_parts(); ++i) {
    if (pool.part(i).row_bytes != pool.memory.row_bytes ||
        pool.part(i).offset != pool.memory.offset) {
      return Error{"vulkan: the parts of a KV pool differ in layout"};
    }
  }
  if (pool.memory.row_bytes % 4 != 0 || pool.memory.offset % 4 != 0 || head_dim % 4 != 0 ||
      pool.k_tile_bytes % 4 != 0 || pool.v_tile_bytes % 4 != 0) {
    return Error{"vulkan: unexpected KV tile layout"};
  }
  return {};
}

// Byte offset of layer `layer`'s first K tile in block 0 of a pool.
size_t layer_base(const KvPoolDesc& pool, int layer, int n_head_kv) {
  return pool.memory.offset + static_cast<size_t>(layer) * static_cast<size_t>(n_head_kv) *
                                  (pool.k_tile_bytes + pool.v_tile_bytes);
}

struct KvWriteQPush {
  uint32_t n_slots, n_head_kv, head_dim, block_bytes, k_tile, v_tile, k_base, k_type, v_type,
      k_group, v_group, round_fp16, k_src_off, k_src_stride, v_src_off, v_src_stride, rotate_k;
  float rot_norm;
};
struct AttnKvPush {
  uint32_t n_tokens, n_head, group, head_dim, block_size, n_head_kv, window;
  float scale;
  uint32_t q_off, q_stride, o_off, o_stride, rotate;
  float rot_norm;
  uint32_t heads_per_wg, head_chunks, n_split_max, split_min, split_wg;
};
struct SplitMergePush {
  uint32_t n_tokens, n_head, head_dim, window, n_split_max, split_min, o_off, o_stride;
};

// kv::hadamard_rotate's normalisation, computed as the CPU computes it.
float rotation_norm(int head_dim) {
  return 1.0f / std::sqrt(static_cast<float>(head_dim));
}
struct QuantisePush {
  uint32_t n_layers, n_head_kv, head_dim, block_size, src_block_bytes, src_base, dst_block_bytes,
      dst_k_tile, dst_v_tile, dst_base, k_type, v_type, k_group, v_group;
};
// kv_rotate.comp: the K rows of whole per-channel tiles, rotated into a scratch.
struct RotatePush {
  uint32_t n_jobs, n_head_kv, head_dim, block_size, k_off, k_stride;
  float rot_norm;
};
// kv_chan.comp: per-channel tiles from an fp16 pool (src_kind 0) or from F32 rows (1).
struct ChanPush {
  uint32_t n_layers, n_head_kv, head_dim, block_size, k_type, v_type, src_kind, round_fp16,
      src_block_bytes, src_base, k_off, k_stride, v_off, v_stride, dst_block_bytes, dst_k_tile,
      dst_v_tile, dst_base;
};

std::span<const uint8_t> bytes_of(const std::vector<int32_t>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(int32_t)};
}

}  // namespace

bool VulkanBackend::supports_kv_types(uint8_t k_type, uint8_t v_type) const {
  return device_kv_type(k_type) && device_kv_type(v_type);
}

Status VulkanBackend::paged_attention(const AttnMetadata& m) {
  if (!error_.ok()) return error_;
  if (m.head_dim > 512) return Error{"vulkan attention: head_dim above 512"};
  if (m.rotate_keys && (m.head_dim & (m.head_dim - 1)) != 0) {
    return Error{"vulkan attention: rotated keys need a power-of-two head_dim"};
  }
  const size_t n_seq = m.q_pos0.size();
  if (n_seq == 0) return {};
  // Pool slots of the shader: the pools that hold blocks, in the order the table first names
  // them (at most two: a mixed layout's FP16 and body pools). Entries of a pool without memory
  // are dropped blocks (never read).
  std::array<int, 2> slot_pool = {-1, -1};
  int n_slots = 0;
  for (const KvBlockRef& r : m.block_table) {
    if (r.pool == slot_pool[0] || r.pool == slot_pool[1]) continue;
    if (m.pools[static_cast<size_t>(r.pool)].memory.empty()) continue;
    if (n_slots == 2) return Error{"vulkan attention: a batch over more than two KV pools"};
    slot_pool[static_cast<size_t>(n_slots++)] = r.pool;
  }
  if (n_slots == 0) slot_pool[0] = m.block_table.empty() ? 0 : m.block_table[0].pool;
  for (int s = 0; s < std::max(n_slots, 1); ++s) {
    const KvPoolDesc& pool = m.pools[static_cast<size_t>(slot_pool[static_cast<size_t>(s)])];
    if (Status st = check_pool(pool, m.block_size, m.head_dim); !st.ok()) return st;
  }
  const KvPoolDesc& pool0 = m.pools[static_cast<size_t>(slot_pool[0])];
  if (pool0.memory.empty()) return Error{"vulkan attention: no KV pool holds the table's blocks"};
  const int64_t n_tokens = m.query_start[n_seq];
  // meta: the pool slots' descriptors, then [t] sequence, [n_tokens + t] position,
  // [2 n_tokens + s] first table entry of s.
  constexpr size_t head = 16;
  std::vector<int32_t> meta(head + static_cast<size_t>(2 * n_tokens) + n_seq, 0);
  for (int s = 0; s < std::max(n_slots, 1); ++s) {
    const KvPoolDesc& pool = m.pools[static_cast<size_t>(slot_pool[static_cast<size_t>(s)])];
    const int32_t d[8] = {pool.k_type,
                          pool.v_type,
                          pool.k_group,
                          pool.v_group,
                          static_cast<int32_t>(pool.memory.row_bytes),
                          static_cast<int32_t>(pool.k_tile_bytes),
                          static_cast<int32_t>(pool.v_tile_bytes),
                          static_cast<int32_t>(layer_base(pool, m.layer_in_group, m.n_head_kv))};
    std::copy(d, d + 8, meta.begin() + 8 * s);
  }
  // The split grid of the longest context (attn_split.glsl's split_grid): how many workgroups
  // the split pass gives its token.
  int64_t max_splits = 1;
  for (size_t s = 0; s < n_seq; ++s) {
    for (int32_t t = m.query_start[s]; t < m.query_start[s + 1]; ++t) {
      const int64_t pos = m.q_pos0[s] + (t - m.query_start[s]);
      meta[head + static_cast<size_t>(t)] = static_cast<int32_t>(s);
      meta[head + static_cast<size_t>(n_tokens + t)] = static_cast<int32_t>(pos);
      const int64_t first = m.window > 0 ? std::max<int64_t>(0, pos - m.window + 1) : 0;
      const int64_t span = pos - first + 1;
      const int64_t per = (span + kAttnSplitsMax - 1) / kAttnSplitsMax;
      const int64_t len = std::max<int64_t>(attn_split_min_, (per + 63) / 64 * 64);
      max_splits = std::max(max_splits, (span + len - 1) / len);
    }
    meta[head + static_cast<size_t>(2 * n_tokens) + s] = m.block_table_start[s];
  }
  std::vector<int32_t> table(m.block_table.size() + 1, 0);
  for (size_t i = 0; i < m.block_table.size(); ++i) {
    const KvBlockRef& r = m.block_table[i];
    const int32_t slot = r.pool == slot_pool[1] ? 1 : 0;
    const auto [part, blk] = m.pools[static_cast<size_t>(r.pool)].locate(r.block);
    table[i] = blk * 8 + slot * kMaxKvPoolParts + part;
  }
  // One ring allocation for both (a wrap between two could let later parameters overwrite the
  // first before the dispatch runs).
  const auto [tb, mb] = params(bytes_of(table), bytes_of(meta));
  if (tb.buffer == nullptr || mb.buffer == nullptr) return error_;
  // Each slot's parts; a part a pool does not have is bound to its first (never read).
  static_assert(kMaxKvPoolParts == 4, "attn_paged_kv.comp binds four parts per pool slot");
  std::array<vk::BufferRef, 2 * kMaxKvPoolParts> pb{};
  for (int s = 0; s < 2; ++s) {
    const KvPoolDesc& pool =
        s < n_slots ? m.pools[static_cast<size_t>(slot_pool[static_cast<size_t>(s)])] : pool0;
    for (int i = 0; i < kMaxKvPoolParts; ++i) {
      pb[static_cast<size_t>(s * kMaxKvPoolParts + i)] =
          vk::BufferRef{&vbuf(pool.part(i < pool.n_parts() ? i : 0))};
    }
  }
  // GQA: a workgroup serves up to 8 query heads of one KV head (its registers hold
  // heads x ceil(head_dim / 64) <= 16 output values per lane).
  const int group = m.n_head / m.n_head_kv;
  const int per_lane = (m.head_dim + 63) / 64;
  const int heads_per_wg = std::min({group, 8, 16 / per_lane});
  const int head_chunks = (group + heads_per_wg - 1) / heads_per_wg;
  // The split pass when a token's context spans several splits and the partials fit the
  // scratch: a decode step's few tokens then fill the device with n_head_kv x splits workgroups.
  const uint64_t part_bytes = static_cast<uint64_t>(n_tokens) * m.n_head * kAttnSplitsMax *
                              (m.head_dim + 2) * sizeof(float);
  const bool split_wg = attn_split_pass_ && max_splits > 1 && part_bytes <= attn_scratch_.size;
  AttnKvPush p{static_cast<uint32_t>(n_tokens),
               static_cast<uint32_t>(m.n_head),
               static_cast<uint32_t>(group),
               static_cast<uint32_t>(m.head_dim),
               static_cast<uint32_t>(m.block_size),
               static_cast<uint32_t>(m.n_head_kv),
               static_cast<uint32_t>(m.window),
               m.scale,
               off4(m.q),
               stride4(m.q),
               off4(m.out),
               stride4(m.out),
               m.rotate_keys ? 1u : 0u,
               rotation_norm(m.head_dim),
               static_cast<uint32_t>(heads_per_wg),
               static_cast<uint32_t>(head_chunks),
               static_cast<uint32_t>(kAttnSplitsMax),
               static_cast<uint32_t>(attn_split_min_),
               split_wg ? 1u : 0u};
  const vk::BufferRef scratch{&attn_scratch_};
  run("attn_paged_kv",
      {whole(m.q), pb[0], pb[1], pb[2], pb[3], pb[4], pb[5], pb[6], pb[7], tb, mb, whole(m.out),
       scratch},
      p, static_cast<uint32_t>(n_tokens), static_cast<uint32_t>(m.n_head_kv * head_chunks),
      split_wg ? static_cast<uint32_t>(max_splits) : 1u);
  if (split_wg) {
    const SplitMergePush mp{static_cast<uint32_t>(n_tokens),
                            static_cast<uint32_t>(m.n_head),
                            static_cast<uint32_t>(m.head_dim),
                            static_cast<uint32_t>(m.window),
                            static_cast<uint32_t>(kAttnSplitsMax),
                            static_cast<uint32_t>(attn_split_min_),
                            off4(m.out),
                            stride4(m.out)};
    run("attn_split_merge", {scratch, mb, whole(m.out)}, mp, static_cast<uint32_t>(n_tokens),
        static_cast<uint32_t>(m.n_head));
  }
  return error_;
}

Status VulkanBackend::kv_write(const KvWriteMetadata& m) {
  if (!error_.ok()) return error_;
  if (m.rotate_keys && (m.head_dim > 512 || (m.head_dim & (m.head_dim - 1)) != 0)) {
    return Error{"vulkan kv_write: rotated keys need a power-of-two head_dim up to 512"};
  }
  // Rotated per-channel keys pass through the attention scratch a round of whole tiles at a time
  // (below); a scratch too small for one tile is refused before anything is written.
  const size_t rotate_row_bytes = static_cast<size_t>(m.n_head_kv) * m.head_dim * sizeof(float);
  size_t rotate_per_round =
      attn_scratch_.size / (rotate_row_bytes * static_cast<size_t>(m.block_size));
  if (rotated_tiles_max_ > 0) rotate_per_round = std::min(rotate_per_round, rotated_tiles_max_);
  if (m.rotate_keys && rotate_per_round == 0) {
    for (const KvSlot& sl : m.slots) {
      if (is_chan(m.pools[static_cast<size_t>(sl.block.pool)].k_type)) {
        return Error{"vulkan kv_write: a rotated per-channel key tile exceeds the device scratch"};
      }
    }
  }
  const size_t n_all = m.slots.size();
  // One dispatch per pool part the slots name (a prefill in a mixed layout writes FP16 and body
  // blocks); each slot carries its source token.
  const auto part_key = [&](const KvSlot& sl) {
    const KvPoolDesc& pool = m.pools[static_cast<size_t>(sl.block.pool)];
    return static_cast<size_t>(sl.block.pool) * kMaxKvPoolParts +
           static_cast<size_t>(pool.locate(sl.block.block).first);
  };
  std::vector<bool> done(m.pools.size() * kMaxKvPoolParts, false);
  for (const KvSlot& first : m.slots) {
    const size_t key = part_key(first);
    if (done[key]) continue;
    done[key] = true;
    const KvPoolDesc& pool = m.pools[static_cast<size_t>(first.block.pool)];
    if (Status s = check_pool(pool, m.block_size, m.head_dim); !s.ok()) return s;
    const int part = pool.locate(first.block.block).first;
    if (part >= pool.n_parts() || pool.part(part).empty()) {
      return Error{"vulkan kv_write: a slot in a pool without memory"};
    }
    std::vector<int32_t> blk, row, tok;
    for (size_t i = 0; i < n_all; ++i) {
      if (part_key(m.slots[i]) != key) continue;
      blk.push_back(pool.locate(m.slots[i].block.block).second);
      row.push_back(m.slots[i].row);
      tok.push_back(static_cast<int32_t>(i));
    }
    const size_t n = blk.size();
    // Per-channel tiles are written whole (their scales span the block), as PagedKvStore::store
    // writes them: every block the slots name must get rows 0 .. B-1 from consecutive tokens.
    const int B = m.block_size;
    const bool chan = is_chan(pool.k_type) || is_chan(pool.v_type);
    std::vector<int32_t> jobs;  // (block, first token)
    for (size_t i = 0; chan && i < n;) {
      bool whole_tile = row[i] == 0 && i + static_cast<size_t>(B) <= n;
      for (int r = 1; whole_tile && r < B; ++r) {
        const size_t k = i + static_cast<size_t>(r);
        whole_tile = blk[k] == blk[i] && row[k] == r && tok[k] == tok[i] + r;
      }
      if (!whole_tile) {
        return Error{fmt::format(
            "vulkan kv_write: a per-channel KV tile is written whole; block {} gets row {} alone",
            blk[i], row[i])};
      }
      jobs.insert(jobs.end(), {blk[i], tok[i]});
      i += static_cast<size_t>(B);
    }
    std::vector<int32_t> slot(blk);
    slot.insert(slot.end(), row.begin(), row.end());
    slot.insert(slot.end(), tok.begin(), tok.end());
    const vk::BufferRef sb = params(bytes_of(slot))[0];
    if (sb.buffer == nullptr) return error_;
    const size_t base = layer_base(pool, m.layer_in_group, m.n_head_kv);
    const vk::BufferRef pool_ref{&vbuf(pool.part(part))};
    if (is_f16(pool.k_type) && is_f16(pool.v_type) && !pool.round_rows_to_fp16 && !m.rotate_keys) {
      KvWritePush p{static_cast<uint32_t>(n),
                    static_cast<uint32_t>(m.n_head_kv),
                    static_cast<uint32_t>(m.head_dim),
                    static_cast<uint32_t>(pool.memory.row_bytes / 2),
                    static_cast<uint32_t>(pool.k_tile_bytes / 2),
                    static_cast<uint32_t>(base / 2),
                    static_cast<uint32_t>((base + m.n_head_kv * pool.k_tile_bytes) / 2),
                    off4(m.k),
                    stride4(m.k),
                    off4(m.v),
                    stride4(m.v)};
      run("kv_write_f16", {whole(m.k), whole(m.v), sb, pool_ref}, p,
          div_up(m.n_head_kv * m.head_dim / 2, 64), static_cast<uint32_t>(n));
      continue;
    }
    KvWriteQPush p{static_cast<uint32_t>(n),
                   static_cast<uint32_t>(m.n_head_kv),
                   static_cast<uint32_t>(m.head_dim),
                   static_cast<uint32_t>(pool.memory.row_bytes),
                   static_cast<uint32_t>(pool.k_tile_bytes),
                   static_cast<uint32_t>(pool.v_tile_bytes),
                   static_cast<uint32_t>(base),
                   pool.k_type,
                   pool.v_type,
                   static_cast<uint32_t>(pool.k_group),
                   static_cast<uint32_t>(pool.v_group),
                   pool.round_rows_to_fp16 ? 1u : 0u,
                   off4(m.k),
                   stride4(m.k),
                   off4(m.v),
                   stride4(m.v),
                   m.rotate_keys ? 1u : 0u,
                   rotation_norm(m.head_dim)};
    const int64_t groups = div_up(static_cast<int64_t>(n) * 2 * m.n_head_kv, 64);
    const auto gx = static_cast<uint32_t>(std::min<int64_t>(groups, 32768));
    run("kv_write_q", {whole(m.k), whole(m.v), sb, pool_ref}, p, gx, div_up(groups, gx));
    if (!chan) continue;
    ChanPush c{1u,
               static_cast<uint32_t>(m.n_head_kv),
               static_cast<uint32_t>(m.head_dim),
               static_cast<uint32_t>(B),
               pool.k_type,
               pool.v_type,
               1u,
               pool.round_rows_to_fp16 ? 1u : 0u,
               0u,
               0u,
               off4(m.k),
               stride4(m.k),
               off4(m.v),
               stride4(m.v),
               static_cast<uint32_t>(pool.memory.row_bytes),
               static_cast<uint32_t>(pool.k_tile_bytes),
               static_cast<uint32_t>(pool.v_tile_bytes),
               static_cast<uint32_t>(base)};
    const auto chan_dispatch = [&](const std::vector<int32_t>& chan_jobs, vk::BufferRef k_rows) {
      const vk::BufferRef jb = params(bytes_of(chan_jobs))[0];
      if (jb.buffer == nullptr) return;
      run("kv_chan", {k_rows, k_rows, whole(m.v), jb, pool_ref}, c,
          div_up(2 * m.n_head_kv * (m.head_dim / 4), 64),
          static_cast<uint32_t>(chan_jobs.size() / 2));
    };
    if (!(m.rotate_keys && is_chan(pool.k_type))) {
      chan_dispatch(jobs, whole(m.k));
      continue;
    }
    // Rotated per-channel keys: the tiles' K rows are rotated into the attention scratch (free
    // between attention passes; every dispatch ends in a barrier), as many tiles at a time as it
    // holds (checked non-zero above), and kv_chan fits the channels over those rows.
    const size_t per_batch = rotate_per_round;
    c.k_off = 0;
    c.k_stride = static_cast<uint32_t>(m.n_head_kv * m.head_dim);
    const vk::BufferRef scratch{&attn_scratch_};
    for (size_t j0 = 0; j0 < jobs.size() / 2; j0 += per_batch) {
      const size_t nj = std::min(per_batch, jobs.size() / 2 - j0);
      const std::vector<int32_t> batch(jobs.begin() + static_cast<ptrdiff_t>(2 * j0),
                                       jobs.begin() + static_cast<ptrdiff_t>(2 * (j0 + nj)));
      std::vector<int32_t> local(batch);  // the same tiles, their rows now in the scratch
      for (size_t j = 0; j < nj; ++j) local[2 * j + 1] = static_cast<int32_t>(j) * B;
      const vk::BufferRef src_jobs = params(bytes_of(batch))[0];
      if (src_jobs.buffer == nullptr) return error_;
      const RotatePush rp{static_cast<uint32_t>(nj),
                          static_cast<uint32_t>(m.n_head_kv),
                          static_cast<uint32_t>(m.head_dim),
                          static_cast<uint32_t>(B),
                          off4(m.k),
                          stride4(m.k),
                          rotation_norm(m.head_dim)};
      const int64_t groups = div_up(static_cast<int64_t>(nj) * B * m.n_head_kv, 64);
      const auto gx = static_cast<uint32_t>(std::min<int64_t>(groups, 32768));
      run("kv_rotate", {whole(m.k), src_jobs, scratch}, rp, gx, div_up(groups, gx));
      chan_dispatch(local, scratch);
    }
  }
  return error_;
}

Status VulkanBackend::quantise_blocks(std::span<const KvPoolDesc> pools,
                                      std::span<const KvBlockQuantise> moves, int n_layers_in_group,
                                      int n_head_kv, int head_dim, int block_size) {
  if (!error_.ok()) return error_;
  // One dispatch per (source pool part, destination pool part) pair.
  const auto parts_of = [&](const KvBlockQuantise& mv) {
    return std::pair{pools[static_cast<size_t>(mv.src.pool)].locate(mv.src.block).first +
                         kMaxKvPoolParts * mv.src.pool,
                     pools[static_cast<size_t>(mv.dst.pool)].locate(mv.dst.block).first +
                         kMaxKvPoolParts * mv.dst.pool};
  };
  std::vector<bool> done(moves.size(), false);
  for (size_t i = 0; i < moves.size(); ++i) {
    if (done[i]) continue;
    const KvPoolDesc& src = pools[static_cast<size_t>(moves[i].src.pool)];
    const KvPoolDesc& dst = pools[static_cast<size_t>(moves[i].dst.pool)];
    const Tensor& src_part = src.part(src.locate(moves[i].src.block).first);
    const Tensor& dst_part = dst.part(dst.locate(moves[i].dst.block).first);
    if (!is_f16(src.k_type) || !is_f16(src.v_type)) {
      return Error{"vulkan quantise_blocks: the source pool is not fp16"};
    }
    if (Status s = check_pool(src, block_size, head_dim); !s.ok()) return s;
    if (Status s = check_pool(dst, block_size, head_dim); !s.ok()) return s;
    std::vector<int32_t> jobs;
    std::vector<int32_t> chan_jobs;  // (destination, source) of the whole per-channel tiles
    const bool chan = is_chan(dst.k_type) || is_chan(dst.v_type);
    for (size_t j = i; j < moves.size(); ++j) {
      if (parts_of(moves[j]) != parts_of(moves[i])) continue;
      done[j] = true;
      const int rows = std::clamp(moves[j].rows, 0, block_size);
      const int32_t sb = src.locate(moves[j].src.block).second;
      const int32_t db = dst.locate(moves[j].dst.block).second;
      jobs.insert(jobs.end(), {sb, db, rows});
      if (!chan || rows == 0) continue;  // a block not written yet is stored whole later
      if (rows != block_size) {
        return Error{fmt::format(
            "vulkan quantise_blocks: a per-channel KV tile moves whole; block {} has {} of {} rows",
            moves[j].src.block, rows, block_size)};
      }
      chan_jobs.insert(chan_jobs.end(), {db, sb});
    }
    const vk::BufferRef jb = params(bytes_of(jobs))[0];
    if (jb.buffer == nullptr) return error_;
    QuantisePush p{static_cast<uint32_t>(n_layers_in_group),
                   static_cast<uint32_t>(n_head_kv),
                   static_cast<uint32_t>(head_dim),
                   static_cast<uint32_t>(block_size),
                   static_cast<uint32_t>(src.memory.row_bytes),
                   static_cast<uint32_t>(src.memory.offset),
                   static_cast<uint32_t>(dst.memory.row_bytes),
                   static_cast<uint32_t>(dst.k_tile_bytes),
                   static_cast<uint32_t>(dst.v_tile_bytes),
                   static_cast<uint32_t>(dst.memory.offset),
                   dst.k_type,
                   dst.v_type,
                   static_cast<uint32_t>(dst.k_group),
                   static_cast<uint32_t>(dst.v_group)};
    run("kv_quantise", {vk::BufferRef{&vbuf(src_part)}, vk::BufferRef{&vbuf(dst_part)}, jb}, p,
        div_up(static_cast<int64_t>(n_layers_in_group) * 2 * n_head_kv * block_size, 64),
        static_cast<uint32_t>(jobs.size() / 3));
    if (chan_jobs.empty()) continue;
    const vk::BufferRef cb = params(bytes_of(chan_jobs))[0];
    if (cb.buffer == nullptr) return error_;
    ChanPush c{static_cast<uint32_t>(n_layers_in_group),
               static_cast<uint32_t>(n_head_kv),
               static_cast<uint32_t>(head_dim),
               static_cast<uint32_t>(block_size),
               dst.k_type,
               dst.v_type,
               0u,
               0u,
               static_cast<uint32_t>(src.memory.row_bytes),
               static_cast<uint32_t>(src.memory.offset),
               0u,
               0u,
               0u,
               0u,
               static_cast<uint32_t>(dst.memory.row_bytes),
               static_cast<uint32_t>(dst.k_tile_bytes),
               static_cast<uint32_t>(dst.v_tile_bytes),
               static_cast<uint32_t>(dst.memory.offset)};
    const vk::BufferRef s16{&vbuf(src_part)};
    run("kv_chan", {s16, s16, s16, cb, vk::BufferRef{&vbuf(dst_part)}}, c,
        div_up(static_cast<int64_t>(n_layers_in_group) * 2 * n_head_kv * (head_dim / 4), 64),
        static_cast<uint32_t>(chan_jobs.size() / 2));
  }
  return error_;
}

Status VulkanBackend::copy_blocks(std::span<const KvPoolDesc> pools,
                                  std::span<const KvBlockCopy> copies) {
  if (!error_.ok()) return error_;
  for (const KvBlockCopy& c : copies) {
    if (c.src.pool != c.dst.pool) return Error{"vulkan copy_blocks: across pools"};
    const KvPoolDesc& p = pools[static_cast<size_t>(c.src.pool)];
    const size_t bb = p.memory.row_bytes;
    const auto [sp, sb] = p.locate(c.src.block);
    const auto [dp, db] = p.locate(c.dst.block);
    const Tensor& st = p.part(sp);
    const Tensor& dt = p.part(dp);
    if (Status s = dev_->copy(vbuf(st), st.offset + static_cast<size_t>(sb) * bb, vbuf(dt),
                              dt.offset + static_cast<size_t>(db) * bb, bb);
        !s.ok()) {
      fail(s.error());
    }
  }
  return error_;
}

}  // namespace bie

namespace bie {

Result<std::unique_ptr<Backend>> create_vulkan_backend(const BackendConfig& cfg) {
  auto spec = parse_device_spec(cfg.device);
  if (!spec.ok()) return Error{spec.error()};
  auto chosen = resolve_device(*spec, list_vulkan_devices());
  if (!chosen.ok()) return Error{chosen.error()};
  if (chosen->cpu) return Error{"--device " + cfg.device + ": no Vulkan device"};
  VulkanBackendOptions o;
  o.device_index = chosen->vulkan_index;
  o.n_host_threads = cfg.n_threads > 0 ? cfg.n_threads : 1;
  for (const auto& [name, field] :
       {std::pair{"BIE_VULKAN_KV_PART_BYTES", &o.max_kv_part_bytes},
        std::pair{"BIE_VULKAN_MAX_BUFFER_BYTES", &o.max_buffer_bytes}}) {
    const char* e = std::getenv(name);
    if (e == nullptr || *e == '\0') continue;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(e, &end, 10);
    if (*e < '0' || *e > '9' || end == nullptr || *end != '\0' || v == 0) {
      return Error{fmt::format("{}={}: expected a positive byte count", name, e)};
    }
    *field = static_cast<size_t>(v);
  }
  auto be = VulkanBackend::create(o);
  if (!be.ok()) return Error{be.error()};
  return std::unique_ptr<Backend>(std::move(*be));
}

}  // namespace bie
