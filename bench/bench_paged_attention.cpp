// Decode attention through PagedKvCache at SmolLM2-135M geometry (30 layers, 3 KV heads, GQA
// group 3, head_dim 64, blocks of 16): one token's attention over all 30 layers at a given
// depth, per KV regime and thread count.
//   build/bie_kernel_bench --benchmark_filter=PagedAttnDecode --benchmark_repetitions=5
//     --benchmark_report_aggregates_only=true   (one command line)
// Names: BM_PagedAttnDecode/<regime>/<depth>/<threads>; regimes 0 f16, 1 int8, 2 fp8_e4m3,
// 3 int4_asym_g64 + rotate (--kv-cache-dtype int4_asym), 4 K int4_channel_t16 / V int4_asym_g64.
// Quantised regimes keep the default FP16 sink (8) and window (128). bytes/s counts the K/V
// bytes one token's attention reads. BM_PagedAttnDecodeCold: the same from DRAM (see there).
#include <benchmark/benchmark.h>

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/paged_attention_runner.h"
#include "bie/kv/paged_kv_cache.h"
#include "bie/planner/kv_bytes.h"
#include "bie/planner/kv_layout_flags.h"

namespace {

constexpr int kLayers = 30, kHeadsKv = 3, kHeads = 9, kHeadDim = 64;

struct Regime {
  const char* k;
  const char* v;
  bool rotate;
};
const Regime kRegimes[] = {
    {"f16", "f16", false},
    {"int8", "int8", false},
    {"fp8_e4m3", "fp8_e4m3", false},
    {"int4_asym_g64", "int4_asym_g64", true},
    {"int4_channel_t16", "int4_asym_g64", false},
};

// A cache of `depth` tokens of random K/V in every layer, window exits migrated; null on failure.
std::unique_ptr<bie::PagedKvCache> filled_cache(const bie::KvGeometry& geo,
                                                const bie::planner::KvLayout& layout,
                                                int64_t depth) {
  bie::PagedKvCacheConfig cfg;
  cfg.geometry = geo;
  cfg.layout = layout;
  cfg.max_tokens = depth;
  auto r = bie::PagedKvCache::create(cfg);
  if (!r.ok()) return nullptr;
  std::unique_ptr<bie::PagedKvCache> c = std::move(r).value();
  if (!c->append(depth).ok()) return nullptr;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> k(static_cast<size_t>(depth) * geo.kv_dim()), v(k.size());
  for (int il = 0; il < geo.n_layer; ++il) {
    for (float& x : k) x = nd(rng);
    for (float& x : v) x = nd(rng);
    c->store(il, 0, depth, k.data(), v.data());
  }
  if (!c->migrate_window_exits().ok()) return nullptr;
  return c;
}

// One filled cache per (regime, depth), shared by the thread counts.
bie::PagedKvCache* cache_for(int regime, int64_t depth) {
  static std::map<std::pair<int, int64_t>, std::unique_ptr<bie::PagedKvCache>> caches;
  auto& slot = caches[{regime, depth}];
  if (!slot) {
    bie::planner::KvLayout layout;
    layout.k = bie::planner::parse_kv_format(kRegimes[regime].k).value();
    layout.v = bie::planner::parse_kv_format(kRegimes[regime].v).value();
    layout.rotate = kRegimes[regime].rotate;
    slot = filled_cache(bie::KvGeometry{kLayers, kHeadsKv, kHeadDim, {}}, layout, depth);
  }
  return slot.get();
}

// Times one token's attention (the cache's last position) over every layer of `c`, with random
// queries for n_head heads.
void time_decode(benchmark::State& state, bie::PagedKvCache& c, int n_head, float scale) {
  const bie::KvGeometry& geo = c.geometry();
  const int64_t pos = c.n_tokens() - 1;
  bie::CpuBackend pool(static_cast<int>(state.range(2)));
  bie::attention::PagedAttentionRunner runner;
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(n_head) * geo.head_dim), out(q.size());
  for (float& x : q) x = nd(rng);
  for (auto _ : state) {
    for (int il = 0; il < geo.n_layer; ++il) {
      runner.run_blocks(c.host_blocks(il, pos + 1), geo.n_head_kv, geo.head_dim, pos, 1, q.data(),
                        n_head, scale, out.data(), pool.host_threads());
    }
    benchmark::DoNotOptimize(out.data());
  }
}

// The cache of the benchmark's (regime, depth) arguments; null (the benchmark skipped) on failure.
bie::PagedKvCache* regime_cache(benchmark::State& state) {
  bie::PagedKvCache* c = cache_for(static_cast<int>(state.range(0)), state.range(1));
  if (c == nullptr) state.SkipWithError("cache setup failed");
  return c;
}

void BM_PagedAttnDecode(benchmark::State& state) {
  const int regime = static_cast<int>(state.range(0));
  const int64_t depth = state.range(1);
  bie::PagedKvCache* c = regime_cache(state);
  if (c == nullptr) return;
  time_decode(state, *c, kHeads, 0.125f);
  bie::planner::ModelGeometry g;
  g.n_layer = kLayers;
  g.layers.assign(kLayers, bie::planner::LayerKv{kHeadsKv, kHeadDim, kHeadDim, 0});
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bie::planner::kv_sequence_bytes(
                                                   g, c->layout(), depth)));
  state.SetLabel(std::string(kRegimes[regime].k) + "/" + kRegimes[regime].v +
                 (kRegimes[regime].rotate ? "+rot" : ""));
}

// The same with a cold cache: before each token, 512 MiB are written so that the KV comes from
// DRAM, as in a real decode step where the model's weights and the other layers pass through the
// cache between two uses of a layer's KV (this machine's LLC holds all of an 8k f16 cache).
void BM_PagedAttnDecodeCold(benchmark::State& state) {
  const int regime = static_cast<int>(state.range(0));
  const int64_t depth = state.range(1);
  bie::PagedKvCache* c = regime_cache(state);
  if (c == nullptr) return;
  bie::CpuBackend pool(static_cast<int>(state.range(2)));
  bie::attention::PagedAttentionRunner runner;
  static std::vector<uint8_t> evict(size_t{512} << 20);
  std::vector<float> q(kHeads * kHeadDim, 0.5f), out(q.size());
  uint8_t tick = 0;
  for (auto _ : state) {
    state.PauseTiming();
    std::memset(evict.data(), ++tick, evict.size());
    state.ResumeTiming();
    for (int il = 0; il < kLayers; ++il) {
      runner.run_blocks(c->host_blocks(il, depth), kHeadsKv, kHeadDim, depth - 1, 1, q.data(),
                        kHeads, 0.125f, out.data(), pool.host_threads());
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(std::string(kRegimes[regime].k) + "/" + kRegimes[regime].v +
                 (kRegimes[regime].rotate ? "+rot" : "") + " cold");
}

// Qwen2.5-Coder-1.5B's attention (28 layers, 2 KV heads, GQA group 6, head_dim 128) at one
// depth: f16 (blocks of 16), and the default 4-bit recipe (`--kv-cache-dtype int4_asym`: K
// int4_channel_t64 rotated, V int4_asym_g64, blocks of 64, FP16 sinks and window).
// Names: BM_PagedAttnDecodeGqa6/<0 f16|1 4-bit>/<depth>/<threads>.
void BM_PagedAttnDecodeGqa6(benchmark::State& state) {
  constexpr int kL = 28, kKv = 2, kH = 12, kD = 128;
  const bool q4 = state.range(0) != 0;
  const int64_t depth = state.range(1);
  static std::map<std::pair<bool, int64_t>, std::unique_ptr<bie::PagedKvCache>> caches;
  auto& c = caches[{q4, depth}];
  if (!c) {
    bie::planner::KvLayoutFlags flags;  // --kv-cache-dtype f16 / int4_asym: the engine's layouts
    flags.dtype = q4 ? "int4_asym" : "f16";
    c = filled_cache(bie::KvGeometry{kL, kKv, kD, {}},
                     bie::planner::resolve_kv_layout(flags).value(), depth);
  }
  if (!c) {
    state.SkipWithError("cache setup failed");
    return;
  }
  time_decode(state, *c, kH, 0.088f);
  state.SetLabel(q4 ? "int4_channel_t64+rot/int4_asym_g64" : "f16/f16");
}

BENCHMARK(BM_PagedAttnDecodeGqa6)
    ->ArgsProduct({{0, 1}, {16384}, {2}})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.5);

BENCHMARK(BM_PagedAttnDecodeCold)
    ->ArgsProduct({{0, 3, 4}, {512, 8192}, {1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(8);

BENCHMARK(BM_PagedAttnDecode)
    ->ArgsProduct({{0, 1, 2, 3, 4}, {512, 2048, 8192}, {1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.3);

}  // namespace
