// The KV/engine flags `bie run`, `bie bench` and `bie quality` share (same names as `bie plan`):
// registration on a sub-command and conversion into KvEngineOptions. CLI-only; not thread-safe.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "bie/backend/device.h"
#include "bie/common/result.h"
#include "bie/engine/kv_setup.h"

namespace bie::cli {

struct KvCliFlags {
  KvEngineOptions opts;
  std::string kv_cache_memory;  // byte-size strings, parsed by to_engine_options
  std::string device_memory;
  std::string device = "auto";  // --device auto|cpu|vulkan[:N]
  std::string kv_layer_map;     // --kv-layer-map FILE, read by to_engine_options
};

// Registers --kv-cache-dtype[-k|-v], --kv-group-size, --paged-block-size, --kv-sink-tokens,
// --kv-window(-tokens), --kv-rotate/--no-kv-rotate, --kv-layer-map, -c/--ctx-size/--max-model-len,
// --max-num-seqs, -b/--batch-size/--chunked-prefill-size, --kv-cache-memory,
// --gpu-memory-utilization, --device-memory. `dtype_help` describes --kv-cache-dtype (bench
// accepts a comma list there).
void add_kv_engine_flags(CLI::App* cmd, KvCliFlags& f, const std::string& dtype_help);

// The device --device names on this machine (errors name the flag and what exists).
[[nodiscard]] Result<ResolvedDevice> resolve_cli_device(const KvCliFlags& f);

// The backend device a model runs on: "cpu" or "vulkan:N" (create_backend's names). auto picks
// a real GPU when one is present (never a CPU-type Vulkan device such as lavapipe) and the CPU
// otherwise; a named device that is missing is an error line naming what exists.
[[nodiscard]] Result<std::string> model_device(const KvCliFlags& f);

// The options with byte sizes parsed and the layer map read; errors name the flag.
[[nodiscard]] Result<KvEngineOptions> to_engine_options(const KvCliFlags& f);

}  // namespace bie::cli
