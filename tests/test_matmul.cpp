// matmul against (1) a naive fp64 reference over dequantised weights and fp32 activations, with
// a bound derived from the activation format's rounding, and (2) the row-by-row vec_dot path,
// which the tiled path must reproduce up to float summation order.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <cstdlib>
#include <utility>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#include "bie/backend/matmul.h"
#include "bie/common/cpu_features.h"
#include "bie/quant/traits.h"

namespace bie {
namespace {

using quant::GgmlType;
using G = GgmlType;

// Float summation-order differences between paths: a few ulps of the sum of |products|.
constexpr double kSumOrderRelTol = 1e-5;
// Q8_0/Q8_1/Q8_K: each activation moves by at most half a step (amax/254) plus the fp16
// rounding of d (127 * d * 2^-11 ~ amax/2048): bound amax/254 + amax/1024 per value.
constexpr double kQ8StepFrac = 1.0 / 254 + 1.0 / 1024;
// Q8_1's s = fp16(d * sum) carries d's and s's fp16 rounding into the min term: 2 * 2^-11 of
// |sum of the block's activations|, taken as 2^-9 for headroom.
constexpr double kQ8_1SumFrac = 1.0 / 512;

struct Matrix {
  GgmlType type;
  int64_t n_in, n_out;
  std::vector<uint8_t> data;
  std::vector<float> deq;  // dequantised, [n_out, n_in]
  size_t row_bytes;
  WeightView view() const { return {type, n_in, n_out, data.data(), row_bytes}; }
};

Matrix make_matrix(GgmlType type, int64_t n_in, int64_t n_out, uint32_t seed, size_t pad = 0) {
  const quant::TypeTraits* t = quant::traits_scalar(type);
  Matrix m{type, n_in, n_out, {}, {}, quant::row_size(type, n_in) + pad};
  m.data.assign(m.row_bytes * static_cast<size_t>(n_out), 0xAB);
  m.deq.resize(static_cast<size_t>(n_in * n_out));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(n_in));
  for (int64_t r = 0; r < n_out; ++r) {
    for (auto& v : row)
      v = dist(rng) + (r % 3 == 0 ? 0.5f : 0.0f);  // some rows off-centre (min terms)
    t->from_float(row.data(), m.data.data() + m.row_bytes * static_cast<size_t>(r), n_in);
    t->to_float(m.data.data() + m.row_bytes * static_cast<size_t>(r), m.deq.data() + r * n_in,
                n_in);
  }
  return m;
}

std::vector<float> make_acts(int64_t n_in, int64_t n_tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> x(static_cast<size_t>(n_in * n_tokens));
  for (auto& v : x) v = dist(rng);
  return x;
}

// Bound on |matmul - exact| for output (t, r).
double error_bound(const Matrix& m, const float* x, int64_t r) {
  const GgmlType vdt = quant::traits_scalar(m.type)->vec_dot_type;
  const float* w = m.deq.data() + r * m.n_in;
  double bound = 0, abs_sum = 0;
  for (int64_t b0 = 0; b0 < m.n_in; b0 += 32) {
    double amax = 0, wmax = 0, xsum = 0, wabs = 0;
    const int64_t kb = vdt == G::Q8_K ? (b0 / 256) * 256 : b0;  // Q8_K scales per 256
    const int64_t ke = vdt == G::Q8_K ? kb + 256 : b0 + 32;
    for (int64_t k = kb; k < ke; ++k) amax = std::max(amax, std::fabs(static_cast<double>(x[k])));
    for (int64_t k = b0; k < b0 + 32; ++k) {
      wmax = std::max(wmax, std::fabs(static_cast<double>(w[k])));
      xsum += std::fabs(static_cast<double>(x[k]));
      wabs += std::fabs(static_cast<double>(w[k]));
      abs_sum += std::fabs(static_cast<double>(w[k]) * x[k]);
      if (vdt == G::F16) bound += std::fabs(static_cast<double>(w[k]) * x[k]) * 0x1p-11;
      if (vdt == G::BF16) bound += std::fabs(static_cast<double>(w[k]) * x[k]) * 0x1p-8;
    }
    if (vdt == G::Q8_0 || vdt == G::Q8_1 || vdt == G::Q8_K) bound += wabs * amax * kQ8StepFrac;
    if (vdt == G::Q8_1) bound += wmax * xsum * kQ8_1SumFrac;
  }
  return bound + kSumOrderRelTol * abs_sum + 1e-6;
}

// Every kernel ISA this machine has (scalar, AVX2, AVX-512): each test runs all of them, so the
// AVX2 and scalar paths are checked on AVX-512 machines too.
std::vector<Isa> machine_isas() {
  std::vector<Isa> v;
  for (Isa i : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (static_cast<int>(i) <= static_cast<int>(best_isa())) v.push_back(i);
  }
  return v;
}

// Sets the active ISA for a scope (tests only; the kernels run on this thread's pool).
class IsaScope {
 public:
  explicit IsaScope(Isa isa) : saved_(active_isa()) { EXPECT_EQ(set_isa(isa), isa); }
  ~IsaScope() { set_isa(saved_); }
  IsaScope(const IsaScope&) = delete;
  IsaScope& operator=(const IsaScope&) = delete;

 private:
  Isa saved_;
};

const G kTypes[] = {G::F32,  G::F16,  G::BF16, G::Q4_0, G::Q4_1, G::Q5_0, G::Q5_1,
                    G::Q8_0, G::Q2_K, G::Q3_K, G::Q4_K, G::Q5_K, G::Q6_K};

TEST(Matmul, MatchesFp64ReferenceAllTypesShapesThreads) {
  ThreadPool pool1(1), pool2(2);
  MatmulScratch scratch;
  for (Isa isa : machine_isas()) {
    IsaScope scope(isa);
    SCOPED_TRACE(isa_name(isa));
    for (G type : kTypes) {
      for (auto [n_in, n_out] : {std::pair<int64_t, int64_t>{256, 37}, {512, 64}, {768, 9}}) {
        const Matrix m = make_matrix(type, n_in, n_out, static_cast<uint32_t>(n_out + n_in),
                                     /*pad=*/n_out == 9 ? 16 : 0);
        for (int64_t n_tokens : {1, 3, 17, 64}) {
          const auto x = make_acts(n_in, n_tokens, static_cast<uint32_t>(n_tokens));
          for (ThreadPool* pool : {&pool1, &pool2}) {
            std::vector<float> y(static_cast<size_t>(n_tokens * n_out), NAN);
            matmul(m.view(), x.data(), n_tokens, y.data(), *pool, scratch);
            for (int64_t t = 0; t < n_tokens; ++t) {
              for (int64_t r = 0; r < n_out; ++r) {
                double ref = 0;
                for (int64_t k = 0; k < n_in; ++k)
                  ref += static_cast<double>(m.deq[r * n_in + k]) * x[t * n_in + k];
                const double got = y[t * n_out + r];
                ASSERT_NEAR(got, ref, error_bound(m, x.data() + t * n_in, r))
                    << quant::type_name(type) << " n_in=" << n_in << " n_out=" << n_out
                    << " tokens=" << n_tokens << " threads=" << pool->size() << " t=" << t
                    << " r=" << r;
              }
            }
          }
        }
      }
    }
  }
}

// matmul reproduces vec_dot (the ISA table's and the scalar reference's) on the same quantised
// activations, up to float summation order, whichever path n_tokens selects: the matvec kernels
// (1..4 tokens, several rows per call plus single-row tails) or the tiles.
void expect_matches_vec_dot(G type, int64_t n_in, int64_t n_out, int64_t n_tokens,
                            ThreadPool& pool) {
  MatmulScratch scratch;
  const quant::TypeTraits* tr = quant::traits(type);
  const quant::TypeTraits* ts = quant::traits_scalar(type);
  const quant::TypeTraits* at = quant::traits(tr->vec_dot_type);
  const Matrix m = make_matrix(type, n_in, n_out, 5, /*pad=*/n_out % 2 == 1 ? 4 : 0);
  const auto x = make_acts(n_in, n_tokens, 6);
  std::vector<float> y(static_cast<size_t>(n_tokens * n_out));
  matmul(m.view(), x.data(), n_tokens, y.data(), pool, scratch);
  std::vector<uint8_t> xq(quant::row_size(tr->vec_dot_type, n_in));
  std::vector<float> xd(static_cast<size_t>(n_in));
  for (int64_t t = 0; t < n_tokens; ++t) {
    at->from_float(x.data() + t * n_in, xq.data(), n_in);
    at->to_float(xq.data(), xd.data(), n_in);
    for (int64_t r = 0; r < n_out; ++r) {
      double abs_sum = 0;
      for (int64_t k = 0; k < n_in; ++k)
        abs_sum += std::fabs(static_cast<double>(m.deq[r * n_in + k]) * xd[k]);
      const void* row = m.data.data() + m.row_bytes * static_cast<size_t>(r);
      const double tol = kSumOrderRelTol * abs_sum + 1e-6;
      ASSERT_NEAR(y[t * n_out + r], tr->vec_dot(n_in, row, xq.data()), tol)
          << quant::type_name(type) << " n_in=" << n_in << " tokens=" << n_tokens << " t=" << t
          << " r=" << r;
      ASSERT_NEAR(y[t * n_out + r], ts->vec_dot(n_in, row, xq.data()), tol)
          << quant::type_name(type) << " (scalar) n_in=" << n_in << " tokens=" << n_tokens
          << " t=" << t << " r=" << r;
    }
  }
}

TEST(Matmul, TiledPathMatchesVecDot) {
  ThreadPool pool(2);
  for (Isa isa : machine_isas()) {
    IsaScope scope(isa);
    SCOPED_TRACE(isa_name(isa));
    for (G type : kTypes) expect_matches_vec_dot(type, 512, 45, 13, pool);
  }
}

// Decode shapes: every token count of the matvec path and the first tiled one; n_out = 45 and
// 46 leave single-row tails after the 4- and 2-row kernels; 67 blocks of 32 (not a multiple of
// 4, more than one 64-block chunk) and 9 super-blocks exercise the block tails.
TEST(Matmul, DecodePathMatchesVecDot) {
  ThreadPool pool1(1), pool2(2);
  for (Isa isa : machine_isas()) {
    IsaScope scope(isa);
    SCOPED_TRACE(isa_name(isa));
    for (G type : kTypes) {
      const int64_t n_in = quant::block_size(type) == 256 ? 2304 : 2144;
      for (int64_t n_tokens : {1, 2, 3, 4, 5}) {
        for (int64_t n_out : {45, 46}) {
          expect_matches_vec_dot(type, n_in, n_out, n_tokens, n_out == 45 ? pool1 : pool2);
        }
      }
    }
  }
}

// The formats of the shipped models at model-like sizes: many rows (several row chunks per
// thread), a batched decode of 16 tokens (four token groups over each chunk), an odd row count.
TEST(Matmul, DecodePathMatchesVecDotManyRowsAndTokens) {
  ThreadPool pool(2);
  for (Isa isa : machine_isas()) {
    IsaScope scope(isa);
    SCOPED_TRACE(isa_name(isa));
    for (G type : {G::Q4_K, G::Q6_K, G::Q5_0, G::Q8_0, G::Q4_1}) {
      const int64_t n_in = quant::block_size(type) == 256 ? 1536 : 1504;
      for (int64_t n_tokens : {1, 16}) expect_matches_vec_dot(type, n_in, 1031, n_tokens, pool);
    }
  }
}

// Batch invariance: with a named path, each token's outputs are bit-identical whether it runs
// alone or with other tokens (what makes a sequence's greedy output independent of the batch it
// was scheduled in).
TEST(Matmul, NamedPathsGiveEachTokenTheSameBitsWhateverTheBatch) {
  ThreadPool pool(2);
  MatmulScratch scratch;
  for (Isa isa : machine_isas()) {
    IsaScope scope(isa);
    SCOPED_TRACE(isa_name(isa));
    for (G type : kTypes) {
      const int64_t n_in = quant::block_size(type) == 256 ? 512 : 544, n_out = 45, n_tokens = 11;
      const Matrix m = make_matrix(type, n_in, n_out, 9);
      const auto x = make_acts(n_in, n_tokens, 10);
      for (MatmulPath path : {MatmulPath::kDecode, MatmulPath::kPrefill}) {
        std::vector<float> all(static_cast<size_t>(n_tokens * n_out));
        matmul(m.view(), x.data(), n_tokens, all.data(), pool, scratch, path);
        for (int64_t t = 0; t < n_tokens; ++t) {
          std::vector<float> one(static_cast<size_t>(n_out));
          matmul(m.view(), x.data() + t * n_in, 1, one.data(), pool, scratch, path);
          for (int64_t r = 0; r < n_out; ++r) {
            ASSERT_EQ(one[static_cast<size_t>(r)], all[static_cast<size_t>(t * n_out + r)])
                << quant::type_name(type) << (path == MatmulPath::kDecode ? " decode" : " prefill")
                << " t=" << t << " r=" << r;
          }
        }
      }
    }
  }
}

// The AVX-512 decode kernels give the AVX2 kernels' bits (the same integer partition and float
// order), so a token computed on either ISA's decode path is the same token. The 32-value formats
// run one template on both (vpdpbusd and masked fifth bits on AVX-512).
TEST(Matmul, Avx512DecodeGivesTheAvx2Bits) {
  if (best_isa() != Isa::kAvx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  ThreadPool pool(2);
  MatmulScratch scratch;
  for (G type : {G::Q4_K, G::Q6_K, G::Q4_0, G::Q4_1, G::Q5_0, G::Q5_1, G::Q8_0}) {
    const Matrix m = make_matrix(type, 2304, 45, 11);
    for (int64_t n_tokens : {1, 3, 13, 16}) {  // 13: groups of 8 and 5 on AVX-512
      const auto x = make_acts(2304, n_tokens, 12);
      std::vector<float> y2(static_cast<size_t>(n_tokens * 45)), y5(y2.size());
      {
        IsaScope scope(Isa::kAvx2);
        matmul(m.view(), x.data(), n_tokens, y2.data(), pool, scratch, MatmulPath::kDecode);
      }
      {
        IsaScope scope(Isa::kAvx512);
        matmul(m.view(), x.data(), n_tokens, y5.data(), pool, scratch, MatmulPath::kDecode);
      }
      for (size_t i = 0; i < y2.size(); ++i) {
        ASSERT_EQ(y2[i], y5[i]) << quant::type_name(type) << " tokens=" << n_tokens << " i=" << i;
      }
    }
  }
}

// The AVX-512 prefill tiles (K-quants, 32-value formats) give the AVX2 tiles' bits: the same exact
// integer sums and the same float operations per (row, token). Shapes: 45 rows (a short last panel
// of 16), 13 and 17 tokens (short token tiles of 8), 9 super-blocks / 72 blocks.
TEST(Matmul, Avx512PrefillGivesTheAvx2Bits) {
  if (best_isa() != Isa::kAvx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  ThreadPool pool(2);
  MatmulScratch scratch;
  for (G type :
       {G::Q4_0, G::Q4_1, G::Q5_0, G::Q5_1, G::Q8_0, G::Q2_K, G::Q3_K, G::Q4_K, G::Q5_K, G::Q6_K}) {
    const Matrix m = make_matrix(type, 2304, 45, 13);
    for (int64_t n_tokens : {1, 13, 17}) {
      const auto x = make_acts(2304, n_tokens, 14);
      std::vector<float> y2(static_cast<size_t>(n_tokens * 45)), y5(y2.size());
      {
        IsaScope scope(Isa::kAvx2);
        matmul(m.view(), x.data(), n_tokens, y2.data(), pool, scratch, MatmulPath::kPrefill);
      }
      {
        IsaScope scope(Isa::kAvx512);
        matmul(m.view(), x.data(), n_tokens, y5.data(), pool, scratch, MatmulPath::kPrefill);
      }
      for (size_t i = 0; i < y2.size(); ++i) {
        ASSERT_EQ(y2[i], y5[i]) << quant::type_name(type) << " tokens=" << n_tokens << " i=" << i;
      }
    }
  }
}

// Weights repacked once (pack_weight: AVX-512, Q4_K, Q6_K and the 32-value formats) give every
// token the prefill tiles' bits over the file's layout, on either named path and for any number
// of tokens: so a decode token's bits do not depend on its batch, and the repacking changes no
// prompt token.
// Shapes: 9 super-blocks (an odd count: Q6_K panels end in padding), 45 rows (a short last
// panel) and 32 padded rows; token counts around the kernels' groups of 8, and 40 (above
// kPackedInPlaceTokens: each panel expanded into the tiles' layout). Lowering the ISA ignores the
// packed copy (the AVX2 decode kernels' bits).
TEST(Matmul, RepackedWeightsGiveThePrefillTilesBitsForAnyBatch) {
  if (best_isa() != Isa::kAvx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  ThreadPool pool(2);
  MatmulScratch scratch;
  IsaScope scope(Isa::kAvx512);
  for (G type : {G::Q4_K, G::Q6_K, G::Q4_0, G::Q4_1, G::Q5_0, G::Q5_1, G::Q8_0}) {
    for (const auto& [n_out, pad] : {std::pair<int64_t, size_t>{45, 0}, {32, 64}}) {
      const Matrix m = make_matrix(type, 2304, n_out, 15, pad);
      const size_t bytes = packed_weight_bytes(m.view());
      const int64_t panels = (n_out + 15) / 16;
      ASSERT_GE(bytes, static_cast<size_t>(panels * 16) * quant::row_size(type, 2304));
      ASSERT_LT(bytes, static_cast<size_t>(panels * 16) * quant::row_size(type, 2304) +
                           static_cast<size_t>(panels) * 64);
      auto* buf = static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
      ASSERT_NE(buf, nullptr);
      pack_weight(m.view(), buf, pool);
      WeightView packed = m.view();
      packed.packed = buf;
      for (int64_t n_tokens : {1, 2, 5, 8, 9, 13, 16, 17, 40}) {
        const auto x = make_acts(2304, n_tokens, 16 + static_cast<uint32_t>(n_tokens));
        const size_t n = static_cast<size_t>(n_tokens * n_out);
        std::vector<float> tiles(n), dec(n), pre(n);
        matmul(m.view(), x.data(), n_tokens, tiles.data(), pool, scratch, MatmulPath::kPrefill);
        matmul(packed, x.data(), n_tokens, dec.data(), pool, scratch, MatmulPath::kDecode);
        matmul(packed, x.data(), n_tokens, pre.data(), pool, scratch, MatmulPath::kPrefill);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(tiles[i], dec[i]) << quant::type_name(type) << " rows=" << n_out
                                      << " tokens=" << n_tokens << " i=" << i << " decode";
          ASSERT_EQ(tiles[i], pre[i]) << quant::type_name(type) << " rows=" << n_out
                                      << " tokens=" << n_tokens << " i=" << i << " prefill";
        }
      }
      const auto x = make_acts(2304, 3, 40);
      std::vector<float> raw(static_cast<size_t>(3 * n_out)), lowered(raw.size());
      {
        IsaScope avx2(Isa::kAvx2);
        EXPECT_EQ(packed_weight_bytes(m.view()), 0u);
        matmul(m.view(), x.data(), 3, raw.data(), pool, scratch, MatmulPath::kDecode);
        matmul(packed, x.data(), 3, lowered.data(), pool, scratch, MatmulPath::kDecode);
      }
      EXPECT_EQ(raw, lowered) << quant::type_name(type);
      std::free(buf);
    }
  }
}

// The CPU backend repacks a weight matrix of the mmapped file when it is offered
// (prepare_weight) or at its first matmul, and releases the matrix's file pages (the weights stay
// held once); buffers it allocated itself (not weights) are never repacked. Telling the two apart: on AVX-512 the repacked matrix gives the prefill
// tiles' bits for a decode token, the raw one the matrix-vector kernels' (the two differ here).
TEST(CpuBackend, RepacksFileWeightsOnceAndReleasesTheirPages) {
  if (best_isa() != Isa::kAvx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  IsaScope scope(Isa::kAvx512);
  const int64_t n_in = 2304, n_out = 2048;
  const Matrix m = make_matrix(G::Q4_K, n_in, n_out, 17);
  const std::string path = ::testing::TempDir() + "bie_repack_weights.bin";
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(m.data.data()), static_cast<std::streamsize>(m.data.size()));
    ASSERT_TRUE(f.good());
  }
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fsync(fd), 0);  // clean pages, as a model file's are
  void* map = ::mmap(nullptr, m.data.size(), PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  ASSERT_NE(map, MAP_FAILED);
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t pages = (m.data.size() + page - 1) / page;
  // Pages of the mapping in this process's resident set (/proc/self/smaps "Rss").
  const auto resident = [&] {
    std::ifstream smaps("/proc/self/smaps");
    const std::string head = fmt::format("{:x}-", reinterpret_cast<uintptr_t>(map));
    std::string line;
    bool in = false;
    while (std::getline(smaps, line)) {
      if (line.rfind(head, 0) == 0) in = true;
      if (in && line.rfind("Rss:", 0) == 0) return std::stoul(line.substr(4)) * 1024 / page;
    }
    ADD_FAILURE() << "mapping not found in /proc/self/smaps";
    return size_t{0};
  };
  volatile uint8_t sink = 0;
  for (size_t i = 0; i < m.data.size(); i += page) sink = sink + static_cast<const uint8_t*>(map)[i];
  EXPECT_EQ(resident(), pages);

  CpuBackend be(2);
  auto weights = be.upload_weights({static_cast<const uint8_t*>(map), m.data.size()});
  ASSERT_TRUE(weights.ok()) << weights.error();
  auto owned = be.alloc(m.data.size());
  ASSERT_TRUE(owned.ok()) << owned.error();
  std::memcpy((*owned)->host_ptr(), m.data.data(), m.data.size());
  auto xb = be.alloc(static_cast<size_t>(n_in) * 4);
  auto yb = be.alloc(static_cast<size_t>(n_out) * 4);
  ASSERT_TRUE(xb.ok() && yb.ok());
  const auto x = make_acts(n_in, 1, 18);
  std::memcpy((*xb)->host_ptr(), x.data(), x.size() * 4);
  const Tensor xt = tensor_of(**xb, G::F32, 1, n_in);
  const Tensor yt = tensor_of(**yb, G::F32, 1, n_out);
  const auto* y = static_cast<const float*>((*yb)->host_ptr());

  ThreadPool pool(2);
  MatmulScratch scratch;
  std::vector<float> tiles(static_cast<size_t>(n_out)), matvec(tiles.size());
  matmul(m.view(), x.data(), 1, tiles.data(), pool, scratch, MatmulPath::kPrefill);
  matmul(m.view(), x.data(), 1, matvec.data(), pool, scratch, MatmulPath::kDecode);
  ASSERT_NE(tiles, matvec);  // else this test could not tell the paths apart

  // Two matrices of 1024 rows (whole pages each): the first offered by prepare_weight (as
  // Model::bind does), the second met first by a matmul.
  const int64_t half = n_out / 2;
  ASSERT_EQ(static_cast<size_t>(half) * m.row_bytes % page, 0u);
  const Tensor top = tensor_of(**weights, G::Q4_K, half, n_in);
  const Tensor bottom =
      tensor_of(**weights, G::Q4_K, half, n_in, static_cast<size_t>(half) * m.row_bytes);
  const Tensor yh = tensor_of(**yb, G::F32, 1, half);
  // The kernel reclaims whole page-cache folios, which may reach past a range's ends: the bounds
  // allow that (released pages of the other matrix fault back in when read).
  be.prepare_weight(top);
  EXPECT_LE(resident(), pages / 2);  // at least the first's pages are released
  be.matmul(top, xt, yh, MatmulPath::kDecode);
  EXPECT_EQ(std::vector<float>(y, y + half), std::vector<float>(tiles.begin(), tiles.begin() + half));
  be.matmul(bottom, xt, yh, MatmulPath::kDecode);
  EXPECT_EQ(std::vector<float>(y, y + half), std::vector<float>(tiles.begin() + half, tiles.end()));
  EXPECT_LE(resident(), pages / 16);
  be.matmul(bottom, xt, yh, MatmulPath::kDecode);  // the copy is read from now on
  EXPECT_EQ(std::vector<float>(y, y + half), std::vector<float>(tiles.begin() + half, tiles.end()));
  EXPECT_LE(resident(), pages / 16);

  be.matmul(tensor_of(**owned, G::Q4_K, n_out, n_in), xt, yt, MatmulPath::kDecode);
  EXPECT_EQ(std::vector<float>(y, y + n_out), matvec);
  ::munmap(map, m.data.size());
  std::remove(path.c_str());
}

TEST(CpuFeatures, IsaChoiceIsClampedToTheMachineAndFollowedByTheTraits) {
  const Isa saved = active_isa();
  EXPECT_EQ(set_isa(Isa::kAvx512), best_isa());  // never above what the machine has
  EXPECT_EQ(set_isa(Isa::kScalar), Isa::kScalar);
  EXPECT_FALSE(has_avx2());
  EXPECT_FALSE(has_avx512());
  EXPECT_EQ(quant::traits_avx2(G::Q4_K), nullptr);
  EXPECT_EQ(quant::traits(G::Q4_K), quant::traits_scalar(G::Q4_K));
  if (static_cast<int>(best_isa()) >= static_cast<int>(Isa::kAvx2)) {
    EXPECT_EQ(set_isa(Isa::kAvx2), Isa::kAvx2);
    EXPECT_TRUE(has_avx2());
    EXPECT_FALSE(has_avx512());
    EXPECT_NE(quant::traits(G::Q4_K), quant::traits_scalar(G::Q4_K));
  }
  set_isa(saved);
  EXPECT_EQ(isa_from_name("avx2"), Isa::kAvx2);
  EXPECT_EQ(isa_from_name("avx512"), Isa::kAvx512);
  EXPECT_EQ(isa_from_name("scalar"), Isa::kScalar);
  EXPECT_EQ(isa_from_name("sse"), std::nullopt);
  EXPECT_NE(isa_report().find(std::string(isa_name(active_isa()))), std::string::npos);
}

TEST(Matmul, ScratchIsReusedOnceWarm) {
  ThreadPool pool(2);
  MatmulScratch scratch;
  const Matrix m = make_matrix(G::Q4_K, 512, 24, 1);
  const auto x = make_acts(512, 8, 2);
  std::vector<float> y(8 * 24);
  matmul(m.view(), x.data(), 8, y.data(), pool, scratch);
  const void* acts = scratch.activations(0);
  const void* panel = scratch.panel(1, 0);
  matmul(m.view(), x.data(), 8, y.data(), pool, scratch);
  matmul(m.view(), x.data(), 1, y.data(), pool, scratch);
  EXPECT_EQ(scratch.activations(0), acts);
  EXPECT_EQ(scratch.panel(1, 0), panel);
}

}  // namespace
}  // namespace bie
