// KV format kernels over a 4k-token context of one KV head, called as attention will: one fused
// call per 16-token block (the paged block size).
//   build/bie_kernel_bench --benchmark_filter=KvFormat
// items/s = context tokens scored (KvDot) or accumulated (KvAxpy) per second; bytes/s = packed
// K or V bytes read. Names: BM_KvDot/<format>/<head_dim>/<isa: 0 scalar, 1 avx2>.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "bie/common/cpu_features.h"
#include "bie/backend/kv_format.h"
#include "bie/backend/kv_format_rotate.h"

namespace {

using bie::planner::KvFormat;
using bie::planner::KvType;

constexpr int kContext = 4096;
constexpr int kBlock = 16;

const KvFormat kFormats[] = {
    {KvType::kF16, 0},          {KvType::kFp8E4M3, 0},   {KvType::kInt8, 0},
    {KvType::kInt4Asym, 32},    {KvType::kInt4Asym, 64}, {KvType::kInt4Asym, 128},
    {KvType::kInt4Channel, 16},
};

struct Setup {
  const bie::kv::KvFormatTraits* tr = nullptr;
  KvFormat fmt;
  bie::kv::KvRowGeom geom;
  std::vector<uint8_t> packed;  // kContext rows of one head
  size_t block_bytes = 0;
  std::vector<float> q, p, out;
};

// nullopt-like: tr == nullptr when the ISA or the shape is unavailable.
Setup make_setup(const benchmark::State& state) {
  Setup s;
  s.fmt = kFormats[state.range(0)];
  const int d = static_cast<int>(state.range(1));
  if (!bie::planner::check_kv_format(s.fmt, d).ok()) return s;
  s.tr = state.range(2) != 0 ? bie::kv::kv_traits_avx2(s.fmt.type)
                             : bie::kv::kv_traits_scalar(s.fmt.type);
  if (s.tr == nullptr) return s;
  s.geom = bie::kv::kv_row_geom(s.fmt, d);
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(kContext) * d);
  for (float& v : x) v = nd(rng);
  s.block_bytes = bie::kv::kv_tile_bytes(s.fmt, d, kBlock);
  s.packed.resize(s.block_bytes * (kContext / kBlock));
  for (int b = 0; b < kContext / kBlock; ++b) {
    s.tr->store(s.geom, x.data() + static_cast<size_t>(b) * kBlock * d,
                s.packed.data() + b * s.block_bytes, 0, kBlock);
  }
  s.q.resize(d);
  for (float& v : s.q) v = nd(rng);
  s.p.assign(kContext, 1.0f / kContext);
  s.out.resize(std::max(d, kContext));
  return s;
}

void finish(benchmark::State& state, const Setup& s) {
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * kContext);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(s.packed.size()));
  state.SetLabel(bie::planner::kv_format_name(s.fmt) + (state.range(2) ? " avx2" : " scalar"));
}

void BM_KvDot(benchmark::State& state) {
  Setup s = make_setup(state);
  if (s.tr == nullptr) return state.SkipWithError("format/ISA unavailable for this shape");
  for (auto _ : state) {
    for (int b = 0; b < kContext / kBlock; ++b) {
      s.tr->dot(s.geom, s.q.data(), s.packed.data() + b * s.block_bytes, 0, kBlock,
                s.out.data() + b * kBlock);
    }
    benchmark::DoNotOptimize(s.out.data());
    benchmark::ClobberMemory();
  }
  finish(state, s);
}

void BM_KvAxpy(benchmark::State& state) {
  Setup s = make_setup(state);
  if (s.tr == nullptr) return state.SkipWithError("format/ISA unavailable for this shape");
  for (auto _ : state) {
    for (int b = 0; b < kContext / kBlock; ++b) {
      s.tr->axpy(s.geom, s.p.data() + b * kBlock, s.packed.data() + b * s.block_bytes, 0, kBlock,
                 s.out.data());
    }
    benchmark::DoNotOptimize(s.out.data());
    benchmark::ClobberMemory();
  }
  finish(state, s);
}

// Quantising one 64-token tile of one head, as a window exit does (per 64 tokens, per layer and
// KV head): the per-token formats and the per-channel keys with their fitted grids.
const KvFormat kStoreFormats[] = {
    {KvType::kInt8, 0},
    {KvType::kInt4Asym, 64},
    {KvType::kInt4Channel, 64},
    {KvType::kInt8Channel, 64},
};

void BM_KvStoreTile(benchmark::State& state) {
  const KvFormat f = kStoreFormats[state.range(0)];
  const int d = static_cast<int>(state.range(1));
  constexpr int kTile = 64;
  const bie::kv::KvFormatTraits* tr = bie::kv::kv_traits(f.type);
  if (tr == nullptr || !bie::planner::check_kv_format(f, d).ok()) {
    return state.SkipWithError("format unavailable for this shape");
  }
  const bie::kv::KvRowGeom geom = bie::kv::kv_row_geom(f, d);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(kTile) * d);
  for (float& v : x) v = nd(rng);
  std::vector<uint8_t> tile(bie::kv::kv_tile_bytes(f, d, kTile));
  for (auto _ : state) {
    tr->store(geom, x.data(), tile.data(), 0, kTile);
    benchmark::DoNotOptimize(tile.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * kTile);
  state.SetLabel(bie::planner::kv_format_name(f));
}

void BM_KvRotate(benchmark::State& state) {
  const int d = static_cast<int>(state.range(0));
  const bool avx2 = state.range(1) != 0;
  if (avx2 && !bie::has_avx2()) return state.SkipWithError("no AVX2");
  std::vector<float> x(d, 0.5f);
  for (auto _ : state) {
    if (avx2) {
      bie::kv::hadamard_rotate_avx2(x.data(), d);
    } else {
      bie::kv::hadamard_rotate_scalar(x.data(), d);
    }
    benchmark::DoNotOptimize(x.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}

void kv_args(benchmark::internal::Benchmark* b) {
  for (int f = 0; f < static_cast<int>(std::size(kFormats)); ++f) {
    for (int d : {64, 128}) {
      if (!bie::planner::check_kv_format(kFormats[f], d).ok()) continue;
      for (int isa : {0, 1}) b->Args({f, d, isa});
    }
  }
}

BENCHMARK(BM_KvDot)->Apply(kv_args);
BENCHMARK(BM_KvAxpy)->Apply(kv_args);
BENCHMARK(BM_KvStoreTile)->ArgsProduct({{0, 1, 2, 3}, {64, 128}});
BENCHMARK(BM_KvRotate)->ArgsProduct({{64, 128}, {0, 1}});

}  // namespace
