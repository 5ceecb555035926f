// KV regimes under one memory budget (BRIEF §3 operations): pools of several formats committing
// pages from one kv::MemoryBudget (free pages and cached blocks flow between them, committed
// bytes never pass the limit), and the engine's regimes: the kill switch, the per-request choice,
// the length policy, refusals, and identical greedy output in the f16 regime.
#include <gtest/gtest.h>

#include <thread>

#include "bie/engine/engine.h"
#include "bie/engine/kv_policy.h"
#include "bie/kv/block_manager.h"
#include "bie/kv/memory_budget.h"
#include "kv_block_test_util.h"
#include "bie/tokenizer/tokenizer.h"
#include "support/engine_collect.h"
#include "support/paths.h"

namespace bie {
namespace {

// ---- MemoryBudget and BlockPool ------------------------------------------------------------

TEST(KvMemoryBudget, PoolsOfTwoSizesShareTheBudget) {
  const uint64_t page = 4096;
  kv::MemoryBudget budget(64 * page);
  // A: 3-page blocks; B: 1.5-page blocks (rounded up to 2 pages under a budget).
  auto a = kv::BlockPool::create({21, 3 * page, 4, &budget});
  auto b = kv::BlockPool::create({32, 3 * page / 2, 4, &budget});
  ASSERT_TRUE(a.ok() && b.ok());
  const auto mem_a = kv::test::attach_host_memory(**a);
  const auto mem_b = kv::test::attach_host_memory(**b);
  EXPECT_EQ((*b)->stride(), 2 * page);
  std::vector<kv::BlockIndex> held;
  for (int i = 0; i < 21; ++i) {
    auto r = (*a)->allocate();
    ASSERT_TRUE(r.ok()) << i << ": " << r.error();
    held.push_back(r->block.index);
    (*a)->data(r->block.index)[0] = 1;  // committed memory is writable
  }
  EXPECT_EQ(budget.committed(), 63 * page);
  EXPECT_FALSE((*b)->allocate().ok()) << "one page left, a B block needs two";
  // A's blocks freed: B takes their pages back from the budget on demand.
  for (kv::BlockIndex i : held) (*a)->release(i);
  EXPECT_EQ(budget.committed(), 63 * page);  // free blocks keep their pages until asked
  for (int i = 0; i < 32; ++i) {
    auto r = (*b)->allocate();
    ASSERT_TRUE(r.ok()) << i << ": " << r.error();
    (*b)->data(r->block.index)[page] = 2;
    EXPECT_LE(budget.committed(), budget.limit());
  }
  EXPECT_EQ(budget.committed(), 64 * page);
  EXPECT_EQ((*a)->committed_bytes(), 0u);
  EXPECT_TRUE((*a)->check_integrity().ok());
  EXPECT_TRUE((*b)->check_integrity().ok());
}

// A window exit's FP16 source is released before the queued quantisation reads it; pinned, its
// pages survive another pool's allocation until the work has run (they were decommitted, and
// the read faulted, in KvFallback.OtherSequencesOfTheStepKeepTheirOwnRows).
TEST(KvMemoryBudget, PinnedFreeBlocksKeepTheirPagesUntilUnpinned) {
  const uint64_t page = 4096;
  kv::MemoryBudget budget(2 * page);
  auto a = kv::BlockPool::create({2, page, 2, &budget});
  auto b = kv::BlockPool::create({2, page, 2, &budget});
  ASSERT_TRUE(a.ok() && b.ok());
  const auto mem_a = kv::test::attach_host_memory(**a);
  const auto mem_b = kv::test::attach_host_memory(**b);
  auto x = (*a)->allocate();
  auto y = (*a)->allocate();
  ASSERT_TRUE(x.ok() && y.ok());
  (*a)->data(x->block.index)[0] = 7;
  (*a)->pin(x->block.index);
  (*a)->release(x->block.index);
  (*a)->release(y->block.index);
  // B needs a page: it may take y's, not the pinned x's.
  auto z = (*b)->allocate();
  ASSERT_TRUE(z.ok()) << z.error();
  EXPECT_EQ((*a)->data(x->block.index)[0], 7);  // still committed and readable
  EXPECT_FALSE((*b)->allocate().ok()) << "the only other page is pinned";
  (*a)->unpin_all();
  EXPECT_TRUE((*b)->allocate().ok());
  EXPECT_EQ((*a)->committed_bytes(), 0u);
  EXPECT_TRUE((*a)->check_integrity().ok());
  EXPECT_TRUE((*b)->check_integrity().ok());
}

TEST(KvMemoryBudget, CachedBlocksOfAnotherPoolAreEvictedWhenNothingIsFree) {
  const uint64_t page = 4096;
  kv::MemoryBudget budget(8 * page);
  auto a = kv::BlockPool::create({8, page, 2, &budget});
  auto b = kv::BlockPool::create({8, page, 2, &budget});
  ASSERT_TRUE(a.ok() && b.ok());
  const auto mem_a = kv::test::attach_host_memory(**a);
  const auto mem_b = kv::test::attach_host_memory(**b);
  std::vector<uint64_t> evicted;
  (*a)->set_evict_listener([&](uint64_t k) { evicted.push_back(k); });
  const std::vector<int32_t> toks = {1, 2};
  for (int i = 0; i < 8; ++i) {
    auto r = (*a)->allocate();
    ASSERT_TRUE(r.ok());
    (*a)->set_key(r->block.index, {static_cast<uint64_t>(100 + i), 0, 0}, toks);
    (*a)->release(r->block.index);  // cached (LRU), pages held
  }
  EXPECT_EQ((*a)->num_cached(), 8);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*b)->allocate().ok());
  EXPECT_EQ(evicted, (std::vector<uint64_t>{100, 101, 102}));  // least recently used first
  EXPECT_EQ((*a)->num_cached(), 5);
  EXPECT_LE(budget.committed(), budget.limit());
  EXPECT_TRUE((*a)->check_integrity().ok());
}

// Two managers (an int8 sink/window regime and an all-f16 one) on one budget: admission is by
// bytes, and what one regime frees the other can use.
TEST(KvMemoryBudget, ManagersOfTwoRegimesAdmitByBytes) {
  planner::KvLayout int8;
  int8.k = int8.v = planner::KvFormat{planner::KvType::kInt8, 0};
  int8.block_size = 4;
  int8.sink_tokens = 4;
  int8.window_tokens = 8;
  planner::KvLayout f16 = int8;
  f16.k = f16.v = planner::kKvF16;
  const uint64_t page = 4096;
  kv::MemoryBudget budget(40 * page);
  const auto make = [&](const planner::KvLayout& l, uint64_t body_bytes) {
    kv::BlockManagerConfig c;
    c.layout = l;
    c.model_id = "m";
    c.fp16_block_bytes = 2 * page;
    c.body_block_bytes = body_bytes;
    c.budget = &budget;
    auto m = kv::BlockManager::create(c);
    EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error());
    return std::move(m).value();
  };
  kv::BlockManager q = make(int8, page);     // FP16 sink/window blocks 2 pages, body 1
  kv::BlockManager h = make(f16, 2 * page);  // every block 2 pages
  std::vector<int32_t> p80(80, 7);           // 20 blocks: 3 FP16 (sink + window) + 17 body
  ASSERT_TRUE(q.can_allocate(p80));
  ASSERT_TRUE(q.allocate(1, p80).ok());  // 3 x 2 + 17 x 1 = 23 pages
  std::vector<int32_t> p36(36, 9);       // 9 f16 blocks = 18 pages > 17 left
  EXPECT_FALSE(h.can_allocate(p36));
  std::vector<int32_t> p32(32, 9);  // 8 blocks = 16 pages
  ASSERT_TRUE(h.can_allocate(p32));
  ASSERT_TRUE(h.allocate(2, p32).ok());
  EXPECT_FALSE(q.can_append(1, 8));
  ASSERT_TRUE(h.free(2).ok());
  EXPECT_TRUE(q.can_append(1, 8));
  EXPECT_TRUE(q.check_integrity().ok());
  EXPECT_TRUE(h.check_integrity().ok());
}

// ---- the policy --------------------------------------------------------------------------

TEST(KvPolicy, ParsesRangesAndPicksByLength) {
  auto p = parse_kv_policy("int4_asym:0-16k,int8:16384-");
  ASSERT_TRUE(p.ok()) << p.error();
  EXPECT_EQ(kv_policy_regime(*p, 100), "int4_asym");
  EXPECT_EQ(kv_policy_regime(*p, 16383), "int4_asym");
  EXPECT_EQ(kv_policy_regime(*p, 16384), "int8");
  EXPECT_EQ(kv_policy_regime(*p, 1 << 20), "int8");
  EXPECT_EQ(format_kv_policy(*p), "int4_asym:0-16384,int8:16384-");
  auto gap = parse_kv_policy("int8:100-200");
  ASSERT_TRUE(gap.ok());
  EXPECT_FALSE(kv_policy_regime(*gap, 50).has_value());
  for (const char* bad :
       {"", "int8", "int8:", "int8:5", "int8:a-b", "int8:10-5", ":0-", "int8:0-100,f16:50-"}) {
    EXPECT_FALSE(parse_kv_policy(bad).ok()) << bad;
  }
  EXPECT_NE(parse_kv_policy("int8:0-100,f16:50-").error().find("overlap"), std::string::npos);
}

// ---- the engine's regimes ----------------------------------------------------------------

struct Done {
  std::vector<int32_t> tokens;
  FinishEvent fin;
};

Done run(Engine& e, EngineRequest r) {
  static RequestId id = 1;
  test::Collected c;
  test::run_to_end(e, id++, std::move(r), c);
  return {c.tokens, *c.finish};
}

EngineConfig regime_config(const char* dtype, int64_t max_len = 2048, uint64_t mib = 24) {
  EngineConfig c;
  c.kv.kv.dtype = dtype;
  c.kv.max_model_len = max_len;
  c.kv.max_num_seqs = 4;
  c.kv.chunked_prefill_size = 256;
  c.kv.kv_cache_memory = mib << 20;
  c.threads = 2;
  c.check_integrity = true;
  return c;
}

EngineRequest greedy(const Engine& e, const std::string& text, int n) {
  EngineRequest r;
  tokenizer::EncodeOptions eo;
  eo.parse_special = true;
  r.prompt = e.tokenizer().encode(text, eo);
  r.sampling.temperature = 0;
  r.max_tokens = n;
  return r;
}

TEST(KvRegimes, KillSwitchOverrideAndPolicy) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  EngineConfig c = regime_config("int4_asym");
  c.kv_regimes = {"int8"};
  c.kv_policy = "fp8_e4m3:1000-";
  auto e = Engine::create(c);
  ASSERT_TRUE(e.ok()) << e.error();
  Engine& eng = **e;
  const KvPolicyInfo info = eng.kv_policy();
  ASSERT_EQ(info.regimes.size(), 4u);  // int4_asym (default), f16, int8, fp8_e4m3
  EXPECT_EQ(info.regimes[0].name, "int4_asym");
  EXPECT_EQ(info.regimes[1].label, "f16");
  EXPECT_FALSE(info.force_f16);
  EXPECT_EQ(info.policy, "fp8_e4m3:1000-");
  // f16 costs 3.6x the body bytes of int4 (16 vs 4.5 bits): the budget holds far fewer f16
  // tokens, even with int4's FP16 sink block and window (64-token blocks) counted.
  EXPECT_GT(info.regimes[0].tokens_fit, 2 * info.regimes[1].tokens_fit);
  EXPECT_NE(eng.kv_report().regimes.find("kill switch"), std::string::npos);

  const std::string text = "The capital of France is";
  const std::string label4 = info.regimes[0].label;
  const std::string label8 = "k=int8_channel_t64 v=int8";  // the int8 recipe's layout
  EXPECT_EQ(run(eng, greedy(eng, text, 4)).fin.metrics.kv_regime, label4);
  EngineRequest want8 = greedy(eng, text, 4);
  want8.kv_cache_dtype = "int8";
  EXPECT_EQ(run(eng, want8).fin.metrics.kv_regime, label8);
  EngineRequest longer = greedy(eng, text, 1200);  // prompt + max_tokens >= 1000: policy
  longer.max_tokens = 1100;
  longer.ignore_eos = true;
  longer.stop = {};
  EngineRequest shortened = longer;
  shortened.max_tokens = 2;  // the policy looks at the request's length, not what it generates
  EXPECT_EQ(eng.kv_regime_for(longer), "fp8_e4m3");
  EXPECT_EQ(eng.kv_regime_for(shortened), label4);
  EngineRequest unknown = greedy(eng, text, 4);
  unknown.kv_cache_dtype = "int3";
  const Done bad = run(eng, unknown);
  EXPECT_EQ(bad.fin.finish_reason, "refused");
  EXPECT_NE(bad.fin.error.find("not one of this engine's KV regimes"), std::string::npos);

  eng.set_force_f16(true);  // the kill switch beats the request's own choice and the policy
  EXPECT_TRUE(eng.kv_policy().force_f16);
  EXPECT_EQ(eng.kv_regime(), "f16");
  EXPECT_EQ(run(eng, want8).fin.metrics.kv_regime, "f16");
  EXPECT_EQ(eng.kv_regime_for(longer), "f16");
  eng.set_force_f16(false);
  EXPECT_EQ(run(eng, want8).fin.metrics.kv_regime, label8);
  eng.wait_idle();
  for (const auto& p : eng.metrics().pools) EXPECT_EQ(p.blocks_used, 0) << p.format;
}

// The kill switch's f16 regime gives exactly what an f16 engine gives, and a prompt the budget
// cannot hold in f16 is refused at submit while the 4-bit default still takes it.
TEST(KvRegimes, F16RegimeMatchesAnF16EngineAndRefusesWhatDoesNotFit) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  auto plain = Engine::create(regime_config("f16", 1024, 32));
  auto mixed = Engine::create(regime_config("int4_asym", 1024, 12));
  ASSERT_TRUE(plain.ok()) << plain.error();
  ASSERT_TRUE(mixed.ok()) << mixed.error();
  const std::string text =
      "<|im_start|>user\nName three rivers in Europe.<|im_end|>\n<|im_start|>assistant\n";
  EngineRequest f16 = greedy(**mixed, text, 24);
  f16.kv_cache_dtype = "f16";
  const Done a = run(**plain, greedy(**plain, text, 24));
  const Done b = run(**mixed, f16);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(b.fin.metrics.kv_regime, "f16");

  const KvPolicyInfo info = (*mixed)->kv_policy();
  const int64_t fit16 = info.regimes[1].tokens_fit;
  ASSERT_LT(fit16, info.regimes[0].tokens_fit);
  EngineRequest big;
  ASSERT_LT(fit16 + 10, 1024) << "the f16 regime must hold less than --max-model-len here";
  big.prompt.assign(static_cast<size_t>(fit16 + 10), 100);
  big.max_tokens = 1;
  big.kv_cache_dtype = "f16";
  const Done refused = run(**mixed, big);
  EXPECT_EQ(refused.fin.finish_reason, "refused");
  EXPECT_NE(refused.fin.error.find("holds"), std::string::npos) << refused.fin.error;
  big.kv_cache_dtype.clear();
  EXPECT_EQ(run(**mixed, big).fin.finish_reason, "length");
  // Requests of both regimes at once share the budget; everything returns afterwards.
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i) {
    ts.emplace_back([&, i] {
      EngineRequest r = greedy(**mixed, text, 16);
      if (i % 2) r.kv_cache_dtype = "f16";
      EXPECT_EQ(run(**mixed, r).fin.finish_reason, "length");
    });
  }
  for (auto& t : ts) t.join();
  (*mixed)->wait_idle();
  for (const auto& p : (*mixed)->metrics().pools) EXPECT_EQ(p.blocks_used, 0) << p.format;
}

// --kv-fallback-entropy: a request in the default regime is measured at its prompt's last token;
// below the threshold it is computed again in the fallback regime before its first token, so it
// gives exactly what the fallback regime gives, says so in its metrics and its first token event,
// and leaves no block behind. A request that names its regime, or whose prompt has nothing
// quantised yet (all inside the FP16 sink and window), is never moved.
std::string long_prompt() {
  std::string t = "<|im_start|>user\nRead the ledger, then answer.\n";
  for (int i = 0; i < 48; ++i) {
    t += "Entry " + std::to_string(i) + ": crate " + std::to_string(7 * i + 3) +
         " went to the harbour at dawn.\n";
  }
  t += "The secret code is 4417.\nWhat is the secret code?<|im_end|>\n<|im_start|>assistant\n";
  return t;
}

struct FirstRegime {
  test::Collected c;
  std::string first;  // the first token event's kv_regime
};

FinishEvent run_watching(Engine& e, EngineRequest r, FirstRegime& w) {
  static RequestId id = 1000;
  RequestCallbacks cb = test::collect(w.c);
  auto inner = cb.on_token;
  cb.on_token = [&w, inner](const TokenEvent& ev) {
    if (w.c.tokens.empty()) w.first = ev.kv_regime;
    return inner(ev);
  };
  EXPECT_FALSE(e.submit(id++, std::move(r), cb).has_value());
  w.c.wait();
  return *w.c.finish;
}

TEST(KvFallback, SpikyRequestsAreRecomputedInTheFallbackRegime) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  EngineConfig c = regime_config("int4_asym");
  c.kv_fallback_entropy = 1.0;  // every prompt with weight on its quantised body falls back
  auto e = Engine::create(c);
  ASSERT_TRUE(e.ok()) << e.error();
  Engine& eng = **e;
  const std::string label4 = eng.kv_policy().regimes[0].label;
  const std::string label8 = "k=int8_channel_t64 v=int8";
  const std::string text = long_prompt();
  ASSERT_GT(greedy(eng, text, 1).prompt.size(), 400u) << "the prompt must reach the body";

  EngineRequest named8 = greedy(eng, text, 12);
  named8.kv_cache_dtype = "int8";
  const Done want = run(eng, named8);
  EXPECT_LT(want.fin.metrics.attn_entropy, 0) << "a request that names its regime is not measured";
  FirstRegime w;
  const FinishEvent fin = run_watching(eng, greedy(eng, text, 12), w);
  EXPECT_EQ(fin.finish_reason, want.fin.finish_reason);
  EXPECT_TRUE(fin.metrics.kv_fallback);
  EXPECT_EQ(fin.metrics.kv_regime, label8);
  EXPECT_EQ(w.first, label8);
  EXPECT_GE(fin.metrics.attn_entropy, 0.0);
  EXPECT_LT(fin.metrics.attn_entropy, 1.0);
  EXPECT_EQ(w.c.tokens, want.tokens) << "the fallback gives what its regime gives";
  EXPECT_EQ(fin.metrics.preemptions, 0);
  EngineMetrics m = eng.metrics();
  EXPECT_EQ(m.kv_entropy_probes, 1);
  EXPECT_EQ(m.kv_fallbacks, 1);

  // Nothing quantised yet: the figure is 1, not below the threshold.
  const Done short_one = run(eng, greedy(eng, "The capital of France is", 4));
  EXPECT_FALSE(short_one.fin.metrics.kv_fallback);
  EXPECT_EQ(short_one.fin.metrics.attn_entropy, 1.0);
  EXPECT_EQ(short_one.fin.metrics.kv_regime, label4);
  // Two choices fork after the fallback's prompt: both ran in it.
  EngineRequest two = greedy(eng, text, 6);
  two.n = 2;
  two.sampling.temperature = 0.7f;
  two.sampling.seed = 5;
  test::Collected c0;
  ASSERT_FALSE(eng.submit(2000, two, test::collect(c0)).has_value());
  eng.wait_idle();
  ASSERT_TRUE(c0.finish.has_value());
  EXPECT_TRUE(c0.finish->metrics.kv_fallback);
  EXPECT_EQ(c0.finish->metrics.kv_regime, label8);
  m = eng.metrics();
  EXPECT_EQ(m.kv_entropy_probes, 3);
  EXPECT_EQ(m.kv_fallbacks, 2);
  EXPECT_EQ(test::used_blocks(eng), 0);
}

// A request that falls back leaves its step's other sequences alone: their logits rows still
// reach them (the pass's rows are compacted). A long prompt keeps the engine busy while the two
// arrive, so they are admitted together and sample in the same step.
TEST(KvFallback, OtherSequencesOfTheStepKeepTheirOwnRows) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  EngineConfig c = regime_config("int4_asym");
  c.kv_fallback_entropy = 1.0;
  c.enable_prefix_caching = false;
  c.kv.chunked_prefill_size = 1024;
  c.max_num_batched_tokens = 2048;
  auto e = Engine::create(c);
  ASSERT_TRUE(e.ok()) << e.error();
  Engine& eng = **e;
  EngineRequest b = greedy(
      eng, "<|im_start|>user\nName three rivers in Europe.<|im_end|>\n<|im_start|>assistant\n", 8);
  b.kv_cache_dtype = "int4_asym";
  const Done alone = run(eng, b);
  EngineRequest busy = greedy(eng, long_prompt() + long_prompt(), 4);
  busy.kv_cache_dtype = "int4_asym";
  test::Collected cb, ca, cc;
  ASSERT_FALSE(eng.submit(3000, busy, test::collect(cc)).has_value());
  ASSERT_FALSE(eng.submit(3001, greedy(eng, long_prompt(), 8), test::collect(ca)).has_value());
  ASSERT_FALSE(eng.submit(3002, b, test::collect(cb)).has_value());
  eng.wait_idle();
  ASSERT_TRUE(ca.finish && cb.finish && cc.finish);
  EXPECT_TRUE(ca.finish->metrics.kv_fallback);
  EXPECT_FALSE(cb.finish->metrics.kv_fallback);
  EXPECT_EQ(cb.tokens, alone.tokens);
  EXPECT_EQ(test::used_blocks(eng), 0);
}

// A threshold no prompt is under measures and moves nothing: the default's own output.
TEST(KvFallback, AboveTheThresholdTheDefaultServes) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  EngineConfig c = regime_config("int4_asym");
  c.kv_fallback_entropy = 1e-6;
  auto e = Engine::create(c);
  ASSERT_TRUE(e.ok()) << e.error();
  const std::string text = long_prompt();
  EngineRequest named4 = greedy(**e, text, 12);
  named4.kv_cache_dtype = "int4_asym";
  const Done want = run(**e, named4);
  const Done got = run(**e, greedy(**e, text, 12));
  EXPECT_FALSE(got.fin.metrics.kv_fallback);
  EXPECT_GT(got.fin.metrics.attn_entropy, 0.0);
  EXPECT_EQ(got.fin.metrics.kv_regime, (*e)->kv_policy().regimes[0].label);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ((*e)->metrics().kv_entropy_probes, 1);
  EXPECT_EQ((*e)->metrics().kv_fallbacks, 0);
}

TEST(KvRegimes, BadRegimeConfigIsRefused) {
  BIE_REQUIRE_FILE(::bie::test::smollm2_path());
  EngineConfig c = regime_config("int4_asym");
  c.kv_regimes = {"int5"};
  auto e = Engine::create(c);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().find("--kv-regimes"), std::string::npos) << e.error();
  c.kv_regimes.clear();
  c.kv_policy = "int8:0-";
  c.kv_policy += ",f16:10-";
  auto p = Engine::create(c);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().find("--kv-policy"), std::string::npos) << p.error();
  c.kv_policy.clear();
  c.kv_fallback_entropy = 1.5;
  auto f = Engine::create(c);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().find("--kv-fallback-entropy must be in (0, 1]"), std::string::npos)
      << f.error();
  c.kv_fallback_entropy = 0.5;
  c.kv_fallback_regime = "int5";
  auto g = Engine::create(c);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().find("--kv-fallback-entropy regime 'int5'"), std::string::npos) << g.error();
}

}  // namespace
}  // namespace bie
