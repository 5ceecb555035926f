#include "backend/cpu/cpu_backend.h"

#include <fmt/format.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <tuple>
#include <vector>

#include "bie/backend/ops.h"
#include "bie/quant/traits.h"

namespace bie {

namespace {

// Host memory: owned (aligned, zero-filled) or a view of memory someone else owns. A view of
// the weights also owns their repacked copies (pack_weight), made when the model offers a matrix
// (prepare_weight) or a matmul first reads it, and freed with the view.
class CpuBuffer final : public DeviceBuffer {
 public:
  CpuBuffer(uint64_t backend_id, size_t size, void* host, bool owned)
      : DeviceBuffer(backend_id, size, host), owned_(owned) {}
  ~CpuBuffer() override {
    if (owned_) std::free(host_ptr());
  }

  // The repacked copy of the weight matrix `w` (a view at `offset` of this buffer), made at the
  // first call; nullptr where the matrix has no packed layout. Views of owned buffers (not
  // weights) are never repacked.
  const void* packed(size_t offset, const WeightView& w, ThreadPool& pool) {
    if (owned_) return nullptr;
    const Key key{offset, w.n_out, w.n_in, w.type};
    auto it = packed_.find(key);
    if (it != packed_.end()) return it->second;
    const size_t bytes = packed_weight_bytes(w);
    uint8_t* copy = bytes > 0 ? alloc_copy(bytes) : nullptr;
    if (copy != nullptr) {
      // Slices of about kPackSliceBytes, each released once packed: the weights are held twice
      // only a slice at a time (the output matrix alone is ~190 MB on a 1.5B model).
      const int64_t per_slice =
          std::max<int64_t>(1, static_cast<int64_t>(kPackSliceBytes / (16 * w.row_bytes))) * 16;
      const size_t panel_bytes = packed_weight_bytes({w.type, w.n_in, 16, w.data, w.row_bytes});
      for (int64_t r0 = 0; r0 < w.n_out; r0 += per_slice) {
        const int64_t n = std::min(per_slice, w.n_out - r0);
        const auto* src = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r0) * w.row_bytes;
        pack_weight({w.type, w.n_in, n, src, w.row_bytes},
                    copy + static_cast<size_t>(r0 / 16) * panel_bytes,
                    pool);
        release_pages(src, static_cast<size_t>(n) * w.row_bytes);
      }
    }
    return packed_.emplace(key, copy).first->second;
  }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  using Key = std::tuple<size_t, int64_t, int64_t, quant::GgmlType>;
  static constexpr size_t kPackSliceBytes = size_t{8} << 20;
  static constexpr size_t kHugePage = size_t{2} << 20;
  static constexpr size_t kArenaBytes = size_t{64} << 20;

  // Memory for a repacked copy (64-byte aligned; nullptr if out of memory). Decode streams the
  // copies whole every token, so they are cut one after the other from arenas of 2 MiB-aligned
  // memory that ask for transparent huge pages (MADV_HUGEPAGE; honoured where THP is "madvise"
  // or "always"): the stream takes a TLB miss per 2 MiB instead of per 4 KiB, the small matrices
  // and the copies' tails included. Qwen2.5-Coder-1.5B decode on an AMD EPYC (Zen 4) VM: ~+10 %.
  // Memory is committed as the copies are written; an arena left for a new one gives back its
  // unused end (the part of the huge page its last copy ends in), so only the newest arena's
  // last huge page can hold memory no copy uses.
  uint8_t* alloc_copy(size_t bytes) {
    const size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded > arena_left_) {
      release_tail();
      const size_t size = std::max(kArenaBytes, (rounded + kHugePage - 1) / kHugePage * kHugePage);
      void* p = std::aligned_alloc(kHugePage, size);
      if (p == nullptr) return nullptr;
      (void)::madvise(p, size, MADV_HUGEPAGE);
      arenas_.emplace_back(p);
      arena_next_ = static_cast<uint8_t*>(p);
      arena_left_ = size;
    }
    uint8_t* out = arena_next_;
    arena_next_ += rounded;
    arena_left_ -= rounded;
    return out;
  }

  void release_tail() {
    if (arena_left_ == 0) return;
    const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const auto b = (reinterpret_cast<uintptr_t>(arena_next_) + page - 1) / page * page;
    const auto e = reinterpret_cast<uintptr_t>(arena_next_) + arena_left_;
    if (e > b) (void)::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
  }

  // The matrix is read from its copy from now on: its pages of the (mmapped) file leave the
  // process's resident set, so the weights are not held twice. MADV_PAGEOUT only reclaims (it
  // never discards data), so any memory is safe to pass; a later read faults pages back in.
  static void release_pages(const void* data, size_t bytes) {
    const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const auto b = (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page;
    const auto e = (reinterpret_cast<uintptr_t>(data) + bytes) / page * page;
    if (e > b) (void)::madvise(reinterpret_cast<void*>(b), e - b, MADV_PAGEOUT);
  }

  bool owned_;
  std::map<Key, const void*> packed_;            // into arenas_
  std::vector<std::unique_ptr<void, Free>> arenas_;
  uint8_t* arena_next_ = nullptr;
  size_t arena_left_ = 0;
};

float* f32(const Tensor& t) {
  return static_cast<float*>(t.host());
}

// A row-wise job goes to the pool from 4 rows and 2048 values on (one decode token runs inline,
// as the small jobs of a decode step would only pay the pool's wake-up).
constexpr int64_t kMinParallelRows = 4;
constexpr int64_t kMinParallelValues = 2048;

ops::RopeParams rope_params(const RopeConfig& r) {
  ops::RopeParams p;
  p.n_rot = r.n_rot;
  p.freq_base = r.freq_base;
  p.freq_scale = r.freq_scale;
  p.neox = r.neox;
  p.freq_factors = r.freq_factors.empty() ? nullptr : f32(r.freq_factors);
  return p;
}

}  // namespace

CpuBackend::CpuBackend(int n_threads) : pool_(n_threads > 0 ? n_threads : default_thread_count()) {}

CpuBackend::~CpuBackend() = default;

template <class Fn>
void CpuBackend::for_rows(int64_t rows, int64_t cols, Fn&& fn) {
  if (rows < kMinParallelRows || rows * cols < kMinParallelValues) {
    for (int64_t r = 0; r < rows; ++r) fn(r);
    return;
  }
  pool_.parallel_for(rows, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) fn(r);
  });
}

Result<std::unique_ptr<DeviceBuffer>> CpuBackend::alloc(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = rounded == 0 ? nullptr : std::aligned_alloc(64, rounded);
  if (rounded != 0 && p == nullptr) {
    return Error{fmt::format("cpu backend: out of memory allocating {} bytes", bytes)};
  }
  if (p != nullptr) std::memset(p, 0, rounded);
  return std::unique_ptr<DeviceBuffer>(std::make_unique<CpuBuffer>(id(), bytes, p, true));
}

Result<std::unique_ptr<DeviceBuffer>> CpuBackend::upload_weights(std::span<const uint8_t> bytes) {
  // A view of the caller's (mmapped) bytes: the CPU kernels read weights in place.
  return std::unique_ptr<DeviceBuffer>(
      std::make_unique<CpuBuffer>(id(), bytes.size(), const_cast<uint8_t*>(bytes.data()), false));
}

void CpuBackend::upload(const Tensor& dst, const void* src) {
  if (dst.bytes() != 0) std::memcpy(dst.host(), src, dst.bytes());
}

void CpuBackend::download(const Tensor& src, void* dst) {
  if (src.bytes() != 0) std::memcpy(dst, src.host(), src.bytes());
}

WeightView CpuBackend::weight_view(const Tensor& w) {
  WeightView wv{w.type, w.cols, w.rows, w.host(), w.row_bytes};
  if (w.buffer->backend_id() == id()) {
    wv.packed = static_cast<CpuBuffer*>(w.buffer)->packed(w.offset, wv, pool_);
  }
  return wv;
}

void CpuBackend::prepare_weight(const Tensor& w) {
  if (w.rows > 1 && quant::traits(w.type) != nullptr) (void)weight_view(w);
}

void CpuBackend::matmul(const Tensor& w, const Tensor& x, const Tensor& y, MatmulPath path) {
  const WeightView wv = weight_view(w);
  bie::matmul(wv, f32(x), x.rows, f32(y), pool_, scratch_, path);
}

void CpuBackend::get_rows(const Tensor& table, const Tensor& ids, const Tensor& out, float scale) {
  const quant::TypeTraits* tr = quant::traits(table.type);
  const auto* base = static_cast<const uint8_t*>(table.host());
  const auto* id = static_cast<const int32_t*>(ids.host());
  const int64_t n = table.cols;
  for_rows(out.rows, n, [&](int64_t i) {
    float* y = f32(out) + i * (static_cast<int64_t>(out.row_bytes) / 4);
    tr->to_float(base + static_cast<size_t>(id[i]) * table.row_bytes, y, n);
    if (scale != 1.0f) {
      for (int64_t c = 0; c < n; ++c) y[c] *= scale;
    }
  });
}

void CpuBackend::rms_norm(const Tensor& x, const Tensor& w, const Tensor& out, float eps) {
  const float* wp = f32(w);
  const auto xs = static_cast<int64_t>(x.row_bytes / 4);
  const auto os = static_cast<int64_t>(out.row_bytes / 4);
  for_rows(x.rows, x.cols,
           [&](int64_t r) { ops::rms_norm(f32(x) + r * xs, wp, f32(out) + r * os, x.cols, eps); });
}

void CpuBackend::add(const Tensor& x, const Tensor& y) {
  const auto xs = static_cast<int64_t>(x.row_bytes / 4);
  const int64_t ys = y.rows == 1 ? 0 : static_cast<int64_t>(y.row_bytes / 4);
  for_rows(x.rows, x.cols,
           [&](int64_t r) { ops::add_inplace(f32(x) + r * xs, f32(y) + r * ys, x.cols); });
}

void CpuBackend::scale(const Tensor& x, float s) {
  const auto xs = static_cast<int64_t>(x.row_bytes / 4);
  for_rows(x.rows, x.cols, [&](int64_t r) {
    float* p = f32(x) + r * xs;
    for (int64_t c = 0; c < x.cols; ++c) p[c] *= s;
  });
}

void CpuBackend::silu_mul(const Tensor& gate, const Tensor& up) {
  const auto gs = static_cast<int64_t>(gate.row_bytes / 4);
  const auto us = static_cast<int64_t>(up.row_bytes / 4);
  for_rows(gate.rows, gate.cols, [&](int64_t r) {
    ops::silu_mul_inplace(f32(gate) + r * gs, f32(up) + r * us, gate.cols);
  });
}

void CpuBackend::gelu_mul(const Tensor& gate, const Tensor& up) {
  const auto gs = static_cast<int64_t>(gate.row_bytes / 4);
  const auto us = static_cast<int64_t>(up.row_bytes / 4);
  for_rows(gate.rows, gate.cols, [&](int64_t r) {
    ops::gelu_mul_inplace(f32(gate) + r * gs, f32(up) + r * us, gate.cols);
  });
}

void CpuBackend::rope_cache(const RopeConfig& rope, const Tensor& pos, const Tensor& cs) {
  const ops::RopeParams p = rope_params(rope);
  const auto* ps = static_cast<const int32_t*>(pos.host());
  const auto css = static_cast<int64_t>(cs.row_bytes / 4);
  for_rows(cs.rows, cs.cols, [&](int64_t i) { ops::rope_cache(p, ps[i], f32(cs) + i * css); });
}

void CpuBackend::rope(const RopeConfig& rope, const Tensor& cs, const Tensor& x, int n_heads,
                      int head_dim) {
  const ops::RopeParams p = rope_params(rope);
  const auto css = static_cast<int64_t>(cs.row_bytes / 4);
  const auto xs = static_cast<int64_t>(x.row_bytes / 4);
  for_rows(x.rows, x.cols, [&](int64_t i) {
    ops::rope_apply(p, f32(cs) + i * css, f32(x) + i * xs, n_heads, head_dim);
  });
}

void CpuBackend::softcap(const Tensor& x, float cap) {
  const auto xs = static_cast<int64_t>(x.row_bytes / 4);
  for_rows(x.rows, x.cols, [&](int64_t r) {
    float* p = f32(x) + r * xs;
    for (int64_t c = 0; c < x.cols; ++c) p[c] = std::tanh(p[c] * (1.0f / cap)) * cap;
  });
}

}  // namespace bie
