// The planner: model geometry + weights + device + KV layout -> budget equation, what fits, the
// largest context and sequence count per KV format, and decode speed bounds. make_plan() is a pure
// function of its request (the `cpu` device's bandwidth is measured before, by the caller).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bie/common/result.h"
#include "bie/planner/device_profile.h"
#include "bie/planner/kv_bytes.h"
#include "bie/planner/model_geometry.h"
#include "bie/planner/weights.h"

namespace bie::planner {

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kMiB = uint64_t{1} << 20;
// Largest context the planner searches; larger answers are reported as "at least" this.
constexpr int64_t kMaxPlanContext = int64_t{1} << 24;
// The scratch a device backend's paged attention keeps the partial results of a token's context
// splits in (decode spreads a token's keys over several workgroups; the Vulkan backend allocates
// it when it is created). A pass whose splits would not fit runs each token in one workgroup.
constexpr uint64_t kDeviceAttnScratchBytes = 4 * kMiB;

struct PlanRequest {
  ModelGeometry model;
  std::optional<WeightQuant> weights;  // nullopt: exact bytes from the GGUF tensor infos
  DeviceProfile device;
  std::optional<double> utilization;    // default: the device's usable (or tuned) fraction
  bool tuned = false;                   // use the device's tuned fraction as the default
  double reserve_gib = 0;               // desktop / driver / other processes
  double margin_gib = 0;                // safety margin on top
  std::optional<double> workspace_gib;  // default: the device's
  int64_t max_model_len = 0;            // 0: the model's training context
  int64_t max_num_seqs = 1;
  KvLayout layout;  // the requested KV layout
  int64_t chunked_prefill_size = 512;
  int speculative_draft_tokens = 0;
  std::optional<ModelGeometry> draft;  // draft model for speculative decoding
  std::optional<WeightQuant> draft_weights;
  double pcie_gbs = 16;
  bool compare_formats = true;  // also tabulate the standard KV formats
};

struct WeightsPlan {
  uint64_t bytes = 0;         // resident
  uint64_t active_bytes = 0;  // read per decoded token
  std::string label;          // "exact from GGUF tensors" or "AWQ @ 4.50 bpw"
  bool exact = false;
};

struct Budget {
  uint64_t device_bytes = 0;
  double utilization = 0;
  uint64_t reserve_bytes = 0;
  uint64_t usable_bytes = 0;  // device x utilisation - reserve
  uint64_t weights_bytes = 0;
  uint64_t activation_bytes = 0;
  uint64_t workspace_bytes = 0;
  uint64_t speculative_bytes = 0;
  uint64_t margin_bytes = 0;
  int64_t kv_budget_bytes = 0;  // usable minus all of the above; negative when over-committed
  [[nodiscard]] uint64_t fixed_bytes() const {
    return weights_bytes + activation_bytes + workspace_bytes + speculative_bytes + margin_bytes;
  }
};

struct SpeedPoint {
  int64_t depth = 0;           // tokens already in the sequence
  uint64_t kv_read_bytes = 0;  // KV bytes one decode step reads for one sequence
  double tok_s = 0;            // one sequence: bandwidth / (active weights + KV)
  double tok_s_all_seqs = 0;   // max_num_seqs sequences decoding together, aggregate
};

struct KvOption {
  std::string label;
  KvLayout layout;
  uint64_t bytes_per_token = 0;      // body format, all layers, flat (kv_bytes_per_token)
  uint64_t fp16_overhead_bytes = 0;  // per sequence: FP16 sinks + window beyond body cost
  uint64_t kv_bytes = 0;             // pools for max_num_seqs x max_model_len (kv_pool_plan)
  uint64_t total_bytes = 0;          // fixed + kv_bytes
  bool fits = false;
  int64_t headroom_bytes = 0;  // usable - total (negative: overflow)
  int64_t max_context = 0;     // per sequence with max_num_seqs sequences (<= kMaxPlanContext)
  int64_t max_seqs = 0;        // sequences of max_model_len that fit
  std::vector<SpeedPoint> speed;
  double spill_tok_s = 0;  // at max_model_len when it does not fit: overflow read over PCIe
};

struct Plan {
  ModelGeometry model;
  DeviceProfile device;
  WeightsPlan weights;
  Budget budget;
  int64_t max_model_len = 0;
  int64_t max_num_seqs = 1;
  int64_t chunked_prefill_size = 0;
  int speculative_draft_tokens = 0;
  double pcie_gbs = 0;
  std::vector<KvOption> options;   // options[0] is the requested layout
  std::vector<std::string> notes;  // assumptions worth stating next to the numbers
};

// Transient activation memory for prefill chunks of `chunk` tokens (f32 hidden states, q/k/v,
// FFN intermediates, one attention-score tile) plus the logits of one token per sequence.
[[nodiscard]] uint64_t activation_bytes(const ModelGeometry& g, int64_t chunk, int64_t n_seqs);

// The activation workspace a device backend holds for a dense decoder (the llama family and
// Gemma 3), exactly as the model allocates it when it binds to the device: per token of one pass
// (batch_tokens) the residual, normed and projected rows, q and the attention output, k, v, gate
// and up, one cos/sin row per RoPE table (two with sliding-window layers), the token id and the
// position; plus `out_rows` rows of f32 logits; plus the attention scratch the device backend
// holds from its creation (kDeviceAttnScratchBytes).
[[nodiscard]] uint64_t device_workspace_bytes(const ModelGeometry& g, int64_t batch_tokens,
                                              int64_t out_rows);

// Decode upper bound: bandwidth / bytes read per token.
[[nodiscard]] double decode_tok_s_bound(double bandwidth_gbs, uint64_t bytes_per_token);

// The same when `overflow_bytes` of what a step reads live in host memory behind PCIe.
[[nodiscard]] double decode_tok_s_spilled(double bandwidth_gbs, double pcie_gbs,
                                          uint64_t bytes_per_token, uint64_t overflow_bytes);

[[nodiscard]] Result<Plan> make_plan(const PlanRequest& req);

}  // namespace bie::planner
