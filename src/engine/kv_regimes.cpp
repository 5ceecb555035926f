#include "engine/kv_regimes.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "bie/planner/plan_report.h"

namespace bie {

namespace {

// Pools of every layer group with each block rounded up to whole pages (how a shared budget lays
// blocks out).
uint64_t page_bytes(const std::vector<planner::KvGroupPool>& groups) {
  uint64_t sum = 0;
  for (const planner::KvGroupPool& p : groups) {
    sum += static_cast<uint64_t>(p.fp16_blocks) * kv::MemoryBudget::block_cost(p.fp16_block_bytes) +
           static_cast<uint64_t>(p.body_blocks) * kv::MemoryBudget::block_cost(p.body_block_bytes);
  }
  return sum;
}

// The rules of --kv-policy (none when it is empty).
Result<std::vector<KvLengthRule>> policy_rules(const std::string& policy) {
  if (policy.empty()) return std::vector<KvLengthRule>{};
  return parse_kv_policy(policy);
}

}  // namespace

// The regimes cfg asks for, one per layout (the first asker names it); on a device the automatic
// kill switch is left out (its pools would take a share of the budget up front).
Result<std::vector<KvRegimes::Wanted>> KvRegimes::wanted(const KvRegimesConfig& cfg,
                                                         std::span<const KvLengthRule> policy,
                                                         const planner::ModelGeometry& g,
                                                         bool on_device) {
  const planner::KvLayoutFlags& base = cfg.base;
  std::vector<std::pair<std::string, std::string>> asked;  // (name, what asked for it)
  const bool split_kv = !base.dtype_k.empty() || !base.dtype_v.empty();
  asked.emplace_back(split_kv ? std::string() : base.dtype, "default");
  if (cfg.kill_switch) asked.emplace_back("f16", "kill switch");
  for (const std::string& n : cfg.extra) asked.emplace_back(n, "--kv-regimes");
  for (const KvLengthRule& r : policy) asked.emplace_back(r.regime, "--kv-policy");
  if (!cfg.fallback.empty()) asked.emplace_back(cfg.fallback, "--kv-fallback-entropy");
  // (name, what asked for it, flags): the named ones are the default's flags with that dtype.
  std::vector<std::tuple<std::string, std::string, planner::KvLayoutFlags>> flagged;
  for (const auto& [name, why] : asked) {
    planner::KvLayoutFlags f = base;
    if (!name.empty() || !split_kv) {
      f.dtype = name;
      f.dtype_k.clear();
      f.dtype_v.clear();
    }
    if (why != std::string("default")) f.layer_map.clear();  // a layer map refines the default only
    flagged.emplace_back(name, why, f);
  }
  for (const planner::KvLayoutFlags& f : cfg.layouts) flagged.emplace_back("", "layout", f);
  std::vector<Wanted> out;
  for (const auto& [name, why, f] : flagged) {
    auto layout = kv_layout_for_model(g, f);
    if (!layout) return Error{fmt::format("{} regime '{}': {}", why, name, layout.error())};
    const std::string label = planner::kv_layout_label(*layout);
    const auto same =
        std::find_if(out.begin(), out.end(), [&](const Wanted& w) { return w.label == label; });
    if (same != out.end()) {
      same->also_f16 = same->also_f16 || name == "f16";
      same->also_fallback = same->also_fallback || why == "--kv-fallback-entropy";
      continue;
    }
    if (on_device && why == "kill switch") continue;
    out.push_back({name, why, f, *layout, label, name == "f16", why == "--kv-fallback-entropy"});
  }
  return out;
}

Result<int64_t> KvRegimes::device_regime_count(const KvRegimesConfig& cfg,
                                               const planner::ModelGeometry& g) {
  auto policy = policy_rules(cfg.policy);
  if (!policy) return Error{policy.error()};
  auto w = wanted(cfg, *policy, g, true);
  if (!w) return Error{w.error()};
  return static_cast<int64_t>(w->size());
}

Result<std::unique_ptr<KvRegimes>> KvRegimes::create(const KvRegimesConfig& cfg,
                                                     const planner::ModelGeometry& g,
                                                     const KvGeometry& geo,
                                                     const std::string& model_id, Backend& backend,
                                                     KvSetupReport& report) {
  std::unique_ptr<KvRegimes> rs(new KvRegimes());
  auto policy = policy_rules(cfg.policy);
  if (!policy) return Error{policy.error()};
  rs->policy_ = std::move(policy).value();
  const bool on_device = !backend.reserves_on_demand();  // pools allocated up front
  auto asked = wanted(cfg, rs->policy_, g, on_device);
  if (!asked) return Error{asked.error()};
  if (on_device && static_cast<int64_t>(asked->size()) != report.kv_regime_shares) {
    return Error{
        fmt::format("KV regimes on {}: {} asked for, the plan has {} share(s) of the KV memory "
                    "(KvEngineOptions::kv_regime_shares must be KvRegimes::device_regime_count)",
                    backend.name(), asked->size(), report.kv_regime_shares)};
  }
  // Each regime's pools: the report's for the default; on a device each other regime's planned
  // in its own share of the KV memory (allocated up front, so the plan stays what is allocated);
  // on the host every regime sizes its pools to the whole budget and commits pages on demand, so
  // all share the default's limit. limits[i]: the bytes regime i may hold (its pools with
  // page-aligned blocks, within its budget).
  const size_t planned = on_device ? asked->size() : 1;
  std::vector<std::vector<planner::KvGroupPool>> pools(planned);
  std::vector<uint64_t> limits(planned);
  report.other_regime_pool_bytes = 0;
  for (size_t i = 0; i < planned; ++i) {
    uint64_t budget = report.kv_budget_bytes;
    if (i == 0) {
      pools[i] = report.groups;
    } else {
      const Wanted& w = (*asked)[i];
      if (!cfg.plan_device_pools) return Error{"KV regimes on a device need plan_device_pools"};
      auto sub = cfg.plan_device_pools(w.flags);
      if (!sub) return Error{fmt::format("{} regime '{}': {}", w.why, w.name, sub.error())};
      pools[i] = sub->groups;
      budget = sub->kv_budget_bytes;
      report.other_regime_pool_bytes += sub->kv_pool_bytes();
    }
    limits[i] = std::min(page_bytes(pools[i]), budget);
    // A device binds each pool as at most kMaxKvPoolParts buffers: what one pool may span.
    if (on_device) limits[i] = std::min(limits[i], backend.max_kv_pool_bytes());
  }
  uint64_t limit = 0;
  for (uint64_t l : limits) limit += l;
  rs->budget_ = std::make_unique<kv::MemoryBudget>(limit);
  std::vector<KvRegime>& regimes = rs->regimes_;
  std::string line;
  for (size_t i = 0; i < asked->size(); ++i) {
    const Wanted& w = (*asked)[i];
    PagedKvStoreConfig sc;
    sc.geometry = geo;
    sc.layout = w.layout;
    sc.model_id = model_id;
    sc.enable_prefix_caching = cfg.enable_prefix_caching;
    sc.budget = rs->budget_.get();
    sc.events = cfg.events;
    sc.events_medium = w.name.empty() ? w.label : w.name;
    sc.backend = &backend;
    if (on_device) {  // pools allocated as planned
      sc.groups = pools[i];
      sc.pools_as_given = true;
    }
    auto store = PagedKvStore::create(sc);
    if (!store) return Error{store.error()};
    // The longest single sequence this regime's bytes hold (page-rounded blocks).
    const uint64_t mine = on_device ? limits[i] : limit;
    const auto bytes_for = [&](int64_t n) {
      return page_bytes(
          planner::kv_pool_plan(g, w.layout, n, 1, report.chunked_prefill_size).groups);
    };
    int64_t lo = 0, hi = planner::kMaxPlanContext;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (bytes_for(mid) <= mine)
        lo = mid;
      else
        hi = mid - 1;
    }
    if (w.also_f16) rs->f16_ = i;
    if (w.also_fallback && i != 0) rs->fallback_ = i;
    regimes.push_back({w.name.empty() ? w.label : w.name, w.label, std::move(store).value(), lo});
    std::string held;
    if (on_device) {
      uint64_t bytes = 0;
      for (const planner::KvGroupPool& p : pools[i]) bytes += p.bytes();
      held = ", pools " + planner::format_bytes(static_cast<double>(bytes));
    }
    line +=
        fmt::format("{}{} ({}, {} tokens{})", line.empty() ? "" : "; ", w.label, w.why, lo, held);
  }
  if (regimes[0].tokens_fit < report.max_model_len) {
    return Error{fmt::format(
        "the KV budget {} holds {} tokens of one sequence at {} with page-aligned blocks, fewer "
        "than --max-model-len {}; lower --max-model-len or raise the KV memory",
        planner::format_bytes(static_cast<double>(limit)), regimes[0].tokens_fit, regimes[0].label,
        report.max_model_len)};
  }
  if (regimes.size() > 1) {
    report.regimes =
        on_device ? fmt::format(
                        "kv regimes on {}, each with its own pools in a {} share of the KV "
                        "memory (allocated up front): {}",
                        backend.name(),
                        planner::format_bytes(static_cast<double>(report.kv_budget_bytes)), line)
                  : fmt::format("kv regimes sharing the {} of KV (page-aligned blocks): {}",
                                planner::format_bytes(static_cast<double>(limit)), line);
  }
  return rs;
}

std::vector<PagedKvStore*> KvRegimes::stores() const {
  std::vector<PagedKvStore*> out;
  for (const KvRegime& r : regimes_) out.push_back(r.store.get());
  return out;
}

Result<size_t> KvRegimes::pick(const EngineRequest& req, int64_t length) const {
  if (force_f16_) return f16_;
  const auto find = [&](const std::string& name) -> std::optional<size_t> {
    for (size_t i = 0; i < regimes_.size(); ++i) {
      if (regimes_[i].name == name || regimes_[i].label == name) return i;
    }
    return std::nullopt;
  };
  if (!req.kv_cache_dtype.empty()) {
    if (auto i = find(req.kv_cache_dtype)) return *i;
    std::string names;
    for (const KvRegime& r : regimes_) names += (names.empty() ? "" : ", ") + r.name;
    return Error{fmt::format("kv_cache_dtype '{}' is not one of this engine's KV regimes ({})",
                             req.kv_cache_dtype, names)};
  }
  if (auto name = kv_policy_regime(policy_, length)) {
    if (auto i = find(*name)) return *i;
  }
  return size_t{0};
}

KvPolicyInfo KvRegimes::info() const {
  KvPolicyInfo p;
  p.force_f16 = force_f16_;
  p.policy = format_kv_policy(policy_);
  for (const KvRegime& r : regimes_) p.regimes.push_back({r.name, r.label, r.tokens_fit});
  p.budget_bytes = budget_->limit();
  return p;
}

void KvRegimes::fill_metrics(EngineMetrics& m) const {
  m.kv_budget_bytes = budget_->limit();
  m.kv_committed_bytes = budget_->committed();
  // Pools by storage format across regimes; totals are what the whole budget holds in it.
  std::map<std::string, EngineMetrics::Pool> by_format;
  int64_t queried = 0, hits = 0;
  m.kv_held_bytes = 0;
  for (const KvRegime& rg : regimes_) {
    m.kv_held_bytes += rg.store->coordinator().held_bytes();
    const kv::BlockManager& mgr = rg.store->coordinator().manager();
    // Blocks of every layer group count as used; totals are in the lead group's blocks.
    for (int gi = 0; gi < rg.store->coordinator().n_groups(); ++gi) {
      const kv::BlockManager& gm = rg.store->coordinator().manager(gi);
      const planner::KvLayerFormats body = rg.store->coordinator().group_body(gi);
      const std::array<std::string, kv::kPoolKinds> names = {
          "f16", planner::kv_format_name(body.k) +
                     (body.k == body.v ? std::string() : "/" + planner::kv_format_name(body.v))};
      for (int p = 0; p < kv::kPoolKinds; ++p) {
        const kv::BlockPool& pool = gm.pool(kv::PoolKind(p));
        if (pool.n_blocks() == 0) continue;
        EngineMetrics::Pool& e = by_format[names[static_cast<size_t>(p)]];
        e.format = names[static_cast<size_t>(p)];
        // (a format only a layer map's other group stores: that group's blocks)
        if (&gm == &mgr || e.blocks_total == 0) {
          e.blocks_total = static_cast<int64_t>(budget_->limit() / pool.stride());
        }
        e.blocks_used += pool.num_active();
        e.blocks_cached += pool.num_cached();
      }
    }
    queried += mgr.prefix_stats().queried_blocks;
    hits += mgr.prefix_stats().hit_blocks;
  }
  m.pools.clear();
  for (auto& [name, e] : by_format) {
    e.blocks_free = e.blocks_total - e.blocks_used;
    m.pools.push_back(e);
  }
  if (!regimes_.empty()) {
    const kv::BlockManager& lead = regimes_.front().store->coordinator().manager();
    m.kv_block_size = lead.block_size();
    const kv::BlockPool& body = lead.pool(kv::PoolKind::kBody);
    const kv::BlockPool& any = body.n_blocks() > 0 ? body : lead.pool(kv::PoolKind::kFp16);
    if (any.stride() > 0) {
      m.kv_blocks_default = static_cast<int64_t>(budget_->limit() / any.stride());
    }
  }
  m.kv_usage = budget_->limit() > 0 ? static_cast<double>(budget_->active_cost()) /
                                          static_cast<double>(budget_->limit())
                                    : 0.0;
  m.prefix_queried_blocks = queried;
  m.prefix_hit_blocks = hits;
}

std::vector<PrefixCacheListing> KvRegimes::prefix_cache_listing() const {
  std::map<std::string, PrefixCacheListing> by_medium;
  for (const KvRegime& rg : regimes_) {
    for (int g = 0; g < rg.store->coordinator().n_groups(); ++g) {
      const kv::BlockManager& m = rg.store->coordinator().manager(g);
      for (const kv::CachedBlock& b : m.cached_blocks()) {
        PrefixCacheListing& l = by_medium[m.event_medium(b.pool)];
        l.block_size = m.block_size();
        l.hashes.push_back(b.chain);
      }
    }
  }
  std::vector<PrefixCacheListing> out;
  for (auto& [medium, l] : by_medium) {
    l.medium = medium;
    std::sort(l.hashes.begin(), l.hashes.end());
    out.push_back(std::move(l));
  }
  return out;
}

}  // namespace bie
