#include "bie/planner/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace bie::planner {

namespace {

constexpr int64_t kAttnScoreTile = 256;  // KV positions per online-softmax tile
constexpr double kMaxGib = 1 << 20;      // 1 PiB: anything larger is a typo

uint64_t gib_to_bytes(double gib) {
  return static_cast<uint64_t>(std::llround(gib * kGiB));
}

std::string option_label(const KvLayout& l) {
  if (!l.per_layer.empty()) return "layer map";
  if (l.k == l.v) return kv_format_name(l.k);
  return fmt::format("K {} / V {}", kv_format_name(l.k), kv_format_name(l.v));
}

Status check_request(const PlanRequest& r) {
  const auto bad_num = [](std::string_view what, double v, std::string_view range) {
    return Error{fmt::format("{} must be {}, got {}", what, range, v)};
  };
  if (!(r.device.memory_gib > 0) || r.device.memory_gib > kMaxGib) {
    return bad_num("device memory (GiB)", r.device.memory_gib, "in (0, 1048576]");
  }
  if (!(r.device.bandwidth_gbs >= 0) || r.device.bandwidth_gbs > 1e6) {
    return bad_num("bandwidth (GB/s)", r.device.bandwidth_gbs, "in (0, 1000000]");
  }
  if (r.utilization && !(*r.utilization > 0 && *r.utilization <= 1)) {
    return bad_num("memory utilisation", *r.utilization, "in (0, 1]");
  }
  for (auto [what, v] : {std::pair<std::string_view, double>{"reserve (GiB)", r.reserve_gib},
                         {"margin (GiB)", r.margin_gib},
                         {"workspace (GiB)", r.workspace_gib.value_or(0)}}) {
    if (!(v >= 0) || v > kMaxGib) return bad_num(what, v, "in [0, 1048576]");
  }
  if (r.max_model_len < 0 || r.max_model_len > kMaxPlanContext) {
    return Error{
        fmt::format("max model length must be in 1..{}, got {}", kMaxPlanContext, r.max_model_len)};
  }
  if (r.max_model_len == 0 && r.model.n_ctx_train <= 0) {
    return Error{"the model does not state its context length; give --max-model-len"};
  }
  if (r.max_num_seqs < 1 || r.max_num_seqs > (1 << 20)) {
    return Error{
        fmt::format("max number of sequences must be in 1..1048576, got {}", r.max_num_seqs)};
  }
  if (r.chunked_prefill_size < 1 || r.chunked_prefill_size > (1 << 20)) {
    return Error{
        fmt::format("chunked prefill size must be in 1..1048576, got {}", r.chunked_prefill_size)};
  }
  if (r.speculative_draft_tokens < 0 || r.speculative_draft_tokens > 64) {
    return Error{fmt::format("speculative draft tokens must be in 0..64, got {}",
                             r.speculative_draft_tokens)};
  }
  if (!(r.pcie_gbs > 0) || r.pcie_gbs > 1e5)
    return bad_num("PCIe bandwidth (GB/s)", r.pcie_gbs, "in (0, 100000]");
  if (!r.weights && !r.model.weight_bytes) {
    return Error{"no weight sizes for this model: give --weights (e.g. Q4_K_M, AWQ, F16)"};
  }
  if (r.model.layers.empty()) return Error{"model has no layers"};
  if (auto s = check_kv_layout(r.model, r.layout); !s) return s;
  return {};
}

WeightsPlan plan_weights(const ModelGeometry& g, const std::optional<WeightQuant>& q) {
  WeightsPlan w;
  if (q) {
    w.bytes = weight_bytes_for(g.n_params, q->bits_per_weight);
    w.active_bytes = weight_bytes_for(g.n_params_active, q->bits_per_weight);
    w.label = fmt::format("{} at {:.2f} bits/weight", q->name, q->bits_per_weight);
  } else {
    w.bytes = *g.weight_bytes;
    w.active_bytes = *g.weight_bytes_active;
    w.label = "exact, from the GGUF tensor index";
    w.exact = true;
  }
  return w;
}

std::vector<int64_t> speed_depths(int64_t max_len) {
  std::vector<int64_t> d;
  for (int64_t x : {1024, 4096, 16384, 32768, 65536, 131072}) {
    if (x < max_len) d.push_back(x);
  }
  d.push_back(max_len);
  return d;
}

}  // namespace

uint64_t activation_bytes(const ModelGeometry& g, int64_t chunk, int64_t n_seqs) {
  const int64_t tokens = std::max(chunk, n_seqs);
  const int64_t q = g.n_head * g.head_dim;
  const int64_t attn_out = g.mla ? g.n_head * g.v_head_dim : q;
  int64_t kv = 0;
  for (const LayerKv& l : g.layers)
    kv = std::max<int64_t>(kv, int64_t{l.n_head_kv} * (l.head_dim_k + l.head_dim_v));
  if (g.mla) kv = g.n_head * (g.head_dim + g.v_head_dim);  // K and V are expanded per head
  int64_t ff = g.n_ff;
  if (g.is_moe()) {
    ff = std::max(ff, int64_t{g.moe.n_expert_used} * g.moe.expert_ff +
                          int64_t{g.moe.n_expert_shared} * g.moe.shared_ff);
  }
  // x, residual, normed x; q, k, v; attention output; gate, up, activated product.
  const int64_t floats_per_token = 3 * g.n_embd + q + kv + attn_out + 3 * ff;
  const int64_t score_tile = g.n_head * kAttnScoreTile;
  const uint64_t per_chunk =
      4 * static_cast<uint64_t>(tokens) * static_cast<uint64_t>(floats_per_token + score_tile);
  const uint64_t logits = 4 * static_cast<uint64_t>(g.n_vocab) * static_cast<uint64_t>(n_seqs);
  return per_chunk + logits;
}

uint64_t device_workspace_bytes(const ModelGeometry& g, int64_t batch_tokens, int64_t out_rows) {
  const int64_t q = g.n_head * g.head_dim;
  const int64_t kv = g.n_head_kv() * g.head_dim;
  const int64_t rope_tables = g.n_swa_layers() > 0 ? 2 : 1;
  const int64_t n_rot = g.n_rot > 0 ? g.n_rot : g.head_dim;
  // x, xn, proj; q, attn; k, v; gate, up; cos/sin; ids, pos (4-byte values throughout).
  const int64_t values = 3 * g.n_embd + 2 * q + 2 * kv + 2 * g.n_ff + rope_tables * n_rot + 2;
  return 4 * (static_cast<uint64_t>(batch_tokens) * static_cast<uint64_t>(values) +
              static_cast<uint64_t>(out_rows) * static_cast<uint64_t>(g.n_vocab)) +
         kDeviceAttnScratchBytes;
}

double decode_tok_s_bound(double bandwidth_gbs, uint64_t bytes_per_token) {
  if (bytes_per_token == 0) return 0;
  return bandwidth_gbs * 1e9 / static_cast<double>(bytes_per_token);
}

double decode_tok_s_spilled(double bandwidth_gbs, double pcie_gbs, uint64_t bytes_per_token,
                            uint64_t overflow_bytes) {
  if (bytes_per_token == 0 || bandwidth_gbs <= 0) return 0;
  const double over = static_cast<double>(std::min(overflow_bytes, bytes_per_token));
  const double local = static_cast<double>(bytes_per_token) - over;
  const double seconds = local / (bandwidth_gbs * 1e9) + over / (pcie_gbs * 1e9);
  return 1.0 / seconds;
}

Result<Plan> make_plan(const PlanRequest& req) {
  if (auto s = check_request(req); !s) return Error{s.error()};
  const ModelGeometry& g = req.model;

  Plan plan;
  plan.model = g;
  plan.device = req.device;
  plan.max_model_len =
      req.max_model_len > 0 ? req.max_model_len : std::min(g.n_ctx_train, kMaxPlanContext);
  plan.max_num_seqs = req.max_num_seqs;
  plan.chunked_prefill_size = req.chunked_prefill_size;
  plan.speculative_draft_tokens = req.speculative_draft_tokens;
  plan.pcie_gbs = req.pcie_gbs;
  plan.weights = plan_weights(g, req.weights);
  const int64_t L = plan.max_model_len;
  const int64_t S = plan.max_num_seqs;

  Budget& b = plan.budget;
  b.device_bytes = gib_to_bytes(req.device.memory_gib);
  b.utilization =
      req.utilization.value_or(req.tuned ? req.device.tuned_fraction : req.device.usable_fraction);
  b.reserve_bytes = gib_to_bytes(req.reserve_gib);
  const double usable =
      static_cast<double>(b.device_bytes) * b.utilization - static_cast<double>(b.reserve_bytes);
  b.usable_bytes = usable > 0 ? static_cast<uint64_t>(usable) : 0;
  const bool vulkan = req.device.kind == DeviceKind::kVulkan;
  if (vulkan && req.device.available_bytes > 0) {
    b.usable_bytes = std::min(b.usable_bytes, req.device.available_bytes);
  }
  if (vulkan && g.data_bytes && !req.weights) {
    plan.weights.bytes = *g.data_bytes;  // the data section is uploaded whole
    plan.weights.label = "GGUF data section, uploaded to the device";
  }
  b.weights_bytes = plan.weights.bytes;
  // The engine's pass: max(chunk, sequences) tokens, a logits row per sequence and draft token.
  b.activation_bytes =
      vulkan ? device_workspace_bytes(g, std::max(req.chunked_prefill_size, S),
                                      std::min(std::max(req.chunked_prefill_size, S),
                                               S * (1 + int64_t{req.speculative_draft_tokens})))
             : activation_bytes(g, req.chunked_prefill_size, S);
  b.workspace_bytes = gib_to_bytes(req.workspace_gib.value_or(req.device.workspace_gib));
  b.margin_bytes = gib_to_bytes(req.margin_gib);
  if (req.speculative_draft_tokens > 0) {
    // Draft tokens sit in the FP16 window of each sequence until verified.
    b.speculative_bytes = kv_bytes_per_token(g, kKvF16, kKvF16) *
                          static_cast<uint64_t>(req.speculative_draft_tokens) *
                          static_cast<uint64_t>(S);
    if (req.draft) {
      const ModelGeometry& d = *req.draft;
      if (!req.draft_weights && !d.weight_bytes) {
        return Error{"no weight sizes for the draft model: give --draft-weights"};
      }
      b.speculative_bytes += plan_weights(d, req.draft_weights).bytes;
      b.speculative_bytes += contiguous_kv_bytes(d, kKvF16, kKvF16, L, S);
      b.speculative_bytes += activation_bytes(d, req.speculative_draft_tokens + 1, S);
    }
  }
  b.kv_budget_bytes = static_cast<int64_t>(b.usable_bytes) - static_cast<int64_t>(b.fixed_bytes());
  if (vulkan && req.device.max_pool_bytes > 0 &&
      b.kv_budget_bytes > static_cast<int64_t>(req.device.max_pool_bytes)) {
    b.kv_budget_bytes = static_cast<int64_t>(req.device.max_pool_bytes);
    plan.notes.push_back(fmt::format(
        "the KV budget stops at {} MiB: each KV pool is at most four device buffers, each of "
        "which one shader binding spans (the device's maxStorageBufferRange)",
        req.device.max_pool_bytes >> 20));
  }

  std::vector<KvLayout> layouts{req.layout};
  if (req.compare_formats) {
    const auto with = [&](KvFormat k, KvFormat v) {
      KvLayout l = req.layout;
      l.k = k;
      l.v = v;
      l.per_layer.clear();
      return l;
    };
    const KvFormat g64{KvType::kInt4Asym, 64};
    for (KvLayout l :
         {with(kKvF16, kKvF16), with({KvType::kFp8E4M3, 0}, {KvType::kFp8E4M3, 0}),
          with({KvType::kInt8, 0}, {KvType::kInt8, 0}),
          with({KvType::kInt4Asym, 32}, {KvType::kInt4Asym, 32}), with(g64, g64),
          with({KvType::kInt4Asym, 128}, {KvType::kInt4Asym, 128}), with({KvType::kInt8, 0}, g64),
          with({KvType::kInt4Channel, req.layout.block_size}, g64),
          with({KvType::kQ8_0, 0}, {KvType::kQ8_0, 0}),
          with({KvType::kQ4_0, 0}, {KvType::kQ4_0, 0})}) {
      const bool dup = std::any_of(layouts.begin(), layouts.end(), [&](const KvLayout& x) {
        return x.k == l.k && x.v == l.v && x.per_layer.empty();
      });
      if (!dup && check_kv_layout(g, l).ok()) layouts.push_back(l);
    }
  }

  const double bw = req.device.bandwidth_gbs;
  for (const KvLayout& layout : layouts) {
    KvOption o;
    o.label = option_label(layout);
    o.layout = layout;
    o.bytes_per_token = kv_bytes_per_token(g, layout);
    o.fp16_overhead_bytes = kv_fp16_overhead_bytes(g, layout);
    const int64_t chunk = req.chunked_prefill_size;
    o.kv_bytes = kv_pool_plan(g, layout, L, S, chunk).total_bytes();
    o.total_bytes = b.fixed_bytes() + o.kv_bytes;
    o.headroom_bytes = static_cast<int64_t>(b.usable_bytes) - static_cast<int64_t>(o.total_bytes);
    o.fits = o.headroom_bytes >= 0 &&
             (!vulkan || req.device.max_pool_bytes == 0 || o.kv_bytes <= req.device.max_pool_bytes);
    if (b.kv_budget_bytes > 0) {
      const auto kv_budget = static_cast<uint64_t>(b.kv_budget_bytes);
      o.max_context = kv_max_tokens(g, layout, kv_budget, S, kMaxPlanContext, chunk);
      const uint64_t per_seq = kv_pool_plan(g, layout, L, 1, chunk).total_bytes();
      o.max_seqs = per_seq > 0 ? static_cast<int64_t>(kv_budget / per_seq) : 0;
    }
    for (int64_t depth : speed_depths(L)) {
      SpeedPoint p;
      p.depth = depth;
      p.kv_read_bytes = kv_sequence_bytes(g, layout, depth);
      p.tok_s = decode_tok_s_bound(bw, plan.weights.active_bytes + p.kv_read_bytes);
      const double step = static_cast<double>(plan.weights.active_bytes) +
                          static_cast<double>(S) * static_cast<double>(p.kv_read_bytes);
      p.tok_s_all_seqs = step > 0 ? static_cast<double>(S) * bw * 1e9 / step : 0;
      o.speed.push_back(p);
    }
    if (!o.fits) {
      const uint64_t read = plan.weights.active_bytes + kv_sequence_bytes(g, layout, L);
      o.spill_tok_s =
          decode_tok_s_spilled(bw, req.pcie_gbs, read, static_cast<uint64_t>(-o.headroom_bytes));
    }
    plan.options.push_back(std::move(o));
  }

  if (!plan.weights.exact) {
    plan.notes.push_back(
        "weights sized from bits/weight over all parameters; AWQ/GPTQ checkpoints "
        "often keep the embedding and output matrices in FP16, which adds to this");
  }
  if (g.n_swa_layers() > 0) {
    plan.notes.push_back(fmt::format(
        "{} of {} layers use a {}-token sliding window and keep only "
        "the blocks that hold their last {} tokens, plus, while a prefill pass runs, "
        "the blocks of its {} tokens (counted in the KV bytes)",
        g.n_swa_layers(), g.n_layer, g.max_window(), g.max_window(), req.chunked_prefill_size));
  }
  if (g.mla) {
    plan.notes.push_back(
        fmt::format("MLA: the cache holds the {}-wide latent plus {} rope values per "
                    "token and layer, stored as the K stream (no V)",
                    g.kv_lora_rank, g.qk_rope_dim));
  }
  if (g.n_ctx_train > 0 && L > g.n_ctx_train) {
    plan.notes.push_back(fmt::format("max model length {} exceeds the model's trained context {}",
                                     L, g.n_ctx_train));
  }
  if (bw <= 0) plan.notes.push_back("device bandwidth unknown: speed bounds are 0");
  return plan;
}

}  // namespace bie::planner
