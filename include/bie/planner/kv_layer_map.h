// KV layer maps (--kv-layer-map FILE): the body formats of each layer, as `bie quality
// --calibrate` writes them. A JSON file:
//   {"format": "bie-kv-layer-map", "version": 1,
//    "model": "...", "bits_per_value": 4.49, ...,      (informative; ignored when read)
//    "layers": [{"k": "int4_channel", "v": "int4_asym_g64"}, ...]}   one entry per model layer
// Names are parse_kv_format's; a bare "int4_channel" takes the block size. resolve_kv_layout turns
// the names into KvLayout::per_layer and check_kv_layout checks them against the model.
#pragma once

#include <string>
#include <vector>

#include "bie/common/result.h"
#include "bie/planner/kv_layout_flags.h"

namespace bie::planner {

// Reads a map's layer names; errors name the file and what is wrong with it.
[[nodiscard]] Result<std::vector<KvLayerNames>> read_kv_layer_map(const std::string& path);

// The JSON text of a map: `layers` plus informative fields (model, bits_per_value, ...) given as
// a JSON object text in `extra_json` (may be empty).
[[nodiscard]] std::string kv_layer_map_json(const std::vector<KvLayerNames>& layers,
                                            const std::string& extra_json);

}  // namespace bie::planner
