// The attention runner: the sequences of a batch whose K/V lie in one store's pools go to the
// backend as one paged_attention call (vLLM's attention metadata), a cache that attends itself
// splits the batch, and every sequence gets the output it gets alone.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "bie/attention/attention_runner.h"
#include "bie/kv/paged_kv_store.h"
#include "bie/kv/sequence_kv.h"
#include "support/contiguous_kv_cache.h"
#include "support/reference_backend.h"

namespace bie {
namespace {

// Records how many sequences each paged_attention call carried.
class CountingBackend final : public test::ReferenceBackend {
 public:
  Status paged_attention(const AttnMetadata& m) override {
    calls.push_back(m.q_pos0.size());
    return test::ReferenceBackend::paged_attention(m);
  }
  std::vector<size_t> calls;
};

TEST(AttentionRunner, SequencesOfOneStoreGoToTheBackendAsOneCall) {
  const KvGeometry geo{2, 2, 32, {}};
  const int n_head = 4;
  const int64_t q_dim = n_head * geo.head_dim;
  CountingBackend be;
  auto cfg = PagedKvStore::planned_config(geo, planner::KvLayout{}, 64, 3, 0);
  ASSERT_TRUE(cfg.ok()) << cfg.error();
  cfg->backend = &be;
  auto store = PagedKvStore::create(*cfg);
  ASSERT_TRUE(store.ok()) << store.error();
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const auto rnd = [&](int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& e : x) e = nd(rng);
    return x;
  };
  // Sequences 0 and 1 in the store (lengths 40 and 23), a contiguous cache between them and the
  // store's sequence 2 (length 17) after it.
  const std::vector<int64_t> len = {40, 23, 17};
  std::vector<std::unique_ptr<SequenceKv>> seq;
  for (size_t s = 0; s < len.size(); ++s) {
    std::vector<int32_t> toks(static_cast<size_t>(len[s]), static_cast<int32_t>(s + 1));
    ASSERT_TRUE((*store)->append_tokens(static_cast<kv::SeqId>(s), 0, toks).ok());
    seq.push_back(std::make_unique<SequenceKv>(**store, static_cast<kv::SeqId>(s), len[s], 64));
  }
  ContiguousKvCache dense(geo, 64);
  ASSERT_TRUE(dense.append(30).ok());
  for (int il = 0; il < geo.n_layer; ++il) {
    for (size_t s = 0; s < len.size(); ++s) {
      const std::vector<float> k = rnd(len[s] * geo.kv_dim()), v = rnd(len[s] * geo.kv_dim());
      (*store)->store(static_cast<kv::SeqId>(s), il, 0, len[s], k.data(), v.data());
    }
    const std::vector<float> k = rnd(30 * geo.kv_dim()), v = rnd(30 * geo.kv_dim());
    dense.store(il, 0, 30, k.data(), v.data());
  }
  ASSERT_TRUE((*store)->check_integrity().ok());
  // The batch: the last 5 positions of sequence 0, the last 3 of sequence 1, the last 4 of the
  // dense cache, the last 2 of sequence 2: 14 query rows.
  struct Part {
    KvCache* kv;
    int64_t n, pos0;
  };
  const std::vector<Part> parts = {
      {seq[0].get(), 5, 35}, {seq[1].get(), 3, 20}, {&dense, 4, 26}, {seq[2].get(), 2, 15}};
  std::vector<attention::AttnSequence> batch;
  int64_t rows = 0;
  for (const Part& p : parts) {
    batch.push_back({p.kv, rows, p.n, p.pos0});
    rows += p.n;
  }
  const std::vector<float> q = rnd(rows * q_dim);
  auto qb = be.alloc(q.size() * sizeof(float));
  auto ob = be.alloc(q.size() * sizeof(float));
  ASSERT_TRUE(qb.ok() && ob.ok());
  const Tensor qt = tensor_of(**qb, quant::GgmlType::F32, rows, q_dim);
  const Tensor ot = tensor_of(**ob, quant::GgmlType::F32, rows, q_dim);
  be.upload(qt, q.data());
  attention::AttentionRunner runner;
  for (int il = 0; il < geo.n_layer; ++il) {
    be.calls.clear();
    ASSERT_TRUE(runner.run(batch, il, qt, ot, n_head, 0.125f, 0, be).ok());
    // Sequences 0 and 1 in one call; the dense cache ends the group; sequence 2 alone.
    EXPECT_EQ(be.calls, (std::vector<size_t>{2, 1}));
    std::vector<float> out(q.size());
    be.download(ot, out.data());
    for (const attention::AttnSequence& s : batch) {
      std::vector<float> alone(static_cast<size_t>(s.n * q_dim));
      attention::attend(*s.kv, il, s.pos0, s.n, q.data() + s.row0 * q_dim, n_head, 0.125f,
                        alone.data(), be);
      for (size_t i = 0; i < alone.size(); ++i) {
        ASSERT_EQ(alone[i], out[static_cast<size_t>(s.row0 * q_dim) + i])
            << "layer " << il << " row0 " << s.row0 << " at " << i;
      }
    }
  }
}

}  // namespace
}  // namespace bie
