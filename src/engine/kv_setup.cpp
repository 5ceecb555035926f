#include "bie/engine/kv_setup.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>

#include "bie/planner/device_profile.h"
#include "bie/planner/kv_bytes.h"
#include "bie/planner/plan_report.h"
#include "bie/planner/planner.h"

namespace bie {

namespace {

std::string bytes(uint64_t b) {
  return planner::format_bytes(static_cast<double>(b));
}

}  // namespace

Result<uint64_t> parse_byte_size(std::string_view text) {
  const auto bad = [&] {
    return Error{fmt::format(
        "'{}' is not a byte size (examples: 1073741824, 512MiB, 2GiB, 1.5G, 800MB)", text)};
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  const std::string num(text.substr(0, i));
  if (num.empty() || std::count(num.begin(), num.end(), '.') > 1 || num == ".") return bad();
  std::string unit;
  for (char c : text.substr(i))
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mul = 0;
  if (unit.empty() || unit == "b") {
    mul = 1;
  } else {
    const std::string prefixes = "kmgt";
    const size_t p = prefixes.find(unit[0]);
    if (p == std::string::npos) return bad();
    const std::string rest = unit.substr(1);
    if (rest.empty() || rest == "ib") {
      mul = std::pow(1024.0, static_cast<double>(p + 1));
    } else if (rest == "b") {
      mul = std::pow(1000.0, static_cast<double>(p + 1));
    } else {
      return bad();
    }
  }
  const double v = std::stod(num) * mul;
  if (!(v >= 0) || v >= 1.8e19) return bad();
  return static_cast<uint64_t>(std::llround(v));
}

Result<uint64_t> physical_memory_bytes() {
  auto cpu = planner::cpu_device_profile(/*measure=*/false);
  if (!cpu) return Error{cpu.error()};
  return static_cast<uint64_t>(cpu->memory_gib * static_cast<double>(planner::kGiB));
}

Result<planner::KvLayout> kv_layout_for_model(const planner::ModelGeometry& g,
                                              const planner::KvLayoutFlags& flags) {
  auto layout = planner::resolve_kv_layout(flags);
  if (!layout) return Error{layout.error()};
  if (Status s = planner::check_kv_layout(g, *layout); !s) return Error{s.error()};
  if (layout->rotate) {
    for (const planner::LayerKv& l : g.layers) {
      const int d = l.head_dim_k;
      if (d < 1 || d > 4096 || (d & (d - 1)) != 0) {
        return Error{fmt::format(
            "--kv-rotate needs a power-of-two key head dimension, this model's is {} (pass "
            "--no-kv-rotate)",
            d)};
      }
    }
  }
  return layout;
}

Result<KvSetupReport> plan_kv_setup(const planner::ModelGeometry& g, uint64_t weights_bytes,
                                    int64_t n_ctx_train, const KvEngineOptions& o) {
  KvSetupReport r;
  r.swa_layers = g.n_swa_layers();
  auto layout = kv_layout_for_model(g, o.kv);
  if (!layout) return Error{layout.error()};
  r.layout = *layout;
  r.layout_label = planner::kv_layout_label(r.layout);
  if (o.max_model_len < 0) return Error{"--max-model-len must be >= 1"};
  r.max_model_len = effective_max_model_len(o.max_model_len, n_ctx_train);
  if (o.device) r.device = o.device->device;
  if (o.max_num_seqs < 1) return Error{"--max-num-seqs must be >= 1"};
  if (o.chunked_prefill_size < 1) return Error{"--chunked-prefill-size must be >= 1"};
  r.max_num_seqs = o.max_num_seqs;
  r.chunked_prefill_size = o.chunked_prefill_size;
  r.weights_bytes = weights_bytes;
  r.draft_bytes = o.draft_bytes;
  r.workspace_bytes = o.workspace_bytes.value_or(
      planner::activation_bytes(g, o.chunked_prefill_size, o.max_num_seqs));
  r.bytes_per_token = planner::kv_bytes_per_token(g, r.layout);
  // Pools include the local layer groups' prefill-pass headroom (planner::kv_pool_plan).
  const int64_t chunk = o.chunked_prefill_size;
  r.seq_bytes = planner::kv_pool_plan(g, r.layout, r.max_model_len, 1, chunk).total_bytes();

  if (o.kv_cache_memory) {
    r.explicit_kv_memory = true;
    r.kv_budget_bytes = *o.kv_cache_memory;
  } else {
    if (!(o.gpu_memory_utilization > 0 && o.gpu_memory_utilization <= 1)) {
      return Error{fmt::format("--gpu-memory-utilization must be in (0, 1], got {}",
                               o.gpu_memory_utilization)};
    }
    if (o.device_memory) {
      r.device_bytes = *o.device_memory;
    } else if (o.device) {
      r.device_bytes = o.device->total;
    } else {
      auto ram = physical_memory_bytes();
      if (!ram) return Error{ram.error() + " (give --device-memory or --kv-cache-memory)"};
      r.device_bytes = *ram;
    }
    r.utilization = o.gpu_memory_utilization;
    r.usable_bytes =
        static_cast<uint64_t>(static_cast<double>(r.device_bytes) * o.gpu_memory_utilization);
    // Other processes' use of the device: never plan past what the driver says is available.
    if (o.device && !o.device_memory && o.device->available > 0 &&
        o.device->available < r.usable_bytes) {
      r.usable_bytes = o.device->available;
      r.device_available = o.device->available;
    }
    const uint64_t fixed = r.weights_bytes + r.workspace_bytes + r.draft_bytes;
    if (fixed >= r.usable_bytes) {
      return Error{fmt::format(
          "weights ({}) + workspace ({}){} do not fit the memory budget {} ({:.2f} x {}); raise "
          "--gpu-memory-utilization or --device-memory, or lower --chunked-prefill-size",
          bytes(r.weights_bytes), bytes(r.workspace_bytes),
          r.draft_bytes > 0 ? fmt::format(" + draft model ({})", bytes(r.draft_bytes)) : "",
          bytes(r.usable_bytes), r.utilization, bytes(r.device_bytes))};
    }
    r.kv_budget_bytes = r.usable_bytes - fixed;
  }
  if (o.kv_regime_shares < 1) return Error{"KV regime shares must be >= 1"};
  r.kv_regime_shares = o.kv_regime_shares;
  r.kv_budget_bytes /= static_cast<uint64_t>(o.kv_regime_shares);
  if (o.max_pool_bytes > 0 && r.kv_budget_bytes > o.max_pool_bytes) {
    // A pool is at most kMaxKvPoolParts device buffers, each bound whole by the attention shader:
    // the KV budget stops at what those bindings span (the pools of every group together, so
    // each one fits).
    r.kv_budget_bytes = o.max_pool_bytes;
    r.kv_binding_capped = true;
  }
  r.max_concurrency = r.seq_bytes > 0 ? static_cast<int64_t>(r.kv_budget_bytes / r.seq_bytes) : 0;
  r.tokens_fit =
      planner::kv_max_tokens(g, r.layout, r.kv_budget_bytes, 1, planner::kMaxPlanContext, chunk);
  if (r.max_concurrency < (o.require_all_seqs ? r.max_num_seqs : 1)) {
    const std::string way_out =
        r.kv_binding_capped
            ? fmt::format(
                  " (the KV budget stops at what {} device bindings span: {} on this "
                  "device, each KV pool being at most that many buffers)",
                  kMaxKvPoolParts, bytes(o.max_pool_bytes))
            : fmt::format(", or raise {}", r.explicit_kv_memory
                                               ? "--kv-cache-memory"
                                               : "--gpu-memory-utilization / --device-memory");
    const std::string shares =
        r.kv_regime_shares > 1
            ? fmt::format(
                  " (one of {} equal shares: each KV regime's pools are allocated up front "
                  "on the device; fewer --kv-regimes / --kv-policy regimes leave each more)",
                  r.kv_regime_shares)
            : "";
    return Error{fmt::format(
        "the KV budget {}{} holds {} of the {} sequence(s) of --max-model-len {} asked for at {} "
        "(one needs {}); the largest context that fits is {} tokens per sequence; lower "
        "--max-model-len or the KV dtype{}",
        bytes(r.kv_budget_bytes), shares, r.max_concurrency, r.max_num_seqs, r.max_model_len,
        r.layout_label, bytes(r.seq_bytes),
        // The serving engine needs one sequence to fit (require_all_seqs false).
        o.require_all_seqs && r.max_num_seqs > 1
            ? planner::kv_max_tokens(g, r.layout, r.kv_budget_bytes, r.max_num_seqs,
                                     planner::kMaxPlanContext, chunk)
            : r.tokens_fit,
        way_out)};
  }

  const planner::KvPoolPlan want =
      planner::kv_pool_plan(g, r.layout, r.max_model_len, r.max_num_seqs, chunk);
  r.groups = want.groups;
  if (want.groups.size() != 1) {
    // Layer groups (sliding-window layers): pools for as many sequences of max_model_len as the
    // budget holds, up to max_num_seqs; bytes left over are not spread over the groups.
    if (want.total_bytes() > r.kv_budget_bytes) {
      r.groups = planner::kv_pool_plan(g, r.layout, r.max_model_len,
                                       std::max<int64_t>(1, r.max_concurrency), chunk)
                     .groups;
    }
    for (const planner::KvGroupPool& gp : r.groups) {
      r.fp16_blocks += gp.fp16_blocks;
      r.body_blocks += gp.body_blocks;
    }
    return r;
  }
  const planner::KvGroupPool& p = want.groups[0];
  r.fp16_block_bytes = p.fp16_block_bytes;
  r.body_block_bytes = p.body_block_bytes;
  r.fp16_blocks = p.fp16_blocks;
  r.body_blocks = p.body_blocks;
  if (r.explicit_kv_memory || want.total_bytes() > r.kv_budget_bytes) {
    // Fill the given bytes: FP16 blocks for every sequence of max_model_len that fits, the rest
    // as body blocks (an unmixed layout has only body blocks).
    // (The serving engine keeps FP16 sink/window blocks for every running sequence when the
    // budget allows: short sequences live wholly in FP16.)
    const planner::KvPoolPlan all =
        planner::kv_pool_plan(g, r.layout, r.max_model_len, r.max_concurrency);
    r.fp16_blocks = all.groups[0].fp16_blocks;
    if (!o.require_all_seqs && r.max_num_seqs > r.max_concurrency) {
      const planner::KvGroupPool one =
          planner::kv_pool_plan(g, r.layout, r.max_model_len, 1).groups[0];
      const int64_t want16 = one.fp16_blocks * r.max_num_seqs;
      const uint64_t body_one = static_cast<uint64_t>(one.body_blocks) * r.body_block_bytes;
      if (static_cast<uint64_t>(want16) * r.fp16_block_bytes + body_one <= r.kv_budget_bytes) {
        r.fp16_blocks = want16;
      }
    }
    const uint64_t fp16_total = static_cast<uint64_t>(r.fp16_blocks) * r.fp16_block_bytes;
    r.body_blocks =
        r.body_block_bytes > 0
            ? static_cast<int64_t>((r.kv_budget_bytes - fp16_total) / r.body_block_bytes)
            : 0;
  }
  if (o.max_pool_bytes > 0) {
    // The device holds a pool in kMaxKvPoolParts bindings of whole blocks each.
    r.pool_part_bytes = o.max_pool_bytes / kMaxKvPoolParts;
    const auto fits = [&](uint64_t block_bytes) {
      return block_bytes > 0
                 ? static_cast<int64_t>(o.max_pool_bytes / kMaxKvPoolParts / block_bytes) *
                       kMaxKvPoolParts
                 : INT64_MAX;
    };
    r.fp16_blocks = std::min(r.fp16_blocks, fits(r.fp16_block_bytes));
    r.body_blocks = std::min(r.body_blocks, fits(r.body_block_bytes));
  }
  r.groups[0].fp16_blocks = r.fp16_blocks;
  r.groups[0].body_blocks = r.body_blocks;
  return r;
}

uint64_t apply_backend_memory(KvEngineOptions& opts, const planner::ModelGeometry& g,
                              const Model& model, const Backend& backend, int64_t out_rows) {
  std::optional<DeviceMemoryInfo> mem = backend.device_memory();
  if (!mem) return model.weight_bytes();
  opts.device = std::move(mem);
  opts.workspace_bytes = planner::device_workspace_bytes(g, opts.chunked_prefill_size, out_rows);
  if (backend.supports_paged_kv()) opts.max_pool_bytes = backend.max_kv_pool_bytes();
  return model.file().data_section().size();
}

Result<KvSetup> setup_kv_cache(const Model& model, const KvEngineOptions& opts, Backend* device) {
  const planner::ModelGeometry* g = &model.geometry();
  KvEngineOptions o = opts;
  const uint64_t weights =
      device != nullptr ? apply_backend_memory(o, *g, model, *device, 1) : model.weight_bytes();
  auto r = plan_kv_setup(*g, weights, model.geometry().n_ctx_train, o);
  if (!r) return Error{r.error()};
  PagedKvCacheConfig c;
  c.geometry = kv::kv_geometry(model.geometry());
  c.layout = r->layout;
  c.max_tokens = r->max_model_len;
  c.max_append = r->chunked_prefill_size;
  c.backend = device;
  auto cache = PagedKvCache::create(c, r->groups);
  if (!cache) return Error{cache.error()};
  KvSetup s;
  s.cache = std::move(cache).value();
  s.report = std::move(r).value();
  return s;
}

uint64_t kv_held_bytes(const PagedKvCache& kv) {
  return kv.store().coordinator().held_bytes();
}

std::string format_kv_report(const KvSetupReport& r) {
  std::string s;
  // Several regimes' pools on a device: the KV memory is their shares, the pools all of theirs.
  const std::string kv_budget = r.kv_regime_shares > 1
                                    ? fmt::format("{} x {} (a share per KV regime)",
                                                  r.kv_regime_shares, bytes(r.kv_budget_bytes))
                                    : bytes(r.kv_budget_bytes);
  const std::string draft =
      r.draft_bytes > 0 ? fmt::format(" + draft model {}", bytes(r.draft_bytes)) : "";
  if (r.explicit_kv_memory) {
    s += fmt::format(
        "memory{}: weights {} + workspace {} (chunk {}){} + KV pools {} (--kv-cache-memory {}{})\n",
        r.device.empty() ? "" : " on " + r.device, bytes(r.weights_bytes), bytes(r.workspace_bytes),
        r.chunked_prefill_size, draft, bytes(r.all_kv_pool_bytes()), kv_budget,
        r.kv_binding_capped ? ", what the device's KV bindings span" : "");
  } else if (!r.device.empty()) {
    // On a device: every byte named here is a device buffer (the weights as uploaded).
    const std::string avail =
        r.device_available > 0
            ? fmt::format("; {} available (VK_EXT_memory_budget)", bytes(r.device_available))
            : "";
    s += fmt::format(
        "memory on {}: budget {} ({:.2f} x {} device-local{}) = weights {} + workspace {} (chunk "
        "{}){} + KV {}{} (pools {})\n",
        r.device, bytes(r.usable_bytes), r.utilization, bytes(r.device_bytes), avail,
        bytes(r.weights_bytes), bytes(r.workspace_bytes), r.chunked_prefill_size, draft, kv_budget,
        r.kv_binding_capped ? ", what the device's KV bindings span" : "",
        bytes(r.all_kv_pool_bytes()));
  } else {
    s += fmt::format(
        "memory: budget {} ({:.2f} x {}) = weights {} + workspace {} (chunk {}){} + KV {} (pools "
        "{})\n",
        bytes(r.usable_bytes), r.utilization, bytes(r.device_bytes), bytes(r.weights_bytes),
        bytes(r.workspace_bytes), r.chunked_prefill_size, draft, bytes(r.kv_budget_bytes),
        bytes(r.kv_pool_bytes()));
  }
  s += fmt::format("kv: {}, block {}, ", r.layout_label, r.layout.block_size);
  if (r.groups.size() > 1) {
    // One pool pair per layer group; a local group holds only its sliding window.
    std::string parts;
    for (const planner::KvGroupPool& p : r.groups) {
      parts += fmt::format(
          "{}{} {} layers{}: ", parts.empty() ? "" : "; ", p.group.n_layers,
          p.group.shape.window > 0 ? "local" : "global",
          p.group.shape.window > 0 ? fmt::format(" (window {})", p.group.shape.window) : "");
      if (r.layout.mixed()) {
        parts += fmt::format("FP16 {} x {} + body {} x {}", p.fp16_blocks,
                             bytes(p.fp16_block_bytes), p.body_blocks, bytes(p.body_block_bytes));
      } else {
        parts += fmt::format("{} x {}", p.body_blocks, bytes(p.body_block_bytes));
      }
      parts += fmt::format(" = {}", bytes(p.bytes()));
    }
    if (r.layout.mixed()) {
      s += fmt::format("sink {} + window {} tokens FP16, ", r.layout.sink_tokens,
                       r.layout.window_tokens);
    }
    s += fmt::format("SWA-hybrid pools {} ({})\n", bytes(r.kv_pool_bytes()), parts);
  } else if (r.layout.mixed()) {
    s += fmt::format(
        "sink {} + window {} tokens FP16: FP16 pool {} x {} = {}, body pool {} x {} = {}\n",
        r.layout.sink_tokens, r.layout.window_tokens, r.fp16_blocks, bytes(r.fp16_block_bytes),
        bytes(static_cast<uint64_t>(r.fp16_blocks) * r.fp16_block_bytes), r.body_blocks,
        bytes(r.body_block_bytes),
        bytes(static_cast<uint64_t>(r.body_blocks) * r.body_block_bytes));
  } else {
    s += fmt::format("pool {} x {} = {}\n", r.body_blocks, bytes(r.body_block_bytes),
                     bytes(static_cast<uint64_t>(r.body_blocks) * r.body_block_bytes));
  }
  if (r.groups.size() == 1) {
    const int64_t n16 = r.pool_buffers(r.fp16_blocks, r.fp16_block_bytes);
    const int64_t nb = r.pool_buffers(r.body_blocks, r.body_block_bytes);
    if (n16 > 1 || nb > 1) {
      s += fmt::format(
          "kv: pools larger than one device binding ({}) are held in several buffers: {}{} "
          "buffer(s)\n",
          bytes(r.pool_part_bytes),
          r.layout.mixed() ? fmt::format("FP16 pool {}, body pool ", n16) : "pool ", nb);
    }
  }
  s += fmt::format(
      "kv: {} per token; max-model-len {} needs {} per sequence; the KV budget fits {}{} tokens "
      "(one sequence), {} sequences of {} (max-num-seqs {})\n",
      bytes(r.bytes_per_token), r.max_model_len, bytes(r.seq_bytes),
      r.tokens_fit >= planner::kMaxPlanContext ? ">= " : "", r.tokens_fit, r.max_concurrency,
      r.max_model_len, r.max_num_seqs);
  if (!r.regimes.empty()) s += r.regimes + "\n";
  return s;
}

}  // namespace bie
