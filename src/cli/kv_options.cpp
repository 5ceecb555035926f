#include "cli/kv_options.h"

#include <fmt/format.h>

#include "bie/planner/kv_layer_map.h"

namespace bie::cli {

void add_kv_engine_flags(CLI::App* cmd, KvCliFlags& f, const std::string& dtype_help) {
  planner::KvLayoutFlags& kv = f.opts.kv;
  cmd->add_option("--kv-cache-dtype", kv.dtype, dtype_help)->capture_default_str();
  cmd->add_option("--kv-cache-dtype-k", kv.dtype_k, "K format (overrides --kv-cache-dtype)");
  cmd->add_option("--kv-cache-dtype-v", kv.dtype_v, "V format (overrides --kv-cache-dtype)");
  cmd->add_option("--kv-group-size", kv.group_size,
                  "int4_asym values per group (the 4-bit recipe's V, int4_asym_gN): 32, 64 or 128")
      ->capture_default_str();
  cmd->add_option("--paged-block-size", kv.block_size,
                  "tokens per KV block and per-channel key tile (0: 64 for int4_asym, int8 and the "
                  "_channel formats, else 16)")
      ->capture_default_str();
  cmd->add_option("--kv-sink-tokens", kv.sink_tokens, "first tokens kept in FP16")
      ->capture_default_str();
  cmd->add_option("--kv-window,--kv-window-tokens", kv.window_tokens, "last tokens kept in FP16")
      ->capture_default_str();
  cmd->add_flag_callback(
      "--kv-rotate", [&kv] { kv.rotate = true; },
      "Hadamard-rotate K and Q (default: on for per-token int4_asym_gN keys)");
  cmd->add_flag_callback(
      "--no-kv-rotate", [&kv] { kv.rotate = false; }, "no rotation");
  cmd->add_option("--kv-layer-map", f.kv_layer_map,
                  "per-layer body formats (a file `bie quality --calibrate` writes); replaces "
                  "--kv-cache-dtype's formats layer by layer");
  cmd->add_option("-c,--ctx-size,--max-model-len", f.opts.max_model_len,
                  fmt::format("tokens per sequence (0: min(model's trained context, {}))",
                              kDefaultMaxModelLen))
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  cmd->add_option("--max-num-seqs", f.opts.max_num_seqs,
                  "sequences the KV budget must hold at --max-model-len")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  cmd->add_option("-b,--batch-size,--chunked-prefill-size", f.opts.chunked_prefill_size,
                  "prompt tokens per forward pass (bounds activation memory)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{8192}));
  cmd->add_option("--kv-cache-memory", f.kv_cache_memory,
                  "bytes for the KV pools, e.g. 512MiB, 2GiB, 1.5G (overrides the budget below)");
  cmd->add_option("--gpu-memory-utilization", f.opts.gpu_memory_utilization,
                  "share of --device-memory for weights + workspace + KV")
      ->capture_default_str();
  cmd->add_option(
      "--device-memory", f.device_memory,
      "device memory (default: the GPU's device-local memory, on the CPU physical RAM)");
  cmd->add_option("--device", f.device,
                  "auto (a GPU when one is present), cpu, vulkan or vulkan:N (see `bie info "
                  "--devices`); CPU-type Vulkan devices (lavapipe) only by name")
      ->capture_default_str();
}

Result<ResolvedDevice> resolve_cli_device(const KvCliFlags& f) {
  auto spec = parse_device_spec(f.device);
  if (!spec.ok()) return Error{"--device: " + spec.error()};
  if (spec->kind == DeviceSpec::Kind::kCpu) return ResolvedDevice{};
  return resolve_device(*spec, list_vulkan_devices());
}

Result<std::string> model_device(const KvCliFlags& f) {
  return backend_for_device(f.device);
}

Result<KvEngineOptions> to_engine_options(const KvCliFlags& f) {
  KvEngineOptions o = f.opts;
  if (!f.kv_layer_map.empty()) {
    auto map = planner::read_kv_layer_map(f.kv_layer_map);
    if (!map) return Error{map.error()};
    o.kv.layer_map = *map;
  }
  if (!f.kv_cache_memory.empty()) {
    auto b = parse_byte_size(f.kv_cache_memory);
    if (!b) return Error{"--kv-cache-memory: " + b.error()};
    o.kv_cache_memory = *b;
  }
  if (!f.device_memory.empty()) {
    auto b = parse_byte_size(f.device_memory);
    if (!b) return Error{"--device-memory: " + b.error()};
    o.device_memory = *b;
  }
  return o;
}

}  // namespace bie::cli
