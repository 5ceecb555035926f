// CpuBackend's KV data path: pools of reserved address space committed block by block, K/V rows
// encoded with the KV format codecs (kv_format.h), blocks copied and re-quantised, and paged
// attention through the attention runner over views of the pools' blocks.
#include <fmt/format.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "bie/backend/kv_block_view.h"
#include "bie/backend/kv_format.h"
#include "bie/backend/kv_format_rotate.h"
#include "bie/planner/kv_format.h"
#include "bie/quant/fp16.h"

namespace bie {

namespace {

// Address space that holds memory only where commit() made it usable (PROT_NONE, MAP_NORESERVE
// until then): a KV pool planned for the longest context costs only the blocks in use.
class ReservedBuffer final : public DeviceBuffer {
 public:
  ReservedBuffer(uint64_t backend_id, size_t size, void* base)
      : DeviceBuffer(backend_id, size, base) {}
  ~ReservedBuffer() override {
    if (host_ptr() != nullptr) munmap(host_ptr(), size());
  }
  Status commit(size_t offset, size_t bytes) override {
    if (mprotect(static_cast<uint8_t*>(host_ptr()) + offset, bytes, PROT_READ | PROT_WRITE) != 0) {
      return Error{fmt::format("cannot commit {} bytes: {}", bytes, std::strerror(errno))};
    }
    return {};
  }
  void decommit(size_t offset, size_t bytes) override {
    // Dropping the pages returns them to the OS; PROT_NONE makes a stray access fault.
    uint8_t* p = static_cast<uint8_t*>(host_ptr()) + offset;
    (void)madvise(p, bytes, MADV_DONTNEED);
    (void)mprotect(p, bytes, PROT_NONE);
  }
};

// Host rows of an F32 tensor the KV operations read or write.
Result<float*> host_rows(const Tensor& t, const char* what) {
  if (t.host() == nullptr) {
    return Error{fmt::format("cpu backend: the {} are not in host memory", what)};
  }
  return static_cast<float*>(t.host());
}

}  // namespace

Result<std::unique_ptr<DeviceBuffer>> CpuBackend::reserve(size_t bytes) {
  if (bytes == 0) return alloc(0);
  void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return Error{
        fmt::format("cannot reserve {} bytes of address space: {}", bytes, std::strerror(errno))};
  }
  return std::unique_ptr<DeviceBuffer>(new ReservedBuffer(id(), bytes, p));
}

bool CpuBackend::supports_kv_types(uint8_t k_type, uint8_t v_type) const {
  return kv::kv_traits(planner::KvType(k_type)) != nullptr &&
         kv::kv_traits(planner::KvType(v_type)) != nullptr;
}

Status CpuBackend::kv_write(const KvWriteMetadata& m) {
  auto kp = host_rows(m.k, "K rows");
  if (!kp) return Error{kp.error()};
  auto vp = host_rows(m.v, "V rows");
  if (!vp) return Error{vp.error()};
  const int d = m.head_dim;
  const int H = m.n_head_kv;
  const int64_t k_stride = static_cast<int64_t>(m.k.row_bytes / sizeof(float));
  const int64_t v_stride = static_cast<int64_t>(m.v.row_bytes / sizeof(float));
  rows_.resize(static_cast<size_t>(m.block_size) * static_cast<size_t>(d));
  const auto n = static_cast<int64_t>(m.slots.size());
  for (int64_t i = 0; i < n;) {
    // A run of consecutive rows of one block is encoded in one call per head.
    const KvSlot& first = m.slots[static_cast<size_t>(i)];
    int cnt = 1;
    while (i + cnt < n && m.slots[static_cast<size_t>(i + cnt)].block.pool == first.block.pool &&
           m.slots[static_cast<size_t>(i + cnt)].block.block == first.block.block &&
           m.slots[static_cast<size_t>(i + cnt)].row == first.row + cnt) {
      ++cnt;
    }
    const KvPoolDesc& pool = m.pools[static_cast<size_t>(first.block.pool)];
    // Per-channel tiles carry scales over the whole tile: only whole tiles are written.
    if ((planner::is_per_channel(planner::KvType(pool.k_type)) ||
         planner::is_per_channel(planner::KvType(pool.v_type))) &&
        (first.row != 0 || cnt != m.block_size)) {
      return Error{fmt::format("cpu kv_write: {} rows at row {} of a per-channel tile of {}", cnt,
                               first.row, m.block_size)};
    }
    const kv::KvBlockView tmpl = kv::kv_pool_view(pool, d);
    const kv::KvBlockView bv =
        kv::kv_block_view(tmpl, pool, first.block.block, m.layer_in_group, H);
    auto* k_tiles = const_cast<uint8_t*>(bv.k);
    auto* v_tiles = const_cast<uint8_t*>(bv.v);
    for (int h = 0; h < H; ++h) {
      for (int pass = 0; pass < 2; ++pass) {
        const float* src = pass == 0 ? *kp + i * k_stride : *vp + i * v_stride;
        const int64_t stride = pass == 0 ? k_stride : v_stride;
        for (int r = 0; r < cnt; ++r) {
          float* row = rows_.data() + static_cast<size_t>(r) * d;
          std::memcpy(row, src + r * stride + static_cast<int64_t>(h) * d,
                      static_cast<size_t>(d) * sizeof(float));
          if (pass == 0 && m.rotate_keys) kv::hadamard_rotate(row, d);
          if (pool.round_rows_to_fp16) {
            for (int c = 0; c < d; ++c) row[c] = quant::fp16_to_fp32(quant::fp32_to_fp16(row[c]));
          }
        }
        if (pass == 0) {
          bv.tk->store(bv.gk, rows_.data(), k_tiles + h * bv.k_tile_bytes, first.row, cnt);
        } else {
          bv.tv->store(bv.gv, rows_.data(), v_tiles + h * bv.v_tile_bytes, first.row, cnt);
        }
      }
    }
    i += cnt;
  }
  return {};
}

Status CpuBackend::copy_blocks(std::span<const KvPoolDesc> pools,
                               std::span<const KvBlockCopy> copies) {
  for (const KvBlockCopy& c : copies) {
    const KvPoolDesc& ps = pools[static_cast<size_t>(c.src.pool)];
    const KvPoolDesc& pd = pools[static_cast<size_t>(c.dst.pool)];
    const auto [src_part, src_b] = ps.locate(c.src.block);
    const auto [dst_part, dst_b] = pd.locate(c.dst.block);
    const Tensor& s = ps.part(src_part);
    const Tensor& d = pd.part(dst_part);
    std::memcpy(static_cast<uint8_t*>(d.host()) + static_cast<size_t>(dst_b) * d.row_bytes,
                static_cast<const uint8_t*>(s.host()) + static_cast<size_t>(src_b) * s.row_bytes,
                std::min(s.row_bytes, d.row_bytes));
  }
  return {};
}

Status CpuBackend::quantise_blocks(std::span<const KvPoolDesc> pools,
                                   std::span<const KvBlockQuantise> moves, int n_layers_in_group,
                                   int n_head_kv, int head_dim, int block_size) {
  const int d = head_dim;
  const int H = n_head_kv;
  rows_.resize(static_cast<size_t>(block_size) * static_cast<size_t>(d));
  for (const KvBlockQuantise& q : moves) {
    const KvPoolDesc& ps = pools[static_cast<size_t>(q.src.pool)];
    const KvPoolDesc& pd = pools[static_cast<size_t>(q.dst.pool)];
    const kv::KvBlockView ts = kv::kv_pool_view(ps, d);
    const kv::KvBlockView td = kv::kv_pool_view(pd, d);
    for (int il = 0; il < n_layers_in_group; ++il) {
      const kv::KvBlockView s = kv::kv_block_view(ts, ps, q.src.block, il, H);
      const kv::KvBlockView t = kv::kv_block_view(td, pd, q.dst.block, il, H);
      auto* tk = const_cast<uint8_t*>(t.k);
      auto* tv = const_cast<uint8_t*>(t.v);
      for (int h = 0; h < H; ++h) {
        // Window rows -> fp32 staging -> body format (load is the reference decoder: storage
        // work, not attention).
        s.tk->load(s.gk, s.k + h * s.k_tile_bytes, 0, q.rows, rows_.data());
        t.tk->store(t.gk, rows_.data(), tk + h * t.k_tile_bytes, 0, q.rows);
        s.tv->load(s.gv, s.v + h * s.v_tile_bytes, 0, q.rows, rows_.data());
        t.tv->store(t.gv, rows_.data(), tv + h * t.v_tile_bytes, 0, q.rows);
      }
    }
  }
  return {};
}

Status CpuBackend::paged_attention(const AttnMetadata& m) {
  auto qp = host_rows(m.q, "queries");
  if (!qp) return Error{qp.error()};
  auto op = host_rows(m.out, "attention outputs");
  if (!op) return Error{op.error()};
  const int64_t q_stride = static_cast<int64_t>(m.q.row_bytes / sizeof(float));
  const int64_t o_stride = static_cast<int64_t>(m.out.row_bytes / sizeof(float));
  if (q_stride != static_cast<int64_t>(m.n_head) * m.head_dim || o_stride != q_stride) {
    return Error{"cpu paged_attention: queries and outputs must be contiguous rows"};
  }
  const size_t n_seq = m.q_pos0.size();
  for (size_t s = 0; s < n_seq; ++s) {
    const int32_t b0 = m.block_table_start[s];
    const int32_t b1 = m.block_table_start[s + 1];
    kv::kv_block_views(m.pools,
                       m.block_table.subspan(static_cast<size_t>(b0), static_cast<size_t>(b1 - b0)),
                       m.layer_in_group, m.n_head_kv, m.head_dim, pool_views_, views_);
    const int64_t r0 = m.query_start[s];
    const int64_t n = m.query_start[s + 1] - r0;
    attention_.run_blocks(kv::HostKvBlocks{views_, m.block_size, m.rotate_keys}, m.n_head_kv,
                          m.head_dim, m.q_pos0[s], n, *qp + r0 * q_stride, m.n_head, m.scale,
                          *op + r0 * o_stride, pool_, m.window);
  }
  return {};
}

}  // namespace bie
