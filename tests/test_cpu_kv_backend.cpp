// The CPU backend's KV data path against the reference backend's (scalar codecs, attention as the
// formula reads), through the Backend interface alone: kv_write leaves the same bytes in the
// pools (rows scattered over blocks, whole per-channel tiles, rotated keys, rows rounded to fp16
// for a mixed layout's body), quantise_blocks (window exit) the same body block, copy_blocks the
// same copy, and paged_attention over a table that mixes the FP16 and the body pool agrees to
// float rounding. Bad calls get errors, not wrong bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "bie/backend/kv_format.h"
#include "bie/planner/kv_format.h"
#include "support/reference_backend.h"

namespace bie {
namespace {

using planner::KvFormat;
using planner::KvType;

constexpr int kBlock = 16, kHeadsKv = 2, kHeads = 6, kLayers = 2, kLayer = 1, kBlocks = 6;

struct Case {
  const char* name;
  KvFormat k, v;
  int head_dim;
  bool rotate;
};

const Case kCases[] = {
    {"int8", {KvType::kInt8, 0}, {KvType::kInt8, 0}, 64, false},
    {"fp8_e4m3", {KvType::kFp8E4M3, 0}, {KvType::kFp8E4M3, 0}, 64, false},
    {"int4_asym_g32", {KvType::kInt4Asym, 32}, {KvType::kInt4Asym, 32}, 96, false},
    {"int4_asym_g64_rotated", {KvType::kInt4Asym, 64}, {KvType::kInt4Asym, 64}, 128, true},
    {"int4_recipe_rotated", {KvType::kInt4Channel, 16}, {KvType::kInt4Asym, 64}, 128, true},
    {"int8_recipe", {KvType::kInt8Channel, 16}, {KvType::kInt8, 0}, 64, false},
};

bool per_channel(const Case& c) {
  return planner::is_per_channel(c.k) || planner::is_per_channel(c.v);
}

// One pool in a backend's memory, every byte set to the same pattern on each backend.
struct Pool {
  std::unique_ptr<DeviceBuffer> buf;
  KvPoolDesc desc;
  size_t block_bytes = 0;

  Pool(Backend& be, KvFormat k, KvFormat v, int d, bool round_rows) {
    desc.k_tile_bytes = kv::kv_tile_bytes(k, d, kBlock);
    desc.v_tile_bytes = kv::kv_tile_bytes(v, d, kBlock);
    block_bytes = kLayers * kHeadsKv * (desc.k_tile_bytes + desc.v_tile_bytes);
    buf = be.alloc(block_bytes * kBlocks).value();
    auto* p = static_cast<uint8_t*>(buf->host_ptr());
    for (size_t i = 0; i < block_bytes * kBlocks; ++i) p[i] = static_cast<uint8_t>(i * 37 + 11);
    desc.memory = Tensor{
        buf.get(), 0, quant::GgmlType::I8, kBlocks, static_cast<int64_t>(block_bytes), block_bytes};
    desc.k_type = static_cast<uint8_t>(k.type);
    desc.v_type = static_cast<uint8_t>(v.type);
    desc.k_group = k.group;
    desc.v_group = v.group;
    desc.round_rows_to_fp16 = round_rows;
  }
  [[nodiscard]] std::vector<uint8_t> bytes() const {
    const auto* p = static_cast<const uint8_t*>(buf->host_ptr());
    return {p, p + block_bytes * kBlocks};
  }
};

// Both backends' pools for one case: pool 0 FP16, pool 1 the body (rounded rows: a mixed layout).
struct Side {
  Backend& be;
  std::vector<std::unique_ptr<Pool>> pools;
  std::vector<KvPoolDesc> descs;
  Side(Backend& b, const Case& c) : be(b) {
    pools.push_back(std::make_unique<Pool>(b, KvFormat{KvType::kF16, 0}, KvFormat{KvType::kF16, 0},
                                           c.head_dim, false));
    pools.push_back(std::make_unique<Pool>(b, c.k, c.v, c.head_dim, true));
    for (const auto& p : pools) descs.push_back(p->desc);
  }
  [[nodiscard]] Tensor rows(const std::vector<float>& x, int64_t n, int64_t cols,
                            std::vector<std::unique_ptr<DeviceBuffer>>& keep) const {
    keep.push_back(be.alloc(x.size() * sizeof(float)).value());
    const Tensor t = tensor_of(*keep.back(), quant::GgmlType::F32, n, cols);
    be.upload(t, x.data());
    return t;
  }
};

std::vector<float> random_rows(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& e : x) e = nd(rng);
  return x;
}

// Rows for the slots: per-token formats scattered over blocks of both pools; per-channel ones
// whole tiles of the body.
// Every row attention reads below is written.
std::vector<KvSlot> slots_for(const Case& c) {
  std::vector<KvSlot> s;
  if (!per_channel(c)) {  // block 2 in three runs, out of order
    for (int r = 3; r < 9; ++r) s.push_back({{1, 2}, r});
    for (int r = 0; r < kBlock; ++r) s.push_back({{1, 4}, r});
    for (int r = 0; r < 3; ++r) s.push_back({{1, 2}, r});
    for (int r = 9; r < kBlock; ++r) s.push_back({{1, 2}, r});
  }
  for (int r = 0; r < kBlock; ++r) s.push_back({{1, 1}, r});
  for (int r = 0; r < kBlock; ++r) s.push_back({{0, 3}, r});  // FP16 window rows
  return s;
}

// Where two byte images first differ (-1: equal).
int64_t first_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

class CpuKvBackend : public ::testing::TestWithParam<Case> {};

TEST_P(CpuKvBackend, MatchesTheReferenceBackend) {
  const Case& c = GetParam();
  const int d = c.head_dim;
  CpuBackend cpu(2);
  test::ReferenceBackend ref;
  Side a(cpu, c), b(ref, c);
  std::mt19937 rng(5);
  std::vector<std::unique_ptr<DeviceBuffer>> keep;

  // kv_write, every layer (a window exit re-encodes them all).
  const std::vector<KvSlot> slots = slots_for(c);
  const auto n = static_cast<int64_t>(slots.size());
  double vmax = 0.0;
  for (int il = 0; il < kLayers; ++il) {
    const std::vector<float> k = random_rows(rng, static_cast<size_t>(n * kHeadsKv * d));
    const std::vector<float> v = random_rows(rng, k.size());
    for (const float x : v) vmax = std::max(vmax, static_cast<double>(std::fabs(x)));
    for (Side* s : {&a, &b}) {
      KvWriteMetadata m;
      m.k = s->rows(k, n, kHeadsKv * d, keep);
      m.v = s->rows(v, n, kHeadsKv * d, keep);
      m.layer_in_group = il;
      m.n_head_kv = kHeadsKv;
      m.head_dim = d;
      m.block_size = kBlock;
      m.rotate_keys = c.rotate;
      m.pools = s->descs;
      m.slots = slots;
      ASSERT_TRUE(s->be.kv_write(m).ok()) << s->be.name();
    }
  }
  for (size_t p = 0; p < 2; ++p) {
    EXPECT_EQ(first_difference(a.pools[p]->bytes(), b.pools[p]->bytes()), -1)
        << "kv_write, pool " << p << " (block bytes " << a.pools[p]->block_bytes << ")";
  }

  // Window exit: FP16 block 3 (5 rows, every layer; a per-channel tile: all 16) into body block
  // 5; a copy of body block 1 into block 0.
  const KvBlockQuantise move{{0, 3}, {1, 5}, per_channel(c) ? kBlock : 5};
  const KvBlockCopy copy{{1, 1}, {1, 0}};
  for (Side* s : {&a, &b}) {
    ASSERT_TRUE(s->be.quantise_blocks(s->descs, {&move, 1}, kLayers, kHeadsKv, d, kBlock).ok());
    ASSERT_TRUE(s->be.copy_blocks(s->descs, {&copy, 1}).ok());
  }
  for (size_t p = 0; p < 2; ++p) {
    EXPECT_EQ(first_difference(a.pools[p]->bytes(), b.pools[p]->bytes()), -1)
        << "quantise/copy, pool " << p;
  }

  // Attention of two sequences: one over body blocks 1, 2 (rows written: 3..8) then FP16 block 3
  // (per-token formats), the other over body block 0 (the copy) and 5 (the window exit), each
  // with queries at positions its written rows cover. Per-channel cases read blocks 0 and 1.
  std::vector<KvBlockRef> table;
  std::vector<int32_t> table_start = {0};
  std::vector<int64_t> q_pos0;
  std::vector<int32_t> query_start = {0};
  const auto add_seq = [&](std::vector<KvBlockRef> blocks, int64_t pos0, int32_t nq) {
    table.insert(table.end(), blocks.begin(), blocks.end());
    table_start.push_back(static_cast<int32_t>(table.size()));
    q_pos0.push_back(pos0);
    query_start.push_back(query_start.back() + nq);
  };
  if (per_channel(c)) {
    add_seq({{1, 0}, {1, 1}}, 28, 4);
  } else {
    add_seq({{1, 1}, {1, 2}, {0, 3}}, 35, 2);  // keys 0..36
    add_seq({{1, 0}, {1, 5}}, 17, 3);          // keys 0..19: block 5's migrated rows 0..3
  }
  const int32_t nq = query_start.back();
  const std::vector<float> q = random_rows(rng, static_cast<size_t>(nq * kHeads * d));
  std::vector<std::vector<float>> outs;
  for (Side* s : {&a, &b}) {
    AttnMetadata m;
    m.q = s->rows(q, nq, kHeads * d, keep);
    m.out = s->rows(std::vector<float>(q.size()), nq, kHeads * d, keep);
    m.layer_in_group = kLayer;
    m.n_layers_in_group = kLayers;
    m.n_head = kHeads;
    m.n_head_kv = kHeadsKv;
    m.head_dim = d;
    m.block_size = kBlock;
    m.scale = 1.0f / std::sqrt(static_cast<float>(d));
    m.rotate_keys = c.rotate;
    m.pools = s->descs;
    m.query_start = query_start;
    m.q_pos0 = q_pos0;
    m.block_table_start = table_start;
    m.block_table = table;
    ASSERT_TRUE(s->be.paged_attention(m).ok()) << s->be.name();
    outs.emplace_back(q.size());
    s->be.download(m.out, outs.back().data());
  }
  // Weighted means of values of magnitude ~1 from the same bytes: fp32 against the reference's
  // fp32 scores and double softmax sums. int4_channel keys are scored with 8-bit query digits on
  // the CPU (the int8-query method, docs/kv-formats.md: each query channel moves by at most
  // max |q.s| / 32512), the reference scores them in fp32. int4_asym values are summed with
  // bf16 weights p * scale on the CPU (relative error <= 2^-8; docs/kv-formats.md): an output
  // moves by at most 2^-8 * 15 * max scale <= 2^-8 * 2 max |v| more.
  const double tol = (c.k.type == KvType::kInt4Channel ? 5e-4 : 2e-5) +
                     (c.v.type == KvType::kInt4Asym ? 0x1p-8 * 2.0 * vmax : 0.0);
  double worst = 0.0;
  for (size_t i = 0; i < q.size(); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(outs[0][i]) - outs[1][i]));
  RecordProperty("max_abs_diff", std::to_string(worst));
  for (size_t i = 0; i < q.size(); ++i) {
    ASSERT_NEAR(outs[0][i], outs[1][i], tol)
        << c.name << " output " << i << ": " << outs[0][i] << " vs " << outs[1][i];
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, CpuKvBackend, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(CpuKvBackend, RefusesWhatItCannotDoRight) {
  CpuBackend cpu(1);
  const Case c{"recipe", {KvType::kInt4Channel, 16}, {KvType::kInt4Asym, 64}, 64, false};
  Side s(cpu, c);
  std::vector<std::unique_ptr<DeviceBuffer>> keep;
  std::vector<float> rows(4 * kHeadsKv * 64, 0.5f);
  // Part of a per-channel tile: its scales span the tile.
  const std::vector<KvSlot> part = {{{1, 1}, 4}, {{1, 1}, 5}, {{1, 1}, 6}, {{1, 1}, 7}};
  KvWriteMetadata w;
  w.k = s.rows(rows, 4, kHeadsKv * 64, keep);
  w.v = w.k;
  w.layer_in_group = 0;
  w.n_head_kv = kHeadsKv;
  w.head_dim = 64;
  w.block_size = kBlock;
  w.pools = s.descs;
  w.slots = part;
  const std::vector<uint8_t> before = s.pools[1]->bytes();
  const Status st = cpu.kv_write(w);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().find("per-channel tile"), std::string::npos) << st.error();
  EXPECT_EQ(s.pools[1]->bytes(), before);
  // Queries that are not contiguous rows.
  AttnMetadata m;
  auto qb = cpu.alloc(2 * 2 * kHeads * 64 * sizeof(float)).value();
  m.q = Tensor{qb.get(), 0, quant::GgmlType::F32, 2, kHeads * 64, 2 * kHeads * 64 * sizeof(float)};
  m.out = m.q;
  m.n_head = kHeads;
  m.n_head_kv = kHeadsKv;
  m.head_dim = 64;
  m.pools = s.descs;
  const Status at = cpu.paged_attention(m);
  ASSERT_FALSE(at.ok());
  EXPECT_NE(at.error().find("contiguous"), std::string::npos) << at.error();
}

}  // namespace
}  // namespace bie
