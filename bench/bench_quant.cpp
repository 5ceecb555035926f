// Kernel benchmarks: vec_dot per type and ISA, and matmul at SmolLM2-135M shapes.
//   build/bie_kernel_bench --benchmark_filter=VecDot
//   build/bie_kernel_bench --benchmark_filter=Matmul --benchmark_repetitions=3
//   build/bie_kernel_bench --benchmark_filter=MatmulDecode   (1-4 tokens; warm and cold weights)
//   build/bie_kernel_bench --benchmark_filter=MatmulIsa      (Qwen2.5-1.5B shapes, per ISA)
//   build/bie_kernel_bench --benchmark_filter=ReadBandwidth --benchmark_repetitions=7
//                                                           (the decode bound; take the best)
// VecDot reports weight bytes/s; Matmul reports weight bytes/s (the decode bound) and GFLOP/s
// (2 * n_in * n_out * n_tokens per call).
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "bie/backend/matmul.h"
#include "bie/backend/thread_pool.h"
#include "bie/common/cpu_features.h"
#include "bie/quant/traits.h"

namespace {

using bie::quant::GgmlType;

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<uint8_t> quantize(GgmlType type, const std::vector<float>& x, int64_t n_per_row) {
  const auto* t = bie::quant::traits(type);
  const int64_t rows = static_cast<int64_t>(x.size()) / n_per_row;
  const size_t rb = bie::quant::row_size(type, n_per_row);
  std::vector<uint8_t> q(rb * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    t->from_float(x.data() + r * n_per_row, q.data() + rb * static_cast<size_t>(r), n_per_row);
  return q;
}

void BM_VecDot(benchmark::State& state) {
  const auto type = static_cast<GgmlType>(state.range(0));
  const bool avx2 = state.range(1) != 0;
  const bie::quant::TypeTraits* t =
      avx2 ? bie::quant::traits_avx2(type) : bie::quant::traits_scalar(type);
  if (t == nullptr) {
    state.SkipWithError("ISA not available");
    return;
  }
  const int64_t n = 4096;
  const auto w = quantize(type, random_floats(n, 1), n);
  const auto x = quantize(t->vec_dot_type, random_floats(n, 2), n);
  for (auto _ : state) benchmark::DoNotOptimize(t->vec_dot(n, w.data(), x.data()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(w.size()));
  state.SetLabel(std::string(bie::quant::type_name(type)) + (avx2 ? " avx2" : " scalar"));
}

void VecDotArgs(benchmark::internal::Benchmark* b) {
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
                     GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K,
                     GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    for (int isa : {0, 1}) b->Args({static_cast<int>(t), isa});
  }
}
BENCHMARK(BM_VecDot)->Apply(VecDotArgs);

// Bytes of weight copies a "cold" benchmark cycles through so that they stream from DRAM: four
// times the last-level cache the OS reports (VMs report anything from 32 MiB to 480 MiB), at
// least 256 MiB, at most 4 GiB.
size_t cold_bytes() {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  const size_t llc = l3 > 0 ? static_cast<size_t>(l3) : size_t{64} << 20;
  return std::clamp(4 * llc, size_t{256} << 20, size_t{4} << 30);
}

// The first 64-byte aligned address in p's buffer (allocate 64 bytes more).
void* align64(uint8_t* p) {
  return reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(p) + 63) / 64 * 64);
}

bie::ThreadPool& pool(int n) {
  static std::map<int, std::unique_ptr<bie::ThreadPool>> pools;
  auto& p = pools[n];
  if (!p) p = std::make_unique<bie::ThreadPool>(n);
  return *p;
}

void BM_Matmul(benchmark::State& state) {
  const auto type = static_cast<GgmlType>(state.range(0));
  const int64_t n_in = state.range(1), n_out = state.range(2), n_tokens = state.range(3);
  const int threads = static_cast<int>(state.range(4));
  const auto w = quantize(type, random_floats(static_cast<size_t>(n_in * n_out), 3), n_in);
  const auto x = random_floats(static_cast<size_t>(n_in * n_tokens), 4);
  std::vector<float> y(static_cast<size_t>(n_out * n_tokens));
  const bie::WeightView view{type, n_in, n_out, w.data(), bie::quant::row_size(type, n_in)};
  bie::MatmulScratch scratch;
  bie::ThreadPool& p = pool(threads);
  bie::matmul(view, x.data(), n_tokens, y.data(), p, scratch);  // warm the scratch
  for (auto _ : state) {
    bie::matmul(view, x.data(), n_tokens, y.data(), p, scratch);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(w.size()));
  state.counters["GFLOPs"] = benchmark::Counter(2.0 * static_cast<double>(n_in * n_out * n_tokens) *
                                                    1e-9 * static_cast<double>(state.iterations()),
                                                benchmark::Counter::kIsRate);
  state.SetLabel(std::string(bie::quant::type_name(type)));
}

void MatmulArgs(benchmark::internal::Benchmark* b) {
  for (GgmlType t : {GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K,
                     GgmlType::F16}) {
    for (auto [n_in, n_out] : {std::pair<int, int>{576, 1536}, {1536, 576}, {576, 49152}}) {
      for (int n_tokens : {1, 128}) {
        for (int threads : {1, 2}) b->Args({static_cast<int>(t), n_in, n_out, n_tokens, threads});
      }
    }
  }
}
BENCHMARK(BM_Matmul)->Apply(MatmulArgs)->UseRealTime()->Unit(benchmark::kMicrosecond);

// Decode (the matvec path): the model's shapes for 1, 2 and 4 tokens (speculative decoding
// verifies a few tokens at once), 1 and 2 threads. Arg 5 (cold) cycles through enough copies of
// the matrix (cold_bytes()) that the weights come from DRAM, as they do for a whole model; warm
// runs keep one L2-resident copy and show the kernels' compute speed.
void BM_MatmulDecode(benchmark::State& state) {
  const auto type = static_cast<GgmlType>(state.range(0));
  const int64_t n_in = state.range(1), n_out = state.range(2), n_tokens = state.range(3);
  const int threads = static_cast<int>(state.range(4));
  const bool cold = state.range(5) != 0;
  const auto w = quantize(type, random_floats(static_cast<size_t>(n_in * n_out), 3), n_in);
  const size_t copies = cold ? std::max<size_t>(1, cold_bytes() / w.size()) : 1;
  std::vector<std::vector<uint8_t>> ws(copies, w);
  const auto x = random_floats(static_cast<size_t>(n_in * n_tokens), 4);
  std::vector<float> y(static_cast<size_t>(n_out * n_tokens));
  bie::MatmulScratch scratch;
  bie::ThreadPool& p = pool(threads);
  size_t i = 0;
  for (auto _ : state) {
    const bie::WeightView view{type, n_in, n_out, ws[i].data(), bie::quant::row_size(type, n_in)};
    bie::matmul(view, x.data(), n_tokens, y.data(), p, scratch);
    benchmark::ClobberMemory();
    i = i + 1 == copies ? 0 : i + 1;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(w.size()));
  state.SetLabel(std::string(bie::quant::type_name(type)) + (cold ? " cold" : " warm"));
}

void MatmulDecodeArgs(benchmark::internal::Benchmark* b) {
  struct Shape {
    GgmlType type;
    int n_in, n_out;
  };
  // SmolLM2-135M Q4_1: q/o, k/v, gate/up, down; Q8_0 tied output. Gemma-3-270M Q4_K_M mixes.
  const Shape shapes[] = {
      {GgmlType::Q4_1, 576, 576},  {GgmlType::Q4_1, 576, 192},   {GgmlType::Q4_1, 576, 1536},
      {GgmlType::Q4_1, 1536, 576}, {GgmlType::Q8_0, 576, 49152}, {GgmlType::Q4_0, 576, 1536},
      {GgmlType::Q8_0, 576, 1536}, {GgmlType::Q4_K, 640, 2048},  {GgmlType::Q4_K, 1536, 576},
      {GgmlType::Q6_K, 2048, 640}, {GgmlType::Q5_0, 640, 1024},  {GgmlType::Q8_0, 640, 256}};
  for (const Shape& s : shapes) {
    for (int n_tokens : {1, 2, 4}) {
      for (int threads : {1, 2}) {
        for (int cold : {0, 1}) {
          b->Args({static_cast<int>(s.type), s.n_in, s.n_out, n_tokens, threads, cold});
        }
      }
    }
  }
}
BENCHMARK(BM_MatmulDecode)->Apply(MatmulDecodeArgs)->UseRealTime()->Unit(benchmark::kMicrosecond);

// Qwen2.5-Coder-1.5B Q4_K_M shapes (hidden 1536, ffn 8960; Q4_K and Q6_K) on every ISA the
// machine has: decode of 1 token and a batched decode of 16 (MatmulPath::kDecode, cold weights),
// and a 512-token prefill (kAuto). Arg 4: Isa; arg 5: 0 decode, 1 prefill, 2 decode as separate
// calls of kMaxMatvecTokens (4) tokens each, i.e. the weights read once per group of 4 (what
// kDecode did before it read them once per call), 3 decode and 4 prefill on the weights repacked
// by pack_weight (what a CPU backend multiplies by on an AVX-512 machine).
void BM_MatmulIsa(benchmark::State& state) {
  const auto type = static_cast<GgmlType>(state.range(0));
  const int64_t n_in = state.range(1), n_out = state.range(2), n_tokens = state.range(3);
  const auto isa = static_cast<bie::Isa>(state.range(4));
  const bool prefill = state.range(5) == 1 || state.range(5) == 4;
  const bool grouped = state.range(5) == 2;
  const bool repacked = state.range(5) >= 3;
  if (bie::set_isa(isa) != isa) {
    state.SkipWithError("ISA not available");
    return;
  }
  const auto w = quantize(type, random_floats(static_cast<size_t>(n_in * n_out), 3), n_in);
  const size_t copies = prefill ? 1 : std::max<size_t>(1, cold_bytes() / w.size());
  std::vector<std::vector<uint8_t>> ws(copies, w);
  std::vector<std::vector<uint8_t>> packs;
  if (repacked) {
    const bie::WeightView v{type, n_in, n_out, w.data(), bie::quant::row_size(type, n_in)};
    const size_t bytes = bie::packed_weight_bytes(v);
    if (bytes == 0) {
      state.SkipWithError("no packed layout for this type and ISA");
      bie::set_isa(bie::best_isa());
      return;
    }
    for (size_t c = 0; c < copies; ++c) {
      packs.emplace_back(bytes + 64);
      bie::pack_weight(v, align64(packs.back().data()), pool(2));
    }
  }
  const auto x = random_floats(static_cast<size_t>(n_in * n_tokens), 4);
  std::vector<float> y(static_cast<size_t>(n_out * n_tokens));
  bie::MatmulScratch scratch;
  bie::ThreadPool& p = pool(2);
  const bie::MatmulPath path = prefill ? bie::MatmulPath::kAuto : bie::MatmulPath::kDecode;
  size_t i = 0;
  for (auto _ : state) {
    bie::WeightView view{type, n_in, n_out, ws[i].data(), bie::quant::row_size(type, n_in)};
    if (repacked) view.packed = align64(packs[i].data());
    if (grouped) {
      for (int64_t t = 0; t < n_tokens; t += 4) {
        bie::matmul(view, x.data() + t * n_in, std::min<int64_t>(4, n_tokens - t),
                    y.data() + t * n_out, p, scratch, path);
      }
    } else {
      bie::matmul(view, x.data(), n_tokens, y.data(), p, scratch, path);
    }
    benchmark::ClobberMemory();
    i = i + 1 == copies ? 0 : i + 1;
  }
  bie::set_isa(bie::best_isa());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(w.size()));
  state.counters["tok/s"] =
      benchmark::Counter(static_cast<double>(n_tokens) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
  state.SetLabel(std::string(bie::quant::type_name(type)) + " " + std::string(bie::isa_name(isa)) +
                 (prefill ? " prefill" : grouped ? " decode, calls of 4" : " decode") +
                 (repacked ? ", repacked" : ""));
}

void MatmulIsaArgs(benchmark::internal::Benchmark* b) {
  struct Shape {
    GgmlType type;
    int n_in, n_out;
  };
  const Shape shapes[] = {{GgmlType::Q4_K, 1536, 8960}, {GgmlType::Q6_K, 8960, 1536}};
  for (const Shape& s : shapes) {
    for (int isa : {1, 2}) {
      for (int n_tokens : {1, 2, 4, 8, 16})
        b->Args({static_cast<int>(s.type), s.n_in, s.n_out, n_tokens, isa, 0});
      b->Args({static_cast<int>(s.type), s.n_in, s.n_out, 16, isa, 2});
      b->Args({static_cast<int>(s.type), s.n_in, s.n_out, 512, isa, 1});
    }
    for (int n_tokens : {1, 2, 4, 8, 16})
      b->Args({static_cast<int>(s.type), s.n_in, s.n_out, n_tokens, 2, 3});
    b->Args({static_cast<int>(s.type), s.n_in, s.n_out, 512, 2, 4});
  }
}
BENCHMARK(BM_MatmulIsa)->Apply(MatmulIsaArgs)->UseRealTime()->Unit(benchmark::kMicrosecond);

// Read bandwidth, the decode bound: N threads sum a cold_bytes() buffer (4x the last-level
// cache) with the loads of an ISA (arg 1: 2 AVX-512, 1 AVX2, 0 scalar 64-bit words; on the
// AVX-512 Xeon VM all three reach ~27 GiB/s on 2 threads, ~14.5 on one). Bytes/s is what decode of
// a model whose weights stream from DRAM can reach: tok/s bound = bandwidth / weight bytes read per
// token. Take the best of several repetitions
// (--benchmark_repetitions=7): a shared machine only ever lowers it.
//   build/bie_kernel_bench --benchmark_filter=ReadBandwidth --benchmark_repetitions=7
__attribute__((target("avx512f"))) uint64_t sum_avx512(const uint64_t* w, size_t n) {
  __m512i s0 = _mm512_set1_epi64(0), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i < n; i += 32) {
    s0 = _mm512_add_epi64(s0, _mm512_loadu_si512(w + i));
    s1 = _mm512_add_epi64(s1, _mm512_loadu_si512(w + i + 8));
    s2 = _mm512_add_epi64(s2, _mm512_loadu_si512(w + i + 16));
    s3 = _mm512_add_epi64(s3, _mm512_loadu_si512(w + i + 24));
  }
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
  uint64_t s = 0;
  for (const uint64_t v : lanes) s += v;
  return s;
}

__attribute__((target("avx2"))) uint64_t sum_avx2(const uint64_t* w, size_t n) {
  __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i < n; i += 16) {
    const auto* v = reinterpret_cast<const __m256i*>(w + i);
    s0 = _mm256_add_epi64(s0, _mm256_loadu_si256(v));
    s1 = _mm256_add_epi64(s1, _mm256_loadu_si256(v + 1));
    s2 = _mm256_add_epi64(s2, _mm256_loadu_si256(v + 2));
    s3 = _mm256_add_epi64(s3, _mm256_loadu_si256(v + 3));
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

uint64_t sum_scalar(const uint64_t* w, size_t n) {
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (size_t i = 0; i < n; i += 4) {
    s0 += w[i];
    s1 += w[i + 1];
    s2 += w[i + 2];
    s3 += w[i + 3];
  }
  return s0 + s1 + s2 + s3;
}

void BM_ReadBandwidth(benchmark::State& state) {
  const auto isa = static_cast<bie::Isa>(state.range(1));
  if (bie::best_isa() < isa) {
    state.SkipWithError("ISA not available");
    return;
  }
  const auto sum = isa == bie::Isa::kAvx512 ? sum_avx512
                   : isa == bie::Isa::kAvx2 ? sum_avx2
                                            : sum_scalar;
  constexpr int64_t kChunkWords = int64_t{1} << 17;  // 1 MiB per chunk
  const int64_t n_chunks = static_cast<int64_t>(cold_bytes() >> 20);
  const size_t words = static_cast<size_t>(n_chunks * kChunkWords);
  const size_t bytes = words * sizeof(uint64_t);
  std::vector<uint64_t> buf(words);
  for (size_t i = 0; i < words; ++i) buf[i] = i;  // touch every page before timing
  bie::ThreadPool& p = pool(static_cast<int>(state.range(0)));
  std::vector<uint64_t> sums(static_cast<size_t>(p.size()) * 8);
  for (auto _ : state) {
    p.parallel_for(n_chunks, [&](int64_t c0, int64_t c1, int t) {
      sums[static_cast<size_t>(t) * 8] +=
          sum(buf.data() + c0 * kChunkWords, static_cast<size_t>((c1 - c0) * kChunkWords));
    });
    benchmark::DoNotOptimize(sums.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
  state.SetLabel(std::string(bie::isa_name(isa)) + " loads");
}
BENCHMARK(BM_ReadBandwidth)
    ->ArgsProduct({{2, 1}, {2, 1, 0}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
