// The quantised KV formats on the Vulkan backend (lavapipe in CI) against the CPU's scalar trait
// table (src/kv/kv_format.cpp): a row kv_write encodes on the device has the CPU store's bytes,
// bit for bit (ties, zero rows, wide exponent ranges, rows sharing a 32-bit word with a neighbour
// written in another call), and so has a per-channel tile (int4_channel's fitted grids,
// int8_channel), written whole, and a Hadamard-rotated key row; paged attention over those blocks,
// with a table that mixes an FP16 pool and a quantised body pool, matches an fp64 softmax over the
// CPU's dequantisation of the same bytes; quantise_blocks (window exit) equals the host migration
// (fp16 rows -> fp32 -> store) byte for byte.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "backend/vulkan/vulkan_backend.h"
#include "bie/backend/backend.h"
#include "bie/backend/device.h"
#include "bie/backend/kv_format.h"
#include "bie/backend/kv_format_rotate.h"
#include "bie/planner/kv_format.h"
#include "bie/quant/fp16.h"
#include "support/lavapipe.h"

namespace bie {
namespace {

using planner::KvFormat;
using planner::KvType;
using quant::GgmlType;

// Attention outputs: weighted means of dequantised values of magnitude ~1 (at most ~5), fp32
// scores, softmax and accumulation on the device against fp64 here.
constexpr double kAttnAbsTol = 5e-5;

VulkanBackend& gpu() {
  return test::shared_vulkan_backend();
}

// A K/V format pair for the body pool and the head width it is tested at; rotate: keys stored
// Hadamard-rotated (every pool's K rows, and the queries rotated to match); split: every pool
// held in parts of this many blocks, each its own device buffer (a pool larger than one binding
// spans, as on an 8 GB card at 64k), 0: one buffer.
struct FormatCase {
  const char* name;
  KvFormat k, v;
  int head_dim;
  bool rotate = false;
  int split = 0;
};

KvFormat fmt(KvType t, int group = 0) {
  KvFormat f;
  f.type = t;
  f.group = group;
  return f;
}

const FormatCase kCases[] = {
    {"int8", fmt(KvType::kInt8), fmt(KvType::kInt8), 96},
    {"fp8_e4m3", fmt(KvType::kFp8E4M3), fmt(KvType::kFp8E4M3), 64},
    {"int4_asym_g32", fmt(KvType::kInt4Asym, 32), fmt(KvType::kInt4Asym, 32), 96},
    {"int4_asym_g64", fmt(KvType::kInt4Asym, 64), fmt(KvType::kInt4Asym, 64), 128},
    {"int4_asym_g128", fmt(KvType::kInt4Asym, 128), fmt(KvType::kInt4Asym, 128), 128},
    {"k_int8_v_int4_asym_g32", fmt(KvType::kInt8), fmt(KvType::kInt4Asym, 32), 64},
    // The recipes' per-channel keys (int4_asym: K int4_channel_tB + V int4_asym_g64; int8: K
    // int8_channel_tB + V int8), and per-channel values.
    {"int4_recipe", fmt(KvType::kInt4Channel, 16), fmt(KvType::kInt4Asym, 64), 128},
    {"int8_recipe", fmt(KvType::kInt8Channel, 16), fmt(KvType::kInt8), 96},
    {"int4_channel_kv", fmt(KvType::kInt4Channel, 16), fmt(KvType::kInt4Channel, 16), 64},
    {"int8_channel_kv", fmt(KvType::kInt8Channel, 16), fmt(KvType::kInt8Channel, 16), 64},
    // The per-token 4-bit recipe rotates its keys (int4_asym_gN, --kv-rotate by default).
    {"int4_asym_g64_rotated", fmt(KvType::kInt4Asym, 64), fmt(KvType::kInt4Asym, 64), 128, true},
    {"int8_rows_rotated", fmt(KvType::kInt8), fmt(KvType::kInt8), 64, true},
    // The recipes with --kv-rotate: per-channel tiles fitted over rotated key rows.
    {"int4_recipe_rotated", fmt(KvType::kInt4Channel, 16), fmt(KvType::kInt4Asym, 64), 128, true},
    {"int8_recipe_rotated", fmt(KvType::kInt8Channel, 16), fmt(KvType::kInt8), 64, true},
    // Pools in four buffers of two blocks: every kernel finds each block in its part.
    {"int8_split", fmt(KvType::kInt8), fmt(KvType::kInt8), 96, false, 2},
    {"int4_recipe_split", fmt(KvType::kInt4Channel, 16), fmt(KvType::kInt4Asym, 64), 128, false, 2},
    {"int4_asym_g64_rotated_split", fmt(KvType::kInt4Asym, 64), fmt(KvType::kInt4Asym, 64), 128,
     true, 2},
};

bool whole_tiles(const FormatCase& c) {
  return planner::is_per_channel(c.k) || planner::is_per_channel(c.v);
}

constexpr int kBlock = 16, kHeadsKv = 3, kHeads = 9, kLayers = 2, kLayer = 1, kBlocks = 8;

// One pool in device memory with its host twin (what the CPU's store writes).
struct Pool {
  KvFormat k, v;
  int d = 0;
  size_t k_tile = 0, v_tile = 0, layer_bytes = 0, block_bytes = 0;
  std::vector<std::unique_ptr<DeviceBuffer>> bufs;  // one per part
  KvPoolDesc desc;
  std::vector<uint8_t> host;

  bool rotate = false;  // K rows Hadamard-rotated before they are stored
  int split = 0;        // blocks per part; 0: one buffer

  int n_blocks = kBlocks;

  Pool(KvFormat kf, KvFormat vf, int head_dim, bool round_rows, bool rotate_keys = false,
       int split_blocks = 0, int blocks = kBlocks)
      : k(kf), v(vf), d(head_dim), rotate(rotate_keys), split(split_blocks), n_blocks(blocks) {
    k_tile = kv::kv_tile_bytes(k, d, kBlock);
    v_tile = kv::kv_tile_bytes(v, d, kBlock);
    layer_bytes = kHeadsKv * (k_tile + v_tile);
    block_bytes = kLayers * layer_bytes;
    // A split pool has kMaxKvPoolParts parts at most: longer pools take longer parts.
    const int per_part =
        split > 0 ? std::max(split, (n_blocks + kMaxKvPoolParts - 1) / kMaxKvPoolParts) : n_blocks;
    desc.part_blocks = split > 0 ? per_part : 0;
    for (int first = 0, i = 0; first < n_blocks; first += per_part, ++i) {
      const int n = std::min(per_part, n_blocks - first);
      bufs.push_back(gpu().alloc(block_bytes * n).value());
      const Tensor t{bufs.back().get(), 0, GgmlType::I8, n, static_cast<int64_t>(block_bytes),
                     block_bytes};
      (i == 0 ? desc.memory : desc.more_parts.at(static_cast<size_t>(i - 1))) = t;
    }
    desc.k_type = static_cast<uint8_t>(k.type);
    desc.v_type = static_cast<uint8_t>(v.type);
    desc.k_group = k.group;
    desc.v_group = v.group;
    desc.k_tile_bytes = k_tile;
    desc.v_tile_bytes = v_tile;
    desc.round_rows_to_fp16 = round_rows;
    // Both start as the same non-zero pattern: bytes a write must not touch stay as they were.
    host.resize(block_bytes * static_cast<size_t>(n_blocks));
    for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(i * 37 + 11);
    size_t at = 0;
    for (int i = 0; i < desc.n_parts(); ++i) {
      gpu().upload(desc.part(i), host.data() + at);
      at += desc.part(i).bytes();
    }
  }
  uint8_t* tile(int block, int head, bool is_v, int layer = kLayer) {
    return host.data() + static_cast<size_t>(block) * block_bytes + layer * layer_bytes +
           (is_v ? kHeadsKv * k_tile + head * v_tile : head * k_tile);
  }
  std::vector<uint8_t> device_bytes() {  // the parts in block order
    std::vector<uint8_t> b(host.size());
    size_t at = 0;
    for (int i = 0; i < desc.n_parts(); ++i) {
      gpu().download(desc.part(i), b.data() + at);
      at += desc.part(i).bytes();
    }
    return b;
  }
  // The CPU's scalar store of row `row` of (block, head) from x[d], as PagedKvStore::store does;
  // a per-channel tile is stored whole when its last row arrives (rows come in order).
  void store(int block, int row, int head, bool is_v, const float* x, int layer) {
    std::vector<float> r(x, x + d);
    if (!is_v && rotate) kv::hadamard_rotate_scalar(r.data(), d);
    if (desc.round_rows_to_fp16) {
      for (float& e : r) e = quant::fp16_to_fp32(quant::fp32_to_fp16(e));
    }
    const KvFormat f = is_v ? v : k;
    if (!planner::is_per_channel(f)) {
      kv::kv_traits_scalar(f.type)->store(kv::kv_row_geom(f, d), r.data(),
                                          tile(block, head, is_v, layer), row, 1);
      return;
    }
    std::vector<float>& t = pending[{block, head, is_v, layer}];
    t.resize(static_cast<size_t>(kBlock) * d);
    std::copy(r.begin(), r.end(), t.begin() + static_cast<ptrdiff_t>(row) * d);
    if (row == kBlock - 1) {
      kv::kv_traits_scalar(f.type)->store(kv::kv_row_geom(f, d), t.data(),
                                          tile(block, head, is_v, layer), 0, kBlock);
    }
  }
  std::map<std::tuple<int, int, bool, int>, std::vector<float>> pending;
};

struct Holder {
  std::vector<std::unique_ptr<DeviceBuffer>> bufs;
  Tensor f32(const std::vector<float>& v, int64_t rows, int64_t cols) {
    bufs.push_back(gpu().alloc(v.size() * 4).value());
    Tensor t = tensor_of(*bufs.back(), GgmlType::F32, rows, cols);
    gpu().upload(t, v.data());
    return t;
  }
  std::vector<float> read(const Tensor& t) {
    std::vector<float> v(t.bytes() / 4);
    gpu().download(t, v.data());
    return v;
  }
};

// Rows that probe every rounding step: gaussian rows at scales 1e-4 .. 1e4, exact ties of each
// code grid (int8: amax 127 so the scale is 1 and x.5 are ties; int4: min 0, max 15; fp8: amax
// 448, values halfway between e4m3 neighbours), an all-zero row and a constant row.
std::vector<float> probe_rows(int n, int d, uint32_t seed, bool gaussian_only = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(-4.0f, 4.0f);
  std::vector<float> x(static_cast<size_t>(n) * d);
  for (int r = 0; r < n; ++r) {
    float* row = x.data() + static_cast<size_t>(r) * d;
    const int kind = gaussian_only ? 7 : r % 8;
    const float sc = gaussian_only ? 1.0f : std::pow(10.0f, ud(rng));
    for (int i = 0; i < d; ++i) {
      switch (kind) {
        case 0:  // int8 ties: scale 1, codes +-(k + 0.5)
          row[i] = i == 0 ? 127.0f : static_cast<float>((i % 11) - 5) + 0.5f;
          break;
        case 1:  // int4 ties: min 0, max 15, values k + 0.5
          row[i] = i % 32 == 0 ? 0.0f : i % 32 == 1 ? 15.0f : static_cast<float>(i % 15) + 0.5f;
          break;
        case 2:  // fp8 ties: amax 448 (scale 1), midpoints of e4m3 neighbours
          row[i] = i == 0 ? -448.0f
                          : (1.0f + 0.0625f * static_cast<float>(2 * (i % 8) + 1)) *
                                std::ldexp(1.0f, (i % 13) - 6);
          break;
        case 3:
          row[i] = 0.0f;
          break;
        case 4:
          row[i] = 0.75f;
          break;
        default:
          row[i] = nd(rng) * sc;
      }
    }
  }
  return x;
}

// Slots of positions row0 .. row0 + n - 1 of a sequence whose logical blocks are `blocks` of
// `pool`.
std::vector<KvSlot> slot_run(int pool, const std::vector<int>& blocks, int row0, int n) {
  std::vector<KvSlot> s;
  for (int i = 0; i < n; ++i) {
    const int j = row0 + i;
    s.push_back({{pool, blocks[static_cast<size_t>(j / kBlock)]}, j % kBlock});
  }
  return s;
}

// kv_write of random rows into `slots` on the device, and the CPU's store of the same rows into
// the host twins.
void write_rows(Holder& h, std::span<const KvPoolDesc> pools, std::vector<Pool*> host,
                const std::vector<KvSlot>& slots, int d, uint32_t seed, bool gaussian = false,
                int layer = kLayer) {
  const int kvw = kHeadsKv * d;
  const auto n = static_cast<int64_t>(slots.size());
  const std::vector<float> K = probe_rows(static_cast<int>(n) * kHeadsKv, d, seed, gaussian);
  const std::vector<float> V = probe_rows(static_cast<int>(n) * kHeadsKv, d, seed + 1, gaussian);
  KvWriteMetadata wm;
  wm.k = h.f32(K, n, kvw);
  wm.v = h.f32(V, n, kvw);
  wm.layer_in_group = layer;
  wm.n_head_kv = kHeadsKv;
  wm.head_dim = d;
  wm.block_size = kBlock;
  wm.pools = pools;
  wm.slots = slots;
  wm.rotate_keys = host[0]->rotate;
  ASSERT_TRUE(gpu().kv_write(wm).ok()) << gpu().status().error();
  for (int64_t t = 0; t < n; ++t) {
    const KvSlot& s = slots[static_cast<size_t>(t)];
    for (int hh = 0; hh < kHeadsKv; ++hh) {
      Pool& p = *host[static_cast<size_t>(s.block.pool)];
      p.store(s.block.block, s.row, hh, false, K.data() + t * kvw + hh * d, layer);
      p.store(s.block.block, s.row, hh, true, V.data() + t * kvw + hh * d, layer);
    }
  }
}

// The first differing byte of a pool, as "block b layer l K/V head h byte i".
std::string first_diff(const Pool& p, const std::vector<uint8_t>& got) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == p.host[i]) continue;
    const size_t blk = i / p.block_bytes, in_blk = i % p.block_bytes;
    const size_t layer = in_blk / p.layer_bytes, in_layer = in_blk % p.layer_bytes;
    const bool is_v = in_layer >= kHeadsKv * p.k_tile;
    const size_t tile = is_v ? p.v_tile : p.k_tile;
    const size_t at = is_v ? in_layer - kHeadsKv * p.k_tile : in_layer;
    return "block " + std::to_string(blk) + " layer " + std::to_string(layer) +
           (is_v ? " V" : " K") + " head " + std::to_string(at / tile) + " byte " +
           std::to_string(at % tile) + ": device " + std::to_string(got[i]) + ", cpu " +
           std::to_string(p.host[i]);
  }
  return "";
}

class VulkanKvFormat : public ::testing::TestWithParam<FormatCase> {};

TEST_P(VulkanKvFormat, KvWriteIsByteIdenticalToTheCpuStore) {
  const FormatCase& c = GetParam();
  for (const bool round_rows : {false, true}) {
    Holder h;
    Pool body(c.k, c.v, c.head_dim, round_rows, c.rotate, c.split);
    const KvPoolDesc pools[] = {body.desc};
    if (whole_tiles(c)) {  // per-channel tiles: whole blocks, two in one call, then one
      // Rotated keys: the two tiles' rows rotated in one round, then (rows rounded) one by one.
      gpu().set_rotated_tiles_per_round(round_rows ? 1 : 0);
      write_rows(h, pools, {&body}, slot_run(0, {7, 1}, 0, 2 * kBlock), c.head_dim, 7);
      gpu().set_rotated_tiles_per_round(0);
      write_rows(h, pools, {&body}, slot_run(0, {3}, 0, kBlock), c.head_dim, 9);
      const std::vector<uint8_t> got = body.device_bytes();
      EXPECT_TRUE(got == body.host) << c.name << (round_rows ? " (rows rounded to fp16)" : "")
                                    << ": first difference at " << first_diff(body, got);
      continue;
    }
    write_rows(h, pools, {&body}, slot_run(0, {7, 1}, 0, 2 * kBlock - 3), c.head_dim, 7);
    write_rows(h, pools, {&body}, slot_run(0, {3}, 5, 7), c.head_dim, 9);  // neighbours' words
    write_rows(h, pools, {&body}, slot_run(0, {7, 1}, 2 * kBlock - 3, 3), c.head_dim, 11);
    const std::vector<uint8_t> got = body.device_bytes();
    EXPECT_TRUE(got == body.host) << c.name << (round_rows ? " (rows rounded to fp16)" : "")
                                  << ": first difference at " << first_diff(body, got);
  }
}

// fp64 reference of one query head: softmax over keys [first, pos] of its sequence, values
// dequantised from the CPU's bytes.
struct HostSeq {
  std::vector<std::pair<Pool*, int>> blocks;  // (pool, block) per logical block
};
std::vector<float> deq_row(Pool& p, int block, int row, int head, bool is_v) {
  const KvFormat f = is_v ? p.v : p.k;
  std::vector<float> y(static_cast<size_t>(p.d));
  kv::kv_traits_scalar(f.type)->load(kv::kv_row_geom(f, p.d), p.tile(block, head, is_v), row, 1,
                                     y.data());
  return y;
}

// Paged attention of kHeads query heads over kHeadsKv KV heads of layer kLayer, with the given
// pools, sequences and table; q and out set by the caller.
AttnMetadata attn_meta(int d, bool rotate, int64_t window, std::span<const KvPoolDesc> pools,
                       const std::vector<int32_t>& query_start, const std::vector<int64_t>& q_pos0,
                       const std::vector<int32_t>& table_start,
                       const std::vector<KvBlockRef>& table) {
  AttnMetadata am;
  am.layer_in_group = kLayer;
  am.n_layers_in_group = kLayers;
  am.n_head = kHeads;
  am.n_head_kv = kHeadsKv;
  am.head_dim = d;
  am.block_size = kBlock;
  am.scale = 1.0f / std::sqrt(static_cast<float>(d));
  am.window = window;
  am.rotate_keys = rotate;
  am.pools = pools;
  am.query_start = query_start;
  am.q_pos0 = q_pos0;
  am.block_table_start = table_start;
  am.block_table = table;
  return am;
}

// The largest difference between the device's attention output `got` ([token][head][d]) and an
// fp64 softmax over the CPU's dequantisation of the same blocks (relative above magnitude 1).
// qr: the queries as the CPU's runner reads them (rotated when the keys are); tables: each
// sequence's logical blocks (pool 0: f16, 1: body).
double worst_vs_fp64(const std::vector<float>& got, const std::vector<float>& qr,
                     const std::vector<std::vector<KvBlockRef>>& tables,
                     const std::vector<int32_t>& query_start, const std::vector<int64_t>& q_pos0,
                     int64_t window, int d, Pool& f16, Pool& body) {
  const int qw = kHeads * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const auto f16r = [](float x) { return quant::fp16_to_fp32(quant::fp32_to_fp16(x)); };
  double worst = 0;
  for (size_t s = 0; s < tables.size(); ++s) {
    for (int32_t t = query_start[s]; t < query_start[s + 1]; ++t) {
      const int64_t pos = q_pos0[s] + (t - query_start[s]);
      const int64_t first = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
      for (int kvh = 0; kvh < kHeadsKv; ++kvh) {
        std::vector<std::vector<float>> keys, vals;
        std::vector<bool> kf16;  // the CPU's f16 path rounds q
        for (int64_t j = first; j <= pos; ++j) {
          const KvBlockRef r = tables[s][static_cast<size_t>(j / kBlock)];
          Pool& p = r.pool == 0 ? f16 : body;
          const int row = static_cast<int>(j % kBlock);
          keys.push_back(deq_row(p, r.block, row, kvh, false));
          vals.push_back(deq_row(p, r.block, row, kvh, true));
          kf16.push_back(p.k.type == KvType::kF16);
        }
        for (int qh = kvh * (kHeads / kHeadsKv); qh < (kvh + 1) * (kHeads / kHeadsKv); ++qh) {
          std::vector<double> sc;
          double mx = -1e300;
          for (size_t j = 0; j < keys.size(); ++j) {
            double dot = 0;
            for (int i = 0; i < d; ++i) {
              const float qx = qr[static_cast<size_t>(t) * qw + qh * d + i];
              dot += static_cast<double>(kf16[j] ? f16r(qx) : qx) * keys[j][static_cast<size_t>(i)];
            }
            sc.push_back(dot * scale);
            mx = std::max(mx, sc.back());
          }
          double l = 0;
          for (double& x : sc) l += (x = std::exp(x - mx));
          for (int i = 0; i < d; ++i) {
            double o = 0;
            for (size_t j = 0; j < sc.size(); ++j) o += sc[j] * vals[j][static_cast<size_t>(i)];
            const double g = got[static_cast<size_t>(t) * qw + qh * d + i];
            worst = std::max(worst, std::fabs(g - o / l) / std::max(1.0, std::fabs(o / l)));
          }
        }
      }
    }
  }
  return worst;
}

TEST_P(VulkanKvFormat, PagedAttentionOverMixedPoolsMatchesFp64OverTheCpuBlocks) {
  const FormatCase& c = GetParam();
  const int d = c.head_dim;
  Holder h;
  Pool f16(fmt(KvType::kF16), fmt(KvType::kF16), d, false, c.rotate, c.split);
  Pool body(c.k, c.v, d, true, c.rotate, c.split);
  const KvPoolDesc pools[] = {f16.desc, body.desc};
  // Three sequences; each logical block names its pool (sink block in FP16, body quantised,
  // the last block FP16 again as a window would be): A 40 tokens, B 20, C 7 (FP16 only).
  const std::vector<std::vector<KvBlockRef>> tables = {
      {{0, 2}, {1, 4}, {0, 5}}, {{1, 1}, {0, 0}}, {{0, 3}}};
  const std::vector<int64_t> lens = {40, 20, 7};
  std::vector<KvSlot> slots;
  for (size_t s = 0; s < tables.size(); ++s) {
    for (int64_t j = 0; j < lens[s]; ++j) {
      slots.push_back(
          {tables[s][static_cast<size_t>(j / kBlock)], static_cast<int32_t>(j % kBlock)});
    }
  }
  write_rows(h, pools, {&f16, &body}, slots, d, 21, true);
  ASSERT_TRUE(f16.device_bytes() == f16.host) << first_diff(f16, f16.device_bytes());
  ASSERT_TRUE(body.device_bytes() == body.host) << first_diff(body, body.device_bytes());

  // Queries: A prefills positions 35..39, B decodes 19, C decodes 6.
  const std::vector<int64_t> q_pos0 = {35, 19, 6};
  const std::vector<int32_t> query_start = {0, 5, 6, 7};
  std::vector<KvBlockRef> table;
  std::vector<int32_t> table_start = {0};
  for (const auto& t : tables) {
    table.insert(table.end(), t.begin(), t.end());
    table_start.push_back(static_cast<int32_t>(table.size()));
  }
  const int qw = kHeads * d;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> qv(7 * static_cast<size_t>(qw));
  for (float& x : qv) x = nd(rng);
  // The CPU's runner rotates each query head when the keys are rotated; the reference reads those.
  std::vector<float> qr = qv;
  if (c.rotate) {
    for (size_t r = 0; r < qr.size() / d; ++r) kv::hadamard_rotate_scalar(qr.data() + r * d, d);
  }
  for (int64_t window : {int64_t{0}, int64_t{5}}) {
    AttnMetadata am =
        attn_meta(d, c.rotate, window, pools, query_start, q_pos0, table_start, table);
    am.q = h.f32(qv, 7, qw);
    am.out = h.f32(std::vector<float>(qv.size(), 0.0f), 7, qw);
    ASSERT_TRUE(gpu().paged_attention(am).ok()) << gpu().status().error();
    const double worst =
        worst_vs_fp64(h.read(am.out), qr, tables, query_start, q_pos0, window, d, f16, body);
    EXPECT_LE(worst, kAttnAbsTol) << c.name << " window " << window;
    std::printf("%s window %lld: max |device - fp64| = %.3g\n", c.name,
                static_cast<long long>(window), worst);
  }
}

// A long context cut into splits (attn_split.glsl; the shortest split lowered to 64 keys, so 640
// keys make 10 splits and a 300-key window 5): the split pass (a workgroup per split, merged by
// attn_split_merge.comp) gives the bits one workgroup per token gives, a token decoded alone
// gives the bits it gets inside a batch, and both stay within the fp64 reference's tolerance.
TEST_P(VulkanKvFormat, AttentionSplitsGiveTheSameBitsInOneWorkgroupOrManyAndInAnyBatch) {
  const FormatCase& c = GetParam();
  const int d = c.head_dim;
  constexpr int kLongBlocks = 40, kLen = kLongBlocks * kBlock, kQ = 4;
  Holder h;
  Pool f16(fmt(KvType::kF16), fmt(KvType::kF16), d, false, c.rotate, c.split, kLongBlocks);
  Pool body(c.k, c.v, d, true, c.rotate, c.split, kLongBlocks);
  const KvPoolDesc pools[] = {f16.desc, body.desc};
  // Sink block and the last two blocks FP16, the body quantised (as a mixed regime lays it out).
  std::vector<KvBlockRef> seq;
  for (int b = 0; b < kLongBlocks; ++b) seq.push_back({b == 0 || b >= kLongBlocks - 2 ? 0 : 1, b});
  std::vector<KvSlot> slots;
  for (int j = 0; j < kLen; ++j) slots.push_back({seq[j / kBlock], j % kBlock});
  write_rows(h, pools, {&f16, &body}, slots, d, 51, true);
  const std::vector<int32_t> table_start = {0, kLongBlocks};

  const int qw = kHeads * d;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> qv(static_cast<size_t>(kQ) * qw);
  for (float& x : qv) x = nd(rng);
  std::vector<float> qr = qv;
  if (c.rotate) {
    for (size_t r = 0; r < qr.size() / d; ++r) kv::hadamard_rotate_scalar(qr.data() + r * d, d);
  }
  struct Restore {
    ~Restore() { gpu().set_attention_splits(256, true); }
  } restore;
  // Query rows [t0, t0 + n) at positions kLen - kQ + t0 ..: the output rows and the dispatches.
  const auto attend = [&](int t0, int n, int64_t window, bool split_pass) {
    gpu().set_attention_splits(64, split_pass);
    const std::vector<int32_t> query_start = {0, n};
    const std::vector<int64_t> q_pos0 = {kLen - kQ + t0};
    AttnMetadata am = attn_meta(d, c.rotate, window, pools, query_start, q_pos0, table_start, seq);
    am.q = h.f32(std::vector<float>(qv.begin() + t0 * qw, qv.begin() + (t0 + n) * qw), n, qw);
    am.out = h.f32(std::vector<float>(static_cast<size_t>(n) * qw, 0.0f), n, qw);
    const uint64_t before = gpu().device().dispatch_count();
    EXPECT_TRUE(gpu().paged_attention(am).ok()) << gpu().status().error();
    const uint64_t dispatches = gpu().device().dispatch_count() - before;
    return std::make_pair(h.read(am.out), dispatches);
  };
  for (int64_t window : {int64_t{0}, int64_t{300}}) {
    const auto [one, one_dispatches] = attend(0, kQ, window, false);
    const auto [many, many_dispatches] = attend(0, kQ, window, true);
    EXPECT_EQ(one_dispatches, 1u);   // one workgroup per (token, heads)
    EXPECT_EQ(many_dispatches, 2u);  // the splits, then their merge
    EXPECT_EQ(0, std::memcmp(one.data(), many.data(), one.size() * sizeof(float)))
        << c.name << " window " << window << ": the split pass changed the output";
    for (int t = 0; t < kQ; ++t) {  // each token alone, as a decode step runs it
      const std::vector<float> alone = attend(t, 1, window, true).first;
      EXPECT_EQ(0, std::memcmp(alone.data(), many.data() + static_cast<size_t>(t) * qw,
                               alone.size() * sizeof(float)))
          << c.name << " window " << window << " token " << t << ": alone differs from the batch";
    }
    const double worst = worst_vs_fp64(many, qr, {seq}, {0, kQ}, {kLen - kQ}, window, d, f16, body);
    EXPECT_LE(worst, kAttnAbsTol) << c.name << " window " << window;
    std::printf("%s %d keys window %lld: max |device - fp64| = %.3g\n", c.name, kLen,
                static_cast<long long>(window), worst);
  }
}

TEST_P(VulkanKvFormat, QuantiseBlocksIsByteIdenticalToTheHostMigration) {
  const FormatCase& c = GetParam();
  const int d = c.head_dim;
  Holder h;
  Pool f16(fmt(KvType::kF16), fmt(KvType::kF16), d, false, c.rotate, c.split);
  Pool body(c.k, c.v, d, true, c.rotate, c.split);
  const KvPoolDesc pools[] = {f16.desc, body.desc};
  // FP16 blocks 1 (full) and 4 (5 rows written; full for per-channel tiles, which move whole)
  // leave the window into body blocks 2 and 0.
  const int rows4 = whole_tiles(c) ? kBlock : 5;
  std::vector<KvSlot> slots = slot_run(0, {1}, 0, kBlock);
  const std::vector<KvSlot> part = slot_run(0, {4}, 0, rows4);
  slots.insert(slots.end(), part.begin(), part.end());
  for (int il = 0; il < kLayers; ++il) {  // every layer of the group migrates
    write_rows(h, pools, {&f16, &body}, slots, d, 31 + 2 * il, false, il);
  }
  const KvBlockQuantise moves[] = {{{0, 1}, {1, 2}, kBlock}, {{0, 4}, {1, 0}, rows4}};
  ASSERT_TRUE(gpu().quantise_blocks(pools, moves, kLayers, kHeadsKv, d, kBlock).ok())
      << gpu().status().error();
  // The host migration (PagedKvStore::quantise_block): every layer's tiles, fp16 -> fp32 ->
  // the body format's store.
  const kv::KvRowGeom g16 = kv::kv_row_geom(planner::kKvF16, d);
  std::vector<float> rows(static_cast<size_t>(kBlock) * d);
  for (const KvBlockQuantise& m : moves) {
    for (int il = 0; il < kLayers; ++il) {
      for (int hh = 0; hh < kHeadsKv; ++hh) {
        for (const bool is_v : {false, true}) {
          const size_t src_off = static_cast<size_t>(m.src.block) * f16.block_bytes +
                                 il * f16.layer_bytes +
                                 (is_v ? kHeadsKv * f16.k_tile + hh * f16.v_tile : hh * f16.k_tile);
          const size_t dst_off =
              static_cast<size_t>(m.dst.block) * body.block_bytes + il * body.layer_bytes +
              (is_v ? kHeadsKv * body.k_tile + hh * body.v_tile : hh * body.k_tile);
          kv::kv_traits_scalar(KvType::kF16)
              ->load(g16, f16.host.data() + src_off, 0, m.rows, rows.data());
          const KvFormat f = is_v ? body.v : body.k;
          kv::kv_traits_scalar(f.type)->store(kv::kv_row_geom(f, d), rows.data(),
                                              body.host.data() + dst_off, 0, m.rows);
        }
      }
    }
  }
  const std::vector<uint8_t> got = body.device_bytes();
  EXPECT_TRUE(got == body.host) << c.name << ": first difference at " << first_diff(body, got);
}

INSTANTIATE_TEST_SUITE_P(KvFormats, VulkanKvFormat, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

// copy_blocks (copy-on-write of a shared prefix block) between and within the buffers of split
// pools, byte for byte; nothing else changes.
TEST(VulkanKvFormat, CopyBlocksMovesBlocksBetweenThePartsOfASplitPool) {
  Pool f16(fmt(KvType::kF16), fmt(KvType::kF16), 64, false, false, 2);    // parts of 2 blocks
  Pool int8(fmt(KvType::kInt8), fmt(KvType::kInt8), 64, true, false, 3);  // 3, 3 and 2
  ASSERT_EQ(f16.desc.n_parts(), 4);
  ASSERT_EQ(int8.desc.n_parts(), 3);
  const KvPoolDesc pools[] = {f16.desc, int8.desc};
  const KvBlockCopy copies[] = {
      {{0, 1}, {0, 6}}, {{0, 2}, {0, 3}}, {{1, 7}, {1, 0}}, {{1, 4}, {1, 5}}};
  ASSERT_TRUE(gpu().copy_blocks(pools, copies).ok()) << gpu().status().error();
  for (const KvBlockCopy& c : copies) {
    Pool& p = c.src.pool == 0 ? f16 : int8;
    std::memcpy(p.host.data() + static_cast<size_t>(c.dst.block) * p.block_bytes,
                p.host.data() + static_cast<size_t>(c.src.block) * p.block_bytes, p.block_bytes);
  }
  for (Pool* p : {&f16, &int8}) {
    const std::vector<uint8_t> got = p->device_bytes();
    EXPECT_TRUE(got == p->host) << "first difference at " << first_diff(*p, got);
  }
}

// A per-channel tile's scales span the block: a write that gives a block only some of its rows
// (or rows out of order) is refused with the block named, and writes nothing.
TEST(VulkanKvFormat, PerChannelTilesAreWrittenWhole) {
  Holder h;
  Pool body(fmt(KvType::kInt4Channel, 16), fmt(KvType::kInt4Asym, 64), 64, true);
  const KvPoolDesc pools[] = {body.desc};
  const std::vector<uint8_t> before = body.device_bytes();
  for (const std::vector<KvSlot>& slots :
       {slot_run(0, {2}, 5, 7), slot_run(0, {2, 5}, 8, kBlock), slot_run(0, {3}, 0, kBlock - 1)}) {
    const auto n = static_cast<int64_t>(slots.size());
    const std::vector<float> rows(static_cast<size_t>(n) * kHeadsKv * 64, 0.5f);
    KvWriteMetadata wm;
    wm.k = h.f32(rows, n, kHeadsKv * 64);
    wm.v = h.f32(rows, n, kHeadsKv * 64);
    wm.layer_in_group = kLayer;
    wm.n_head_kv = kHeadsKv;
    wm.head_dim = 64;
    wm.block_size = kBlock;
    wm.pools = pools;
    wm.slots = slots;
    const Status st = gpu().kv_write(wm);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.error().find("written whole"), std::string::npos) << st.error();
  }
  EXPECT_TRUE(gpu().status().ok());
  EXPECT_TRUE(body.device_bytes() == before);
}

TEST(VulkanKvFormat, SupportsEveryBieFormatAndRefusesLlamaCpps) {
  const auto id = [](KvType t) { return static_cast<uint8_t>(t); };
  VulkanBackend& be = gpu();
  for (KvType t : {KvType::kF16, KvType::kFp8E4M3, KvType::kInt8, KvType::kInt4Asym,
                   KvType::kInt4Channel, KvType::kInt8Channel}) {
    EXPECT_TRUE(be.supports_kv_types(id(t), id(t))) << static_cast<int>(t);
  }
  EXPECT_TRUE(be.supports_kv_types(id(KvType::kInt8), id(KvType::kInt4Asym)));
  EXPECT_TRUE(be.supports_kv_types(id(KvType::kInt4Channel), id(KvType::kInt4Asym)));
  for (KvType t : {KvType::kQ8_0, KvType::kQ4_0}) {
    EXPECT_FALSE(be.supports_kv_types(id(t), id(KvType::kInt8))) << static_cast<int>(t);
    EXPECT_FALSE(be.supports_kv_types(id(KvType::kInt8), id(t))) << static_cast<int>(t);
  }
}

}  // namespace
}  // namespace bie
