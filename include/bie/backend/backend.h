// Backend: the one seam between the layers that decide what to compute (model/, kv/, attention/,
// engine/) and the memory and kernels that compute it. A backend owns device memory (buffers),
// holds the model's weights in their GGUF block formats (uploaded once; the CPU backend views the
// mmapped file without copying), and runs the operations of a decoder forward pass on tensor views
// of its own buffers. Nothing above backend/ includes a CPU header: models, the KV storage and the
// engine see only this interface (src/backend/cpu/ is one implementation, a GPU backend another).
//
// Memory model. A DeviceBuffer is a block of backend memory, owned by whoever asked for it (the
// model's activation workspace, the KV storage's pools). A Tensor is a non-owning view: buffer +
// byte offset + shape + element type, row-major, rows `row_bytes` apart. Activations and KV pools
// live in backend buffers; the host moves data in and out only through upload() / download() (or
// reads host-visible buffers in place, which every CPU buffer is).
//
// Ordering. Operations are issued in program order on one queue; a backend may run them
// asynchronously. synchronize() waits until every issued operation has finished; download()
// synchronises on its own. A tensor written by one operation may be read by the next without any
// barrier on the caller's side.
//
// Threading: one caller thread at a time (the engine thread); a backend may fan each operation
// out over its own threads.
//
// Adding a backend: implement this class in src/backend/<name>/ and register it in
// src/backend/backend_registry.cpp (create_backend); docs/architecture.md §"A new backend".
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "bie/backend/matmul_path.h"
#include "bie/common/result.h"
#include "bie/quant/types.h"

namespace bie {

class ThreadPool;

// A block of backend memory. Freed by its destructor (a buffer may outlive the Backend object that
// made it only where the backend documents so; the CPU backend's buffers always may).
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  [[nodiscard]] size_t size() const { return size_; }
  // The id of the backend that made it (Backend::id()).
  [[nodiscard]] uint64_t backend_id() const { return backend_id_; }
  // The host address of byte 0 where the memory is host-visible (every CPU buffer), else nullptr.
  [[nodiscard]] void* host_ptr() const { return host_; }
  // A buffer from Backend::reserve commits its memory range by range: [offset, offset + bytes)
  // (page-aligned) becomes usable, or goes back to the system (its contents lost, a later access
  // faults until it is committed again). Any other buffer is committed whole: both do nothing.
  [[nodiscard]] virtual Status commit(size_t /*offset*/, size_t /*bytes*/) { return {}; }
  virtual void decommit(size_t /*offset*/, size_t /*bytes*/) {}

 protected:
  DeviceBuffer(uint64_t backend_id, size_t size, void* host)
      : backend_id_(backend_id), size_(size), host_(host) {}

 private:
  uint64_t backend_id_;
  size_t size_;
  void* host_;
};

// A view of `rows` rows of `cols` elements of `type` in a buffer, rows `row_bytes` apart (a
// quantised weight row is quant::row_size(type, cols) bytes or more). Weights: rows = n_out,
// cols = n_in. Activations: F32 [tokens, width]. Token ids and positions: I32 [n, 1].
struct Tensor {
  DeviceBuffer* buffer = nullptr;
  size_t offset = 0;  // bytes from the buffer's start to row 0
  quant::GgmlType type = quant::GgmlType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_bytes = 0;

  [[nodiscard]] bool empty() const { return buffer == nullptr; }
  [[nodiscard]] size_t bytes() const { return static_cast<size_t>(rows) * row_bytes; }
  // Rows [r0, r0 + n) of this view.
  [[nodiscard]] Tensor slice_rows(int64_t r0, int64_t n) const {
    Tensor t = *this;
    t.offset += static_cast<size_t>(r0) * row_bytes;
    t.rows = n;
    return t;
  }
  // The same bytes read as `rows` x `cols` (contiguous F32/I32 views only: [n, h * d] as
  // [n * h, d] for per-head operations).
  [[nodiscard]] Tensor reshape(int64_t new_rows, int64_t new_cols) const {
    Tensor t = *this;
    t.row_bytes = row_bytes / static_cast<size_t>(cols) * static_cast<size_t>(new_cols);
    t.rows = new_rows;
    t.cols = new_cols;
    return t;
  }
  // Host address of row 0 where the buffer is host-visible, else nullptr.
  [[nodiscard]] void* host() const {
    return buffer != nullptr && buffer->host_ptr() != nullptr
               ? static_cast<uint8_t*>(buffer->host_ptr()) + offset
               : nullptr;
  }
};

// Rotary position embedding of one kind of layer (ggml's rope: freq_base^(-2i/n_rot) / freq_scale,
// optional per-pair divisors).
struct RopeConfig {
  int n_rot = 0;  // rotated dims per head (even)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;
  bool neox = false;    // rotate halves (x[i], x[i + n_rot/2]) instead of adjacent pairs
  Tensor freq_factors;  // optional F32 [1, n_rot / 2] per-pair divisors (llama 3.1); empty: none
};

// ---- KV data path (paged KV pools in backend memory) -----------------------------------------
// A KV pool: `n_blocks` blocks of `block_bytes` bytes in one buffer, or, when that is more than
// the backend binds at once (Backend::kv_pool_part_bytes), in up to kMaxKvPoolParts buffers of
// `part_blocks` blocks each (the last may hold fewer). Within a block, per layer of its layer
// group (in layer order): the K tiles of KV heads 0..n_head_kv-1, then the V tiles; a tile holds
// block_size rows of head_dim values in the K / V format (planner::KvType's id and the format's
// group, the kv/ format table's row), k_tile_bytes / v_tile_bytes long.
inline constexpr int kMaxKvPoolParts = 4;

struct KvPoolDesc {
  // U8 view of the pool's first part (of the whole pool when it is not split): rows = its blocks,
  // row_bytes = block_bytes. Every part has this offset and row_bytes.
  Tensor memory;
  int32_t part_blocks = 0;  // blocks per part when split; 0: one part, `memory`
  std::array<Tensor, kMaxKvPoolParts - 1> more_parts{};  // parts 1.. of a split pool

  [[nodiscard]] int n_parts() const;
  [[nodiscard]] const Tensor& part(int i) const { return i == 0 ? memory : more_parts[i - 1]; }
  // Block b of the pool as (part, block within the part).
  [[nodiscard]] std::pair<int, int32_t> locate(int32_t b) const {
    if (part_blocks <= 0) return {0, b};
    return {b / part_blocks, b % part_blocks};
  }
  uint8_t k_type = 0;
  uint8_t v_type = 0;
  int32_t k_group = 0;
  int32_t v_group = 0;
  size_t k_tile_bytes = 0;
  size_t v_tile_bytes = 0;
  // Rows written here are rounded to fp16 before they are encoded (a mixed layout's body pool:
  // its bytes are those of rows that passed through the FP16 window, whatever the path).
  bool round_rows_to_fp16 = false;
};

// One (pool, block) address; a block table is a list of them.
struct KvBlockRef {
  int32_t pool = 0;
  int32_t block = 0;
};

// One layer's paged attention over a batch of sequences (vLLM's attention metadata).
// Sequence s owns query rows [query_start[s], query_start[s + 1]) of q at positions
// q_pos0[s] + i; query i sees keys j <= q_pos0[s] + i (and, with window > 0, only
// q_pos0[s] + i - j < window). Logical block b of sequence s is
// block_table[block_table_start[s] + b].
struct AttnMetadata {
  Tensor q;    // F32 [n_tokens, n_head * head_dim]
  Tensor out;  // F32 [n_tokens, n_head * head_dim]
  int layer_in_group = 0;
  int n_layers_in_group = 1;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  int block_size = 16;
  float scale = 1.0f;
  int64_t window = 0;
  bool rotate_keys = false;  // keys stored Hadamard-rotated per head: rotate q the same way
  std::span<const KvPoolDesc> pools;
  std::span<const int32_t> query_start;        // [n_seq + 1]
  std::span<const int64_t> q_pos0;             // [n_seq]
  std::span<const int32_t> block_table_start;  // [n_seq + 1]
  std::span<const KvBlockRef> block_table;
};

// Writes K/V rows of one layer into their slots: token i goes to row slot[i].row of block
// slot[i].block (encoded in the block's pool format; rows of a per-channel tile are encoded when
// the tile is complete, see kv::KvFormatTraits).
struct KvSlot {
  KvBlockRef block;
  int32_t row = 0;
};
struct KvWriteMetadata {
  Tensor k;  // F32 [n_tokens, n_head_kv * head_dim], roped (the backend rotates it: rotate_keys)
  Tensor v;  // F32 [n_tokens, n_head_kv * head_dim]
  int layer_in_group = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  int block_size = 16;
  bool rotate_keys = false;
  std::span<const KvPoolDesc> pools;
  std::span<const KvSlot> slots;  // [n_tokens]
};

// Copy-on-write: block src's bytes into block dst (same pool format).
struct KvBlockCopy {
  KvBlockRef src;
  KvBlockRef dst;
};
// Window exit: the first `rows` rows of every tile of FP16 block src re-encoded into body block
// dst.
struct KvBlockQuantise {
  KvBlockRef src;
  KvBlockRef dst;
  int32_t rows = 0;
};

// The memory of a device that is not the host: what the engine's budget is taken from when no
// --device-memory is given (the CPU backend has none: host memory is physical RAM).
struct DeviceMemoryInfo {
  std::string device;      // "vulkan:0 (NVIDIA GeForce RTX 4060)"
  uint64_t total = 0;      // bytes of the device-local heaps
  uint64_t available = 0;  // VK_EXT_memory_budget: what this process may use (0: not reported)
};

// Device-local buffers a backend holds, from its allocations (host-visible staging and parameter
// buffers apart). The CPU backend's buffers are host memory and not counted.
struct DeviceMemoryUse {
  uint64_t bytes = 0;        // asked for by the live buffers (what the memory plan counts)
  uint64_t alloc_bytes = 0;  // what the driver allocated for them (alignment rounds up)
  uint64_t peak_bytes = 0;   // most `bytes` held at once
  uint64_t buffers = 0;      // live buffers
  uint64_t host_bytes = 0;   // host-visible buffers (staging, parameters), as allocated
};

struct BackendConfig {
  std::string device = "cpu";  // "cpu" (the names available_devices() lists)
  int n_threads = 0;           // host threads (CPU backend: compute threads); 0 = all cores
};

class Backend {
 public:
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  [[nodiscard]] virtual std::string name() const = 0;  // "cpu", ...
  // Unique per Backend object in this process (never reused): buffers and bound weights name it.
  [[nodiscard]] uint64_t id() const { return id_; }
  // Threads for host-side work (samplers, host-resident KV pools): the CPU backend's compute pool.
  [[nodiscard]] virtual ThreadPool& host_threads() = 0;

  // ---- memory ---------------------------------------------------------------------------------
  // A buffer of `bytes` (64-byte aligned), contents unspecified. Errors when memory is short.
  [[nodiscard]] virtual Result<std::unique_ptr<DeviceBuffer>> alloc(size_t bytes) = 0;
  // Weights in their file formats, uploaded once: a device backend copies the bytes into device
  // memory; the CPU backend returns a view of `bytes` itself (no copy; the mapping must outlive the
  // buffer). A model whose weights are longer than max_buffer_bytes() uploads them in several
  // pieces, each a run of whole tensors.
  [[nodiscard]] virtual Result<std::unique_ptr<DeviceBuffer>> upload_weights(
      std::span<const uint8_t> bytes) = 0;
  // A weight matrix of an uploaded buffer, offered once after the upload (Model::bind) so that a
  // backend can convert it for its kernels now instead of at its first matmul (the CPU backend
  // repacks Q4_K/Q6_K matrices on AVX-512). Default: nothing.
  virtual void prepare_weight(const Tensor& /*w*/) {}
  // Memory for a pool that fills as it is used (the KV pools): a backend that reserves_on_demand()
  // returns `bytes` of address space that holds no memory until DeviceBuffer::commit (the CPU
  // backend: PROT_NONE, MAP_NORESERVE pages); any other returns alloc(bytes).
  [[nodiscard]] virtual bool reserves_on_demand() const { return false; }
  [[nodiscard]] virtual Result<std::unique_ptr<DeviceBuffer>> reserve(size_t bytes) {
    return alloc(bytes);
  }
  // Bytes one buffer (alloc, upload_weights) may hold.
  [[nodiscard]] virtual uint64_t max_buffer_bytes() const { return UINT64_MAX; }
  // Host <-> device copies of dst.bytes() / src.bytes() bytes (contiguous views).
  virtual void upload(const Tensor& dst, const void* src) = 0;
  virtual void download(const Tensor& src, void* dst) = 0;
  // Waits until every issued operation has finished.
  virtual void synchronize() = 0;
  // The first failure of an operation since the backend was made (operations return void; a
  // device backend that fails one records it and skips the rest). The CPU backend never fails.
  [[nodiscard]] virtual Status status() const { return {}; }
  // A device backend's memory (nullopt: the model runs in host memory).
  [[nodiscard]] virtual std::optional<DeviceMemoryInfo> device_memory() const {
    return std::nullopt;
  }
  [[nodiscard]] virtual DeviceMemoryUse device_memory_use() const { return {}; }

  // Whether matmul/get_rows have a kernel for weights of `type` (a model with others is refused
  // when it binds, before any pass).
  [[nodiscard]] virtual bool supports_weight_type(quant::GgmlType /*type*/) const { return true; }

  // ---- dense operations (F32 activations [rows, cols], row-wise) ------------------------------
  // y[t] = W x[t] for each of x's rows, with the kernel family `path` names (see MatmulPath: the
  // path decides a token's rounding). W is a weight view [n_out, n_in] of a quant type.
  virtual void matmul(const Tensor& w, const Tensor& x, const Tensor& y, MatmulPath path) = 0;
  // out[i] = table row ids[i] (dequantised to F32) * scale. ids: I32 [n, 1].
  virtual void get_rows(const Tensor& table, const Tensor& ids, const Tensor& out,
                        float scale = 1.0f) = 0;
  // out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w (w: F32 [1, cols]); out may be x. Per-head q/k
  // norm: a [n, h * d] view reshaped to [n * h, d].
  virtual void rms_norm(const Tensor& x, const Tensor& w, const Tensor& out, float eps) = 0;
  // x += y; y with one row is broadcast over x's rows (biases).
  virtual void add(const Tensor& x, const Tensor& y) = 0;
  // x *= s.
  virtual void scale(const Tensor& x, float s) = 0;
  // gate = silu(gate) * up, or gelu(gate) * up (GELU's tanh form as ggml's CPU geglu computes it).
  virtual void silu_mul(const Tensor& gate, const Tensor& up) = 0;
  virtual void gelu_mul(const Tensor& gate, const Tensor& up) = 0;
  // cs[i] = interleaved (cos, sin) of position pos[i] (cs: F32 [n, n_rot]; pos: I32 [n, 1]).
  virtual void rope_cache(const RopeConfig& rope, const Tensor& pos, const Tensor& cs) = 0;
  // Rotates the n_heads heads of head_dim values of each row of x with row i of cs.
  virtual void rope(const RopeConfig& rope, const Tensor& cs, const Tensor& x, int n_heads,
                    int head_dim) = 0;
  // x = tanh(x / cap) * cap (final logit soft-capping).
  virtual void softcap(const Tensor& x, float cap) = 0;

  // ---- KV data path (see the structs above) ---------------------------------------------------
  // The KV storage (kv::PagedKvStore) keeps its pools in the memory of a backend that
  // supports_paged_kv() and the layout's formats, and runs every write, attention, copy and window
  // exit as these operations. A backend without them answers an error naming the operation.
  [[nodiscard]] virtual bool supports_paged_kv() const { return false; }
  // Bytes one part of a KV pool may span (a device binds each part as one shader binding), and a
  // whole pool (kMaxKvPoolParts parts).
  [[nodiscard]] virtual uint64_t kv_pool_part_bytes() const { return UINT64_MAX; }
  [[nodiscard]] uint64_t max_kv_pool_bytes() const;
  // Whether the KV operations take pools of these K / V formats (planner::KvType ids); a backend
  // that takes a format takes its keys Hadamard-rotated too (KvWriteMetadata::rotate_keys).
  [[nodiscard]] virtual bool supports_kv_types(uint8_t /*k_type*/, uint8_t /*v_type*/) const {
    return false;
  }
  [[nodiscard]] virtual Status paged_attention(const AttnMetadata& meta);
  [[nodiscard]] virtual Status kv_write(const KvWriteMetadata& meta);
  [[nodiscard]] virtual Status copy_blocks(std::span<const KvPoolDesc> pools,
                                           std::span<const KvBlockCopy> copies);
  [[nodiscard]] virtual Status quantise_blocks(std::span<const KvPoolDesc> pools,
                                               std::span<const KvBlockQuantise> moves,
                                               int n_layers_in_group, int n_head_kv, int head_dim,
                                               int block_size);

 protected:
  Backend();

 private:
  uint64_t id_;
};

// The backends built into this binary ("cpu" first).
[[nodiscard]] std::vector<std::string> available_devices();
// Creates the backend cfg.device names; an unknown name is an error listing available_devices().
[[nodiscard]] Result<std::unique_ptr<Backend>> create_backend(const BackendConfig& cfg);

// ---- helpers for callers ----------------------------------------------------------------------
// A contiguous tensor over a whole buffer (rows x cols of type; row_bytes from the type).
[[nodiscard]] Tensor tensor_of(DeviceBuffer& buf, quant::GgmlType type, int64_t rows, int64_t cols,
                               size_t offset = 0);

}  // namespace bie
