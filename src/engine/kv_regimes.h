// The KV regimes of one engine (../shared/BRIEF.md §3): the default, the f16 kill switch, the
// --kv-regimes and the --kv-policy formats, each a PagedKvStore, all drawing on one MemoryBudget;
// the rule that picks a request's regime; and what the regimes' pools report to /metrics and
// the prefix-cache index. Built once at start-up. pick(), label_for_default(), info() and the
// kill switch are thread-safe (the switch is atomic); the metrics and the listing read the
// stores' block managers (engine thread, or after it stopped).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "bie/backend/backend.h"
#include "bie/common/result.h"
#include "bie/engine/engine.h"
#include "bie/engine/kv_policy.h"
#include "bie/engine/kv_setup.h"
#include "bie/kv/memory_budget.h"
#include "bie/kv/paged_kv_store.h"
#include "bie/planner/model_geometry.h"

namespace bie {

struct KvRegime {
  std::string name;   // as asked for ("int8"); the label when the default is a K/V split
  std::string label;  // planner::kv_layout_label of its layout
  std::unique_ptr<PagedKvStore> store;
  int64_t tokens_fit = 0;  // the longest single sequence the budget holds in this regime
};

struct KvRegimesConfig {
  planner::KvLayoutFlags base;     // the default regime's flags
  std::vector<std::string> extra;  // --kv-regimes
  // Regimes given as whole flags (EngineConfig::kv_regime_layouts), named by their labels.
  std::vector<planner::KvLayoutFlags> layouts;
  std::string policy;              // --kv-policy text, may be empty
  std::string fallback;            // --kv-fallback-entropy's regime, may be empty
  bool enable_prefix_caching = true;
  // The f16 regime the kill switch moves new requests to (a one-request tool has no use for it;
  // without it set_force_f16 keeps the default regime, as on a device).
  bool kill_switch = true;
  kv::KvEventSink* events = nullptr;
  // On a device: the pools of a regime other than the default, planned in its share of the KV
  // memory as the default's were (plan_kv_setup with the regime's flags and the same options).
  std::function<Result<KvSetupReport>(const planner::KvLayoutFlags&)> plan_device_pools;
};

class KvRegimes {
 public:
  // Builds the regimes over one budget: on the host every regime's pools span the report's KV
  // budget (blocks rounded up to whole pages) and commit pages on demand; on a device, where
  // pools are allocated up front, the default holds the report's pools and each other regime
  // its own, planned by cfg.plan_device_pools in an equal share of the KV memory
  // (report.kv_regime_shares must be device_regime_count; report.other_regime_pool_bytes is set).
  // Refuses a bad policy, a regime the model cannot hold, and a default regime that holds fewer
  // than report.max_model_len tokens; sets report.regimes when there are several.
  [[nodiscard]] static Result<std::unique_ptr<KvRegimes>> create(
      const KvRegimesConfig& cfg, const planner::ModelGeometry& g, const KvGeometry& geo,
      const std::string& model_id, Backend& backend, KvSetupReport& report);

  // How many regimes cfg asks for on a device (distinct layouts; the automatic kill switch is
  // left out there): KvEngineOptions::kv_regime_shares.
  [[nodiscard]] static Result<int64_t> device_regime_count(const KvRegimesConfig& cfg,
                                                           const planner::ModelGeometry& g);

  [[nodiscard]] size_t size() const { return regimes_.size(); }
  [[nodiscard]] const KvRegime& operator[](size_t i) const { return regimes_[i]; }
  [[nodiscard]] std::vector<PagedKvStore*> stores() const;

  // The regime a request runs in: the kill switch, its own choice (an unknown name is an error),
  // the length policy at `length` tokens, the default.
  [[nodiscard]] Result<size_t> pick(const EngineRequest& req, int64_t length) const;
  // The label new requests without a choice of their own run in.
  [[nodiscard]] const std::string& default_label() const {
    return regimes_[force_f16_ ? f16_ : 0].label;
  }
  void set_force_f16(bool on) { force_f16_ = on; }
  [[nodiscard]] bool force_f16() const { return force_f16_; }
  [[nodiscard]] KvPolicyInfo info() const;
  // The regime spiky requests fall back to (KvRegimesConfig::fallback); none when not asked for
  // or when it is the default's own layout.
  [[nodiscard]] std::optional<size_t> fallback() const { return fallback_; }

  // The KV part of EngineMetrics: budget, pools by storage format, prefix-cache counters, block
  // size and usage.
  void fill_metrics(EngineMetrics& m) const;
  // Every block in every regime's prefix index, by medium.
  [[nodiscard]] std::vector<PrefixCacheListing> prefix_cache_listing() const;

 private:
  KvRegimes() = default;

  struct Wanted {
    std::string name;  // as asked for; empty for a default K/V split
    std::string why;   // what asked for it ("default", "kill switch", "--kv-regimes", ...)
    planner::KvLayoutFlags flags;
    planner::KvLayout layout;
    std::string label;
    bool also_f16 = false;       // the kill switch's regime
    bool also_fallback = false;  // --kv-fallback-entropy's
  };
  [[nodiscard]] static Result<std::vector<Wanted>> wanted(const KvRegimesConfig& cfg,
                                                          std::span<const KvLengthRule> policy,
                                                          const planner::ModelGeometry& g,
                                                          bool on_device);

  std::unique_ptr<kv::MemoryBudget> budget_;
  std::vector<KvRegime> regimes_;  // regimes_[0] is the default
  size_t f16_ = 0;                 // the kill switch's regime
  std::optional<size_t> fallback_;
  std::vector<KvLengthRule> policy_;
  std::atomic<bool> force_f16_{false};
};

}  // namespace bie
