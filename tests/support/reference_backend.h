// A second backend written from the formulas, for tests: host memory, every dense operation a
// plain loop in double precision over weights dequantised with the scalar quant traits (no SIMD,
// no 8-bit activations, no threads). It implements only the Backend interface and is registered
// nowhere: the model and the paged KV store run on it unchanged. Its KV data path holds the pools
// in its own host memory and runs the scalar KV codecs (kv::kv_traits_scalar) and attention as
// the formula reads: per query and head, every visible key scored, a softmax, the weighted sum of
// V. That the golden tests pass on it shows a backend plugs in without touching model/, kv/ or
// engine/.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "bie/backend/backend.h"
#include "bie/backend/kv_format.h"
#include "bie/backend/kv_format_rotate.h"
#include "bie/backend/thread_pool.h"
#include "bie/planner/kv_format.h"
#include "bie/quant/fp16.h"
#include "bie/quant/traits.h"

namespace bie::test {

class ReferenceBackend : public Backend {
 public:
  ReferenceBackend() : pool_(1) {}

  [[nodiscard]] std::string name() const override { return "reference"; }
  [[nodiscard]] ThreadPool& host_threads() override { return pool_; }

  [[nodiscard]] Result<std::unique_ptr<DeviceBuffer>> alloc(size_t bytes) override {
    return std::unique_ptr<DeviceBuffer>(std::make_unique<Buffer>(id(), bytes));
  }
  // A copy, not a view: what a device backend does with the weights.
  [[nodiscard]] Result<std::unique_ptr<DeviceBuffer>> upload_weights(
      std::span<const uint8_t> bytes) override {
    auto b = std::make_unique<Buffer>(id(), bytes.size());
    if (!bytes.empty()) std::memcpy(b->host_ptr(), bytes.data(), bytes.size());
    return std::unique_ptr<DeviceBuffer>(std::move(b));
  }
  void upload(const Tensor& dst, const void* src) override {
    if (dst.bytes() != 0) std::memcpy(dst.host(), src, dst.bytes());
  }
  void download(const Tensor& src, void* dst) override {
    if (src.bytes() != 0) std::memcpy(dst, src.host(), src.bytes());
  }
  void synchronize() override {}

  // y[t][o] = sum_i W[o][i] x[t][i], W's rows dequantised by the scalar traits.
  void matmul(const Tensor& w, const Tensor& x, const Tensor& y, MatmulPath /*path*/) override {
    std::vector<float> row(static_cast<size_t>(w.cols));
    const quant::TypeTraits* tr = quant::traits(w.type);
    for (int64_t o = 0; o < w.rows; ++o) {
      tr->to_float(bytes(w) + static_cast<size_t>(o) * w.row_bytes, row.data(), w.cols);
      for (int64_t t = 0; t < x.rows; ++t) {
        const float* xr = f32(x, t);
        double acc = 0.0;
        for (int64_t i = 0; i < w.cols; ++i) acc += static_cast<double>(row[i]) * xr[i];
        f32(y, t)[o] = static_cast<float>(acc);
      }
    }
  }
  void get_rows(const Tensor& table, const Tensor& ids, const Tensor& out, float scale) override {
    const auto* id = static_cast<const int32_t*>(ids.host());
    const quant::TypeTraits* tr = quant::traits(table.type);
    for (int64_t r = 0; r < out.rows; ++r) {
      float* o = f32(out, r);
      tr->to_float(bytes(table) + static_cast<size_t>(id[r]) * table.row_bytes, o, table.cols);
      for (int64_t c = 0; c < table.cols; ++c) o[c] *= scale;
    }
  }
  // out = x / sqrt(mean(x^2) + eps) * w
  void rms_norm(const Tensor& x, const Tensor& w, const Tensor& out, float eps) override {
    const float* wp = f32(w, 0);
    for (int64_t r = 0; r < x.rows; ++r) {
      const float* xr = f32(x, r);
      double ss = 0.0;
      for (int64_t c = 0; c < x.cols; ++c) ss += static_cast<double>(xr[c]) * xr[c];
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.cols) + eps);
      float* o = f32(out, r);
      for (int64_t c = 0; c < x.cols; ++c) o[c] = static_cast<float>(xr[c] * inv * wp[c]);
    }
  }
  void add(const Tensor& x, const Tensor& y) override {
    for (int64_t r = 0; r < x.rows; ++r) {
      const float* yr = f32(y, y.rows == 1 ? 0 : r);  // a one-row y is broadcast (biases)
      float* xr = f32(x, r);
      for (int64_t c = 0; c < x.cols; ++c) xr[c] += yr[c];
    }
  }
  void scale(const Tensor& x, float s) override {
    each(x, [&](float& v, int64_t, int64_t) { v *= s; });
  }
  // gate = silu(gate) * up
  void silu_mul(const Tensor& gate, const Tensor& up) override {
    each(gate, [&](float& g, int64_t r, int64_t c) {
      const double x = g;
      g = static_cast<float>(x / (1.0 + std::exp(-x)) * f32(up, r)[c]);
    });
  }
  // gate = gelu(gate) * up, GELU's tanh form (the one GGUF models with GeGLU are trained with).
  void gelu_mul(const Tensor& gate, const Tensor& up) override {
    each(gate, [&](float& g, int64_t r, int64_t c) {
      const double x = g;
      const double k = std::sqrt(2.0 / M_PI);
      g = static_cast<float>(0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x))) *
                             f32(up, r)[c]);
    });
  }
  // Pair i of position p turns by p * freq_scale * base^(-2i/n_rot) / factor_i; the cache row
  // holds (cos, sin) of every pair.
  void rope_cache(const RopeConfig& rope, const Tensor& pos, const Tensor& cs) override {
    const auto* p = static_cast<const int32_t*>(pos.host());
    const float* factors = rope.freq_factors.empty() ? nullptr : f32(rope.freq_factors, 0);
    for (int64_t t = 0; t < cs.rows; ++t) {
      float* row = f32(cs, t);
      for (int i = 0; i < rope.n_rot / 2; ++i) {
        const double inv_freq =
            std::pow(static_cast<double>(rope.freq_base), -2.0 * i / rope.n_rot) /
            (factors != nullptr ? factors[i] : 1.0);
        const double a = static_cast<double>(p[t]) * rope.freq_scale * inv_freq;
        row[2 * i] = static_cast<float>(std::cos(a));
        row[2 * i + 1] = static_cast<float>(std::sin(a));
      }
    }
  }
  // Rotates pair i of every head: dims (2i, 2i+1), or (i, i + n_rot/2) in the NeoX layout.
  void rope(const RopeConfig& rope, const Tensor& cs, const Tensor& x, int n_heads,
            int head_dim) override {
    const int half = rope.n_rot / 2;
    for (int64_t t = 0; t < x.rows; ++t) {
      const float* row = f32(cs, t);
      for (int h = 0; h < n_heads; ++h) {
        float* v = f32(x, t) + static_cast<int64_t>(h) * head_dim;
        for (int i = 0; i < half; ++i) {
          const int a = rope.neox ? i : 2 * i;
          const int b = rope.neox ? i + half : 2 * i + 1;
          const double c = row[2 * i], s = row[2 * i + 1];
          const double x0 = v[a], x1 = v[b];
          v[a] = static_cast<float>(x0 * c - x1 * s);
          v[b] = static_cast<float>(x0 * s + x1 * c);
        }
      }
    }
  }
  // x = cap * tanh(x / cap)
  void softcap(const Tensor& x, float cap) override {
    each(x, [&](float& v, int64_t, int64_t) {
      v = static_cast<float>(cap * std::tanh(static_cast<double>(v) / cap));
    });
  }

  // ---- KV data path: pools in host memory, the scalar codecs -----------------------------------
  // Pools are sized to the whole budget and only touched as they fill (MAP_NORESERVE pages).
  [[nodiscard]] bool reserves_on_demand() const override { return true; }
  [[nodiscard]] Result<std::unique_ptr<DeviceBuffer>> reserve(size_t bytes) override {
    if (bytes == 0) return alloc(0);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return Error{"reference backend: cannot reserve KV pool memory"};
    return std::unique_ptr<DeviceBuffer>(std::make_unique<Mapped>(id(), bytes, p));
  }
  [[nodiscard]] bool supports_paged_kv() const override { return true; }
  [[nodiscard]] bool supports_kv_types(uint8_t k, uint8_t v) const override {
    return kv::kv_traits_scalar(planner::KvType(k)) != nullptr &&
           kv::kv_traits_scalar(planner::KvType(v)) != nullptr;
  }
  // Rows go in one at a time, except a per-channel tile: whole, as its scales span it.
  [[nodiscard]] Status kv_write(const KvWriteMetadata& m) override {
    const int d = m.head_dim;
    for (size_t i = 0; i < m.slots.size();) {
      const KvSlot& s = m.slots[i];
      const KvPoolDesc& pool = m.pools[static_cast<size_t>(s.block.pool)];
      const bool whole = planner::is_per_channel(planner::KvType(pool.k_type)) ||
                         planner::is_per_channel(planner::KvType(pool.v_type));
      const int n = whole ? m.block_size : 1;
      if (whole && (s.row != 0 || i + static_cast<size_t>(n) > m.slots.size())) {
        return Error{"reference kv_write: a per-channel tile written in part"};
      }
      for (int h = 0; h < m.n_head_kv; ++h) {
        for (int pass = 0; pass < 2; ++pass) {
          std::vector<float> rows(static_cast<size_t>(n) * d);
          for (int r = 0; r < n; ++r) {
            float* row = rows.data() + static_cast<size_t>(r) * d;
            std::memcpy(row, f32(pass == 0 ? m.k : m.v, static_cast<int64_t>(i) + r) + h * d,
                        static_cast<size_t>(d) * sizeof(float));
            if (pass == 0 && m.rotate_keys) kv::hadamard_rotate_scalar(row, d);
            if (pool.round_rows_to_fp16) {
              for (int c = 0; c < d; ++c) row[c] = quant::fp16_to_fp32(quant::fp32_to_fp16(row[c]));
            }
          }
          const Tile t = tile(pool, s.block.block, m.layer_in_group, m.n_head_kv, h, pass, d);
          t.traits->store(t.geom, rows.data(), t.data, s.row, n);
        }
      }
      i += static_cast<size_t>(n);
    }
    return {};
  }
  [[nodiscard]] Status copy_blocks(std::span<const KvPoolDesc> pools,
                                   std::span<const KvBlockCopy> copies) override {
    for (const KvBlockCopy& c : copies) {
      const KvPoolDesc& p = pools[static_cast<size_t>(c.src.pool)];
      std::memcpy(block(pools[static_cast<size_t>(c.dst.pool)], c.dst.block), block(p, c.src.block),
                  p.memory.row_bytes);
    }
    return {};
  }
  [[nodiscard]] Status quantise_blocks(std::span<const KvPoolDesc> pools,
                                       std::span<const KvBlockQuantise> moves, int n_layers,
                                       int n_head_kv, int head_dim, int block_size) override {
    std::vector<float> rows(static_cast<size_t>(block_size) * head_dim);
    for (const KvBlockQuantise& q : moves) {
      for (int il = 0; il < n_layers; ++il) {
        for (int h = 0; h < n_head_kv; ++h) {
          for (int pass = 0; pass < 2; ++pass) {
            const Tile s = tile(pools[static_cast<size_t>(q.src.pool)], q.src.block, il, n_head_kv,
                                h, pass, head_dim);
            const Tile t = tile(pools[static_cast<size_t>(q.dst.pool)], q.dst.block, il, n_head_kv,
                                h, pass, head_dim);
            s.traits->load(s.geom, s.data, 0, q.rows, rows.data());
            t.traits->store(t.geom, rows.data(), t.data, 0, q.rows);
          }
        }
      }
    }
    return {};
  }
  // out[i, h] = sum_j softmax_j(scale * q[i, h] . k[j]) v[j] over the keys query i sees.
  [[nodiscard]] Status paged_attention(const AttnMetadata& m) override {
    const int d = m.head_dim;
    const int group = m.n_head / m.n_head_kv;
    for (size_t s = 0; s + 1 < m.query_start.size(); ++s) {
      const KvBlockRef* table = m.block_table.data() + m.block_table_start[s];
      for (int32_t i = m.query_start[s]; i < m.query_start[s + 1]; ++i) {
        const int64_t p = m.q_pos0[s] + (i - m.query_start[s]);
        const int64_t lo = m.window > 0 ? std::max<int64_t>(0, p - m.window + 1) : 0;
        for (int h = 0; h < m.n_head; ++h) {
          std::vector<float> q(f32(m.q, i) + h * d, f32(m.q, i) + (h + 1) * d);
          if (m.rotate_keys) kv::hadamard_rotate_scalar(q.data(), d);
          std::vector<float> q16 = q;  // the f16 dot rounds the query as ggml's f16 K path does
          for (float& x : q16) x = quant::fp16_to_fp32(quant::fp32_to_fp16(x));
          std::vector<float> score(static_cast<size_t>(p - lo + 1));
          float mx = -std::numeric_limits<float>::infinity();
          for (int64_t j = lo; j <= p; ++j) {
            const KvBlockRef& b = table[j / m.block_size];
            const Tile k = tile(m.pools[static_cast<size_t>(b.pool)], b.block, m.layer_in_group,
                                m.n_head_kv, h / group, 0, d);
            float& sc = score[static_cast<size_t>(j - lo)];
            k.traits->dot(k.geom, k.f16 ? q16.data() : q.data(), k.data,
                          static_cast<int>(j % m.block_size), 1, &sc);
            sc *= m.scale;
            mx = std::max(mx, sc);
          }
          double sum = 0;
          for (float& sc : score) sum += (sc = std::exp(sc - mx));
          float* out = f32(m.out, i) + h * d;
          std::fill(out, out + d, 0.0f);
          for (int64_t j = lo; j <= p; ++j) {
            const KvBlockRef& b = table[j / m.block_size];
            const Tile v = tile(m.pools[static_cast<size_t>(b.pool)], b.block, m.layer_in_group,
                                m.n_head_kv, h / group, 1, d);
            const float w = static_cast<float>(score[static_cast<size_t>(j - lo)] / sum);
            v.traits->axpy(v.geom, &w, v.data, static_cast<int>(j % m.block_size), 1, out);
          }
        }
      }
    }
    return {};
  }

 private:
  class Buffer final : public DeviceBuffer {
   public:
    Buffer(uint64_t backend, size_t bytes)
        : DeviceBuffer(backend, bytes, zeroed((bytes + 63) / 64 * 64 + 64)) {}
    ~Buffer() override { std::free(host_ptr()); }

   private:
    static void* zeroed(size_t n) {  // 64-byte aligned, as the host KV kernels may assume
      void* p = std::aligned_alloc(64, n);
      if (p != nullptr) std::memset(p, 0, n);
      return p;
    }
  };

  class Mapped final : public DeviceBuffer {
   public:
    Mapped(uint64_t backend, size_t bytes, void* p) : DeviceBuffer(backend, bytes, p) {}
    ~Mapped() override { munmap(host_ptr(), size()); }
  };

  // One KV head's K (pass 0) or V (pass 1) tile of layer `layer` of a pool's block.
  struct Tile {
    const kv::KvFormatTraits* traits;
    kv::KvRowGeom geom;
    uint8_t* data;
    bool f16;
  };
  static uint8_t* block(const KvPoolDesc& pool, int32_t b) {
    const auto [part, i] = pool.locate(b);
    const Tensor& t = pool.part(part);
    return static_cast<uint8_t*>(t.host()) + static_cast<size_t>(i) * t.row_bytes;
  }
  static Tile tile(const KvPoolDesc& pool, int32_t b, int layer, int n_head_kv, int h, int pass,
                   int d) {
    const size_t layer_bytes =
        static_cast<size_t>(n_head_kv) * (pool.k_tile_bytes + pool.v_tile_bytes);
    uint8_t* base = block(pool, b) + static_cast<size_t>(layer) * layer_bytes;
    const auto type = planner::KvType(pass == 0 ? pool.k_type : pool.v_type);
    if (pass == 0) {
      return {kv::kv_traits_scalar(type),
              {d, pool.k_group},
              base + h * pool.k_tile_bytes,
              type == planner::KvType::kF16};
    }
    return {kv::kv_traits_scalar(type),
            {d, pool.v_group},
            base + n_head_kv * pool.k_tile_bytes + h * pool.v_tile_bytes,
            false};
  }

  static const uint8_t* bytes(const Tensor& t) { return static_cast<const uint8_t*>(t.host()); }
  static float* f32(const Tensor& t, int64_t row) {
    return reinterpret_cast<float*>(static_cast<uint8_t*>(t.host()) +
                                    static_cast<size_t>(row) * t.row_bytes);
  }
  template <class Fn>
  static void each(const Tensor& x, Fn&& fn) {
    for (int64_t r = 0; r < x.rows; ++r) {
      float* p = f32(x, r);
      for (int64_t c = 0; c < x.cols; ++c) fn(p[c], r, c);
    }
  }

  ThreadPool pool_;
};

}  // namespace bie::test
