// `bie quality --calibrate`: a per-layer KV format map chosen by measured sensitivity.
//
// Method (docs/kv-quality.md, "Per-layer precision"):
//  1. The cheapest 4-bit recipe on every layer is the base: K int4_channel_t<B>, V int4_asym_g128
//     (g64 where V heads are 64 wide).
//  2. For each layer and each move -- K to int8_channel_t<B>, V one group narrower, V to int8 --
//     the mean KLD against f16 is measured with only that layer moved (3 * n_layer + 1 regimes,
//     one pass over the calibration windows, in lock step with f16). A move's gain is the base's
//     KLD minus its KLD.
//  3. Greedy under the budget: while some move fits the average bits/value (planner bytes,
//     kv_body_bits_per_value), apply the one with the most gain per added bit (a layer's V may
//     move on from g64 to int8 for the difference). Gains are taken as additive.
//  4. The map is measured as a regime of its own beside the uniform recipe (--regimes' default
//     int4_asym), so the report states what the additivity assumption delivered.
// Not thread-safe (runs the model).
#pragma once

#include <string>
#include <vector>

#include "bie/common/result.h"
#include "bie/engine/quality.h"
#include "bie/planner/kv_layout_flags.h"

namespace bie {

struct KvCalibrateConfig {
  planner::KvLayoutFlags base;      // block size, sinks, window (the dtype flags are ignored)
  double max_bits_per_value = 4.5;  // the map's body average over K and V, scales included
  std::vector<int32_t> ctx_sizes = {1024};
  int32_t windows = 1;
  int32_t batch = 512;
};

struct KvLayerSensitivity {
  double k8_gain = 0.0;   // mean-KLD drop when this layer's K is int8_channel
  double v64_gain = 0.0;  // ... V at the middle step (int4_asym_g64 on 128-wide heads)
  double v8_gain = 0.0;   // ... V int8
};

struct KvCalibration {
  std::string value_base, value_mid;       // V's base and middle step (int4_asym_g128, _g64)
  int block_size = 0;                      // tokens per block and per-channel key tile
  double base_kld = 0.0;                   // every layer at the cheapest recipe
  double base_bits = 0.0;                  // its average bits/value
  std::vector<KvLayerSensitivity> layers;  // [n_layer]
  std::vector<planner::KvLayerNames> map;  // the chosen formats, [n_layer]
  double map_bits = 0.0;                   // the map's average bits/value (planner bytes)
  double predicted_kld = 0.0;              // base_kld minus the chosen moves' gains
  // Measured on the calibration windows after choosing: the map and the uniform int4_asym.
  double map_kld = 0.0, map_dppl_pct = 0.0;
  double uniform_kld = 0.0, uniform_dppl_pct = 0.0, uniform_bits = 0.0;
};

// `geom` is the target model's (the bits of a map); every measurement runs on `target`.
[[nodiscard]] Result<KvCalibration> calibrate_kv_layer_map(
    const QualityTarget& target, const planner::ModelGeometry& geom, const std::string& text,
    const KvCalibrateConfig& cfg, const QualityProgress& progress = {});

// The --kv-layer-map file of a calibration (planner::kv_layer_map_json), with the measurements
// as informative fields.
[[nodiscard]] std::string kv_calibration_json(const KvCalibration& c, const std::string& model,
                                              const std::string& text,
                                              const KvCalibrateConfig& cfg);

}  // namespace bie
