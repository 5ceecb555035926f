// `bie plan`: will this model, at this context, fit on this device, and how fast can it decode?
// Parses flags into a PlanRequest, calls the planner and prints the report.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "bie/backend/backend.h"
#include "bie/backend/device.h"
#include "bie/engine/kv_setup.h"
#include "bie/engine/model_path.h"
#include "bie/planner/device_profile.h"
#include "bie/planner/kv_layer_map.h"
#include "bie/planner/kv_layout_flags.h"
#include "bie/planner/plan_report.h"
#include "bie/planner/planner.h"
#include "bie/planner/presets.h"
#include "cli/commands.h"

namespace bie::cli {

namespace {

struct PlanFlags {
  std::string model, config, preset;
  std::string weights;
  std::string device;
  std::optional<double> vram_gib, bandwidth_gbs, utilization, workspace_gib;
  bool tuned = false;
  double reserve_gib = 0, margin_gib = 0;
  int64_t max_model_len = 0, max_num_seqs = 1;
  std::string kv_dtype = "f16", kv_dtype_k, kv_dtype_v;
  int kv_group_size = 64, kv_sink_tokens = 8, kv_window_tokens = 128, block_size = 0;
  std::string kv_layer_map;
  int64_t chunked_prefill_size = 512;
  int draft_tokens = 0;
  std::string draft_model, draft_preset, draft_weights;
  double pcie_gbs = 16;
  bool json = false, no_compare = false;
  std::string svg;
  bool list_devices = false, list_presets = false, list_weights = false;
};

// A Vulkan device of this machine (`--device vulkan[:N]`) as a profile: its device-local memory
// and what VK_EXT_memory_budget says is available, the engine's default utilization, one
// binding's span; the bandwidth of a profile that describes the same card, else unknown.
Result<planner::DeviceProfile> vulkan_device_profile(const std::string& name) {
  auto spec = parse_device_spec(name);
  if (!spec) return Error{"--device: " + spec.error()};
  auto devices = list_vulkan_devices();
  auto r = resolve_device(*spec, devices);
  if (!r) return Error{"--device: " + r.error()};
  const auto it = std::find_if(devices->begin(), devices->end(),
                               [&](const GpuDeviceInfo& d) { return d.index == r->vulkan_index; });
  if (it == devices->end()) return Error{"--device: no Vulkan device " + name};
  const GpuDeviceInfo& d = *it;
  planner::DeviceProfile p;
  p.name = fmt::format("vulkan:{}", d.index);
  p.description = d.name;
  p.kind = planner::DeviceKind::kVulkan;
  p.memory_gib = static_cast<double>(d.device_local_total()) / static_cast<double>(1ull << 30);
  p.available_bytes = d.device_local_available();
  p.max_pool_bytes = d.max_binding_bytes() * kMaxKvPoolParts;    // a pool: up to 4 bindings
  p.usable_fraction = KvEngineOptions{}.gpu_memory_utilization;  // the engine's default
  p.tuned_fraction = p.usable_fraction;
  const auto lower = [](std::string t) {
    std::transform(t.begin(), t.end(), t.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return t;
  };
  std::string bw_from = "bandwidth unknown (give --bandwidth)";
  for (const planner::DeviceProfile& known : planner::device_profiles()) {
    if (lower(known.description).rfind(lower(d.name), 0) == 0) {
      p.bandwidth_gbs = known.bandwidth_gbs;
      bw_from = "bandwidth of the " + known.name + " profile";
      break;
    }
  }
  p.source = fmt::format("Vulkan device-local heaps{}; {}",
                         p.available_bytes > 0 ? " and VK_EXT_memory_budget" : "", bw_from);
  return p;
}

Result<planner::ModelGeometry> load_model(const std::string& model, const std::string& config,
                                          const std::string& preset, std::string_view what) {
  const int given = !model.empty() + !config.empty() + !preset.empty();
  if (given != 1) {
    return Error{
        fmt::format("give exactly one {} source: --{}model FILE.gguf, --{}config "
                    "config.json or --{}preset NAME",
                    what, what == "draft" ? "draft-" : "", what == "draft" ? "draft-" : "",
                    what == "draft" ? "draft-" : "")};
  }
  if (!model.empty()) {
    auto path = resolve_model_path(model);  // "default", "gemma3" or a file
    if (!path.ok()) return Error{path.error()};
    return planner::geometry_from_gguf_path(*path);
  }
  if (!config.empty()) return planner::geometry_from_hf_config_file(config);
  return planner::preset_geometry(preset);
}

void print_lists(const PlanFlags& f) {
  if (f.list_devices) {
    std::printf("%-22s %9s %10s %7s  %s\n", "device", "memory", "bandwidth", "usable",
                "description [source]");
    for (const auto& d : planner::device_profiles()) {
      std::printf("%-22s %5.0f GiB %5.0f GB/s %6.0f%%  %s [%s]\n", d.name.c_str(), d.memory_gib,
                  d.bandwidth_gbs, d.usable_fraction * 100, d.description.c_str(),
                  d.source.c_str());
    }
    std::printf("%-22s %9s %10s %7s  %s\n", "cpu", "MemTotal", "measured", "90%",
                "this host; bandwidth measured at run time");
  }
  if (f.list_presets) {
    for (const auto& p : planner::model_presets()) {
      std::printf("%-18s %-55s %s\n", std::string(p.name).c_str(), std::string(p.display).c_str(),
                  std::string(p.source).c_str());
    }
  }
  if (f.list_weights) {
    for (const auto& q : planner::weight_quant_table()) {
      std::printf("%-8s %5.2f bits/weight  aliases: %-36s %s\n", std::string(q.name).c_str(),
                  q.bits_per_weight, std::string(q.aliases).c_str(), std::string(q.source).c_str());
    }
  }
}

// Returns the exit code; prints the report or one error line.
int run_plan(const PlanFlags& f) {
  const auto fail = [](const std::string& msg) {
    std::fprintf(stderr, "bie plan: error: %s\n", msg.c_str());
    return kExitBadInput;
  };
  if (f.list_devices || f.list_presets || f.list_weights) {
    print_lists(f);
    return kExitOk;
  }

  planner::PlanRequest req;
  auto model = load_model(f.model, f.config, f.preset, "model");
  if (!model) return fail(model.error());
  req.model = std::move(model).value();

  if (!f.weights.empty()) {
    auto q = planner::find_weight_quant(f.weights);
    if (!q) return fail(q.error());
    req.weights = q.value();
  } else if (!req.model.weight_bytes) {
    return fail(
        "no weight sizes for a preset or config.json: give --weights (e.g. Q4_K_M, AWQ, F16)");
  }

  if (f.device.rfind("vulkan", 0) == 0) {
    auto d = vulkan_device_profile(f.device);
    if (!d) return fail(d.error());
    req.device = d.value();
  } else if (!f.device.empty()) {
    auto d = planner::find_device(f.device, /*measure_cpu=*/true);
    if (!d) return fail(d.error());
    req.device = d.value();
  } else if (f.vram_gib) {
    req.device.name = "custom";
    req.device.description = "given by --vram/--bandwidth";
    req.device.kind = planner::DeviceKind::kCustom;
    req.device.usable_fraction = 1.0;
    req.device.tuned_fraction = 1.0;
    req.device.source = "command line";
  } else {
    return fail("give --device NAME (see --list-devices) or --vram GiB [--bandwidth GB/s]");
  }
  if (f.vram_gib) req.device.memory_gib = *f.vram_gib;
  if (f.bandwidth_gbs) req.device.bandwidth_gbs = *f.bandwidth_gbs;
  req.utilization = f.utilization;
  req.tuned = f.tuned;
  req.reserve_gib = f.reserve_gib;
  req.margin_gib = f.margin_gib;
  req.workspace_gib = f.workspace_gib;
  req.max_model_len = f.max_model_len;
  req.max_num_seqs = f.max_num_seqs;
  req.chunked_prefill_size = f.chunked_prefill_size;
  req.pcie_gbs = f.pcie_gbs;
  req.compare_formats = !f.no_compare;

  planner::KvLayoutFlags lf;
  lf.dtype = f.kv_dtype;
  lf.dtype_k = f.kv_dtype_k;
  lf.dtype_v = f.kv_dtype_v;
  lf.group_size = f.kv_group_size;
  lf.block_size = f.block_size;
  lf.sink_tokens = f.kv_sink_tokens;
  lf.window_tokens = f.kv_window_tokens;
  if (!f.kv_layer_map.empty()) {
    auto map = planner::read_kv_layer_map(f.kv_layer_map);
    if (!map) return fail(map.error());
    lf.layer_map = *map;
  }
  auto layout = planner::resolve_kv_layout(lf);
  if (!layout) return fail(layout.error());
  req.layout = *layout;

  req.speculative_draft_tokens = f.draft_tokens;
  if (!f.draft_model.empty() || !f.draft_preset.empty()) {
    auto d = load_model(f.draft_model, "", f.draft_preset, "draft");
    if (!d) return fail("draft model: " + d.error());
    req.draft = std::move(d).value();
    if (!f.draft_weights.empty()) {
      auto q = planner::find_weight_quant(f.draft_weights);
      if (!q) return fail(q.error());
      req.draft_weights = q.value();
    }
  }

  auto plan = planner::make_plan(req);
  if (!plan) return fail(plan.error());

  if (!f.svg.empty()) {
    std::ofstream out(f.svg, std::ios::binary);
    out << planner::render_plan_svg(plan.value());
    if (!out) return fail(fmt::format("cannot write the chart to {}", f.svg));
  }
  const std::string text =
      f.json ? planner::render_plan_json(plan.value()) : planner::render_plan_text(plan.value());
  std::fwrite(text.data(), 1, text.size(), stdout);
  return kExitOk;
}

}  // namespace

void add_plan_command(CLI::App& root, int* rc) {
  CLI::App* cmd = root.add_subcommand(
      "plan", "Plan memory and speed for a model, KV format and device (does it fit, how fast)");
  auto f = std::make_shared<PlanFlags>();

  auto* src = cmd->add_option_group("model", "Where the model's geometry comes from (exactly one)");
  src->add_option("--model", f->model, "GGUF file (header only; exact weight bytes)");
  src->add_option("--config", f->config, "Hugging Face config.json");
  src->add_option("--preset", f->preset, "built-in model (see --list-presets)");
  cmd->add_option("--weights", f->weights,
                  "weight quantisation for presets/config.json, or to override a GGUF's "
                  "(Q4_K_M, AWQ, FP8, F16, ...; see --list-weights)");

  cmd->add_option("--device", f->device,
                  "accelerator profile (see --list-devices), cpu, or vulkan[:N] (this machine's "
                  "Vulkan device, as the engine allocates on it)");
  cmd->add_option("--vram", f->vram_gib, "device memory in GiB (overrides the profile's)");
  cmd->add_option("--bandwidth", f->bandwidth_gbs,
                  "memory bandwidth in GB/s (overrides the profile's)");
  cmd->add_option("--gpu-memory-utilization", f->utilization,
                  "share of device memory to plan with (default: the profile's usable share)");
  cmd->add_flag("--tuned", f->tuned,
                "use the profile's tuned share (Apple: raised iogpu.wired_limit_mb)");
  cmd->add_option("--reserve", f->reserve_gib, "GiB held back for desktop / other processes")
      ->capture_default_str();
  cmd->add_option("--margin", f->margin_gib, "safety margin in GiB")->capture_default_str();
  cmd->add_option("--workspace", f->workspace_gib,
                  "runtime workspace in GiB (default: the profile's)");

  cmd->add_option("--max-model-len", f->max_model_len,
                  "tokens per sequence (default: trained context)");
  cmd->add_option("--max-num-seqs", f->max_num_seqs, "sequences held at once")
      ->capture_default_str();
  cmd->add_option("--kv-cache-dtype", f->kv_dtype,
                  "f16, fp8_e4m3, int8, int4 (= int4_asym, int4_channel), int4_asym_gN, q8_0, q4_0")
      ->capture_default_str();
  cmd->add_option("--kv-cache-dtype-k", f->kv_dtype_k, "K format (overrides --kv-cache-dtype)");
  cmd->add_option("--kv-cache-dtype-v", f->kv_dtype_v, "V format (overrides --kv-cache-dtype)");
  cmd->add_option("--kv-group-size", f->kv_group_size,
                  "int4_asym values per group (the 4-bit recipe's V, int4_asym_gN): 32, 64 or 128")
      ->capture_default_str();
  cmd->add_option("--kv-sink-tokens", f->kv_sink_tokens, "first tokens kept in FP16")
      ->capture_default_str();
  cmd->add_option("--kv-layer-map", f->kv_layer_map,
                  "per-layer body formats (a file `bie quality --calibrate` writes)");
  cmd->add_option("--kv-window-tokens", f->kv_window_tokens, "last tokens kept in FP16")
      ->capture_default_str();
  cmd->add_option("--paged-block-size", f->block_size,
                  "tokens per KV block (0: 64 for int8, else 16)")
      ->capture_default_str();
  cmd->add_option("--chunked-prefill-size", f->chunked_prefill_size, "prefill chunk in tokens")
      ->capture_default_str();
  cmd->add_option("--speculative-draft-tokens", f->draft_tokens, "draft tokens per step (gamma)")
      ->capture_default_str();
  cmd->add_option("--draft-model,--speculative-model", f->draft_model, "draft model GGUF");
  cmd->add_option("--draft-preset", f->draft_preset, "draft model preset");
  cmd->add_option("--draft-weights", f->draft_weights, "draft model weight quantisation");
  cmd->add_option("--pcie-bandwidth", f->pcie_gbs, "host link in GB/s, for the spill estimate")
      ->capture_default_str();

  cmd->add_flag("--json", f->json, "print JSON instead of the table");
  cmd->add_option("--svg", f->svg, "write a chart of memory against context to FILE");
  cmd->add_flag("--no-compare", f->no_compare, "only the requested KV format");
  cmd->add_flag("--list-devices", f->list_devices, "list accelerator profiles");
  cmd->add_flag("--list-presets", f->list_presets, "list model presets");
  cmd->add_flag("--list-weights", f->list_weights, "list weight quantisations");

  cmd->callback([f, rc] { *rc = run_plan(*f); });
}

}  // namespace bie::cli
