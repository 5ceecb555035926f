// The engine's memory set-up, shared by `bie run`, `bie bench` and `bie quality`: from the loaded
// model and the KV/engine options, the memory budget (weights + prefill workspace + KV pools), the
// paged KV cache built with the pools that fit, and the one start-up report. Budget numbers come
// from the planner (planner::make_plan, kv_pool_plan, kv_max_tokens), so `bie plan` and the engine
// cannot disagree. Pure functions except setup_kv_cache (allocates the pools); thread-safe.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bie/backend/backend.h"
#include "bie/common/result.h"
#include "bie/kv/paged_kv_cache.h"
#include "bie/model/model.h"
#include "bie/planner/kv_bytes.h"
#include "bie/planner/kv_layout_flags.h"
#include "bie/planner/model_geometry.h"

namespace bie {

constexpr int64_t kDefaultMaxModelLen = 8192;  // cap on the default --max-model-len

// --max-model-len as asked (> 0), else min(the model's trained context, kDefaultMaxModelLen).
[[nodiscard]] inline int64_t effective_max_model_len(int64_t requested, int64_t n_ctx_train) {
  if (requested > 0) return requested;
  return n_ctx_train > 0 && n_ctx_train < kDefaultMaxModelLen ? n_ctx_train : kDefaultMaxModelLen;
}

struct KvEngineOptions {
  planner::KvLayoutFlags kv;           // --kv-cache-dtype[-k|-v], --kv-group-size, ... --kv-rotate
  int64_t max_model_len = 0;           // 0: min(model's n_ctx_train, kDefaultMaxModelLen)
  int64_t max_num_seqs = 1;            // sequences held at once (the CLI runs one)
  int64_t chunked_prefill_size = 512;  // tokens per forward pass; sizes the workspace
  // --kv-cache-memory: the KV pools get exactly this many bytes (filled with blocks, not capped
  // at max_model_len x max_num_seqs); the device budget below is then not consulted.
  std::optional<uint64_t> kv_cache_memory;
  double gpu_memory_utilization = 0.9;  // share of device memory the engine may use
  // true (one-sequence tools): the budget must hold max_num_seqs sequences of max_model_len.
  // false (the serving engine): one must fit; more sequences share the pools, admitted by free
  // blocks, and max_num_seqs only caps how many run at once.
  bool require_all_seqs = true;
  std::optional<uint64_t> device_memory;  // default: the device's memory, else physical RAM
  // The device the model runs on when it is not the host (Backend::device_memory): its
  // device-local memory is the default --device-memory, and the budget never exceeds what
  // VK_EXT_memory_budget says this process may use.
  std::optional<DeviceMemoryInfo> device;
  // The activation workspace when it is known exactly (on a device, what the model allocates:
  // planner::device_workspace_bytes); default planner::activation_bytes, an estimate.
  std::optional<uint64_t> workspace_bytes;
  // Bytes one KV pool may span on the device (Backend::max_kv_pool_bytes); 0: no limit.
  uint64_t max_pool_bytes = 0;
  // A speculative draft model's weights + workspace + KV pools (DraftModelBytes::total), taken
  // from the budget before the KV pools are sized.
  uint64_t draft_bytes = 0;
  // KV regimes whose pools a device allocates up front (the default first): the KV budget is
  // split into this many equal shares and the pools planned here fill the first (KvRegimes plans
  // the others' the same way, each in its own share).
  int64_t kv_regime_shares = 1;
};

// Everything the start-up report prints; also what tests compare with the planner.
struct KvSetupReport {
  std::string layout_label;  // planner::kv_layout_label
  planner::KvLayout layout;
  int64_t max_model_len = 0;
  int64_t max_num_seqs = 1;
  int64_t chunked_prefill_size = 0;
  bool explicit_kv_memory = false;
  std::string device;         // the device's name when it is not the host ("vulkan:0 (...)")
  uint64_t device_bytes = 0;  // 0 with --kv-cache-memory
  // VK_EXT_memory_budget's available bytes when they, not device x utilization, set usable_bytes.
  uint64_t device_available = 0;
  double utilization = 0;          // 0 with --kv-cache-memory
  uint64_t usable_bytes = 0;       // device x utilization
  uint64_t weights_bytes = 0;      // exact, from the GGUF tensor infos
  uint64_t workspace_bytes = 0;    // planner::activation_bytes(chunk, seqs), or the exact one
  uint64_t draft_bytes = 0;        // speculative draft model (KvEngineOptions::draft_bytes)
  uint64_t kv_budget_bytes = 0;    // usable - weights - workspace, or --kv-cache-memory
  bool kv_binding_capped = false;  // kv_budget_bytes stopped at KvEngineOptions::max_pool_bytes
  // KvEngineOptions::kv_regime_shares: kv_budget_bytes is one share of the KV memory, and
  // other_regime_pool_bytes the pools the other regimes' shares hold on the device.
  int64_t kv_regime_shares = 1;
  uint64_t other_regime_pool_bytes = 0;
  // Bytes of one device buffer of a KV pool (max_pool_bytes / kMaxKvPoolParts); 0: no limit.
  uint64_t pool_part_bytes = 0;
  // The pools, one entry per layer group (planner::kv_pool_plan's order: one for a model without
  // sliding windows; Gemma 3: its local layers, then its global layers).
  std::vector<planner::KvGroupPool> groups;
  // The pools summed over groups (blocks); the block bytes of a one-group model (0 otherwise).
  int64_t fp16_blocks = 0;
  int64_t body_blocks = 0;
  uint64_t fp16_block_bytes = 0;
  uint64_t body_block_bytes = 0;
  uint64_t bytes_per_token = 0;  // body format, all layers (planner::kv_bytes_per_token)
  uint64_t seq_bytes = 0;        // pools one max_model_len sequence needs (kv_pool_plan)
  int64_t tokens_fit = 0;        // longest single sequence the pools' bytes hold
  int64_t max_concurrency = 0;   // sequences of max_model_len the pools' bytes hold
  // The serving engine's KV regimes sharing the pools' bytes, one line (empty for one regime).
  std::string regimes;
  // Sliding-window layers of the model (their group keeps only the window).
  int64_t swa_layers = 0;

  // Device buffers a pool of `blocks` blocks of `block_bytes` takes (whole blocks per buffer, as
  // PagedKvStore allocates them): 1 without a part limit.
  [[nodiscard]] int64_t pool_buffers(int64_t blocks, uint64_t block_bytes) const {
    if (pool_part_bytes == 0 || block_bytes == 0 || blocks == 0) return 1;
    const auto per = std::max<int64_t>(1, static_cast<int64_t>(pool_part_bytes / block_bytes));
    return (blocks + per - 1) / per;
  }
  [[nodiscard]] uint64_t kv_pool_bytes() const {  // the default regime's pools
    uint64_t sum = 0;
    for (const planner::KvGroupPool& p : groups) sum += p.bytes();
    return sum;
  }
  [[nodiscard]] uint64_t all_kv_pool_bytes() const {  // every regime's (what a device holds)
    return kv_pool_bytes() + other_regime_pool_bytes;
  }
};

// The KV layout the flags ask for, checked against a model of geometry g (formats the geometry
// allows, --kv-rotate only with power-of-two key heads). Errors name the flag to change.
[[nodiscard]] Result<planner::KvLayout> kv_layout_for_model(const planner::ModelGeometry& g,
                                                            const planner::KvLayoutFlags& flags);

// Sizes pools for a model of geometry g, sliding-window layers keeping only their window (the
// SWA-hybrid bytes `bie plan` reports) (weights_bytes resident,
// trained context n_ctx_train). Errors (one line each, naming the flag to change): a bad layout,
// max_model_len beyond what the RoPE was trained for is allowed but must be >= 1, weights +
// workspace over the budget, a KV budget that cannot hold max_num_seqs sequences of max_model_len.
[[nodiscard]] Result<KvSetupReport> plan_kv_setup(const planner::ModelGeometry& g,
                                                  uint64_t weights_bytes, int64_t n_ctx_train,
                                                  const KvEngineOptions& opts);

struct KvSetup {
  std::unique_ptr<PagedKvCache> cache;  // one sequence of up to max_model_len tokens
  KvSetupReport report;
};

// The options for a model that runs on `backend`: on a device (Backend::device_memory), its
// memory, the model's exact workspace for passes of opts.chunked_prefill_size tokens returning
// `out_rows` logits rows, and the weights as uploaded (the GGUF data section; returned). On the
// host the options are unchanged and the weights are the model's tensor bytes.
[[nodiscard]] uint64_t apply_backend_memory(KvEngineOptions& opts, const planner::ModelGeometry& g,
                                            const Model& model, const Backend& backend,
                                            int64_t out_rows);

// plan_kv_setup for a loaded model, then the PagedKvCache with exactly the report's pools.
// device: pools in that backend's memory (nullptr: a CPU backend of the cache's own), and the
// budget of its memory (apply_backend_memory with one logits row).
[[nodiscard]] Result<KvSetup> setup_kv_cache(const Model& model, const KvEngineOptions& opts,
                                             Backend* device = nullptr);

// Bytes of the blocks the cache holds now (active blocks of both pools).
[[nodiscard]] uint64_t kv_held_bytes(const PagedKvCache& kv);

// The start-up report: three lines (budget, KV pools, capacity), each ending in '\n'.
[[nodiscard]] std::string format_kv_report(const KvSetupReport& r);

// "512MiB", "2GiB", "1.5G", "64k", "1000000": K/M/G/T and KiB/MiB/GiB/TiB are binary (2^10...),
// KB/MB/GB/TB decimal (10^3...), no suffix or B is bytes. Case-insensitive; no negatives.
[[nodiscard]] Result<uint64_t> parse_byte_size(std::string_view text);

// Physical memory (MemTotal from /proc/meminfo), or an error if it cannot be read.
[[nodiscard]] Result<uint64_t> physical_memory_bytes();

}  // namespace bie
