// Built-in model presets: the geometry fields of well-known models' Hugging Face config.json,
// compiled into the binary, each with the URL it was taken from and the parameter count its
// authors publish. Constant data; thread-safe.
#pragma once

#include <span>
#include <string_view>

#include "bie/common/result.h"
#include "bie/planner/model_geometry.h"

namespace bie::planner {

struct ModelPreset {
  std::string_view name;           // "llama-3-8b"
  std::string_view display;        // "Meta Llama 3 8B"
  std::string_view source;         // URL of the config.json the fields come from
  double published_params;         // total parameters as published (model card / paper)
  double published_params_active;  // active per token for MoE, else equal to published_params
  std::string_view config_json;    // the config.json fields the planner reads, verbatim values
};

[[nodiscard]] std::span<const ModelPreset> model_presets();

// Geometry of a preset by name (case-insensitive).
[[nodiscard]] Result<ModelGeometry> preset_geometry(std::string_view name);

}  // namespace bie::planner
