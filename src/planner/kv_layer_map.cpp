#include "bie/planner/kv_layer_map.h"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace bie::planner {

namespace {
constexpr const char* kFormatTag = "bie-kv-layer-map";
}  // namespace

Result<std::vector<KvLayerNames>> read_kv_layer_map(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Error{fmt::format("--kv-layer-map {}: cannot open the file", path)};
  std::stringstream text;
  text << in.rdbuf();
  const auto j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  const auto bad = [&](const std::string& what) {
    return Error{fmt::format("--kv-layer-map {}: {}", path, what)};
  };
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  if (j.value("format", "") != kFormatTag) {
    return bad(fmt::format("\"format\" must be \"{}\" (a file `bie quality --calibrate` wrote)",
                           kFormatTag));
  }
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"] != 1) {
    return bad("\"version\" must be 1");
  }
  if (!j.contains("layers") || !j["layers"].is_array() || j["layers"].empty()) {
    return bad("\"layers\" must be a non-empty array, one {\"k\": ..., \"v\": ...} per layer");
  }
  std::vector<KvLayerNames> out;
  for (const auto& e : j["layers"]) {
    const size_t il = out.size();
    if (!e.is_object() || !e.contains("k") || !e.contains("v") || !e["k"].is_string() ||
        !e["v"].is_string()) {
      return bad(fmt::format("layer {}: needs string fields \"k\" and \"v\"", il));
    }
    out.push_back({e["k"].get<std::string>(), e["v"].get<std::string>()});
  }
  return out;
}

std::string kv_layer_map_json(const std::vector<KvLayerNames>& layers,
                              const std::string& extra_json) {
  nlohmann::ordered_json j;
  j["format"] = kFormatTag;
  j["version"] = 1;
  if (!extra_json.empty()) {
    const nlohmann::ordered_json extra = nlohmann::ordered_json::parse(extra_json);
    for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = *it;
  }
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  for (const KvLayerNames& l : layers) arr.push_back({{"k", l.k}, {"v", l.v}});
  j["layers"] = arr;
  return j.dump(1) + "\n";
}

}  // namespace bie::planner
