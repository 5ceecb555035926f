#include "bie/planner/kv_layout_flags.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace bie::planner {

Result<KvLayout> resolve_kv_layout(const KvLayoutFlags& f) {
  if (f.block_size < 0 || f.block_size > 4096) {
    return Error{fmt::format(
        "--paged-block-size must be in 1..4096 (0: the regime's default), got {}", f.block_size)};
  }
  // The recipes (kv_layout_flags.h): per-channel keys over the block, per-token values.
  const bool kivi4 = f.dtype == "int4_asym" || f.dtype == "int4" || f.dtype == "int4_channel";
  const bool kivi8 = f.dtype == "int8" || f.dtype == "int8_channel";
  KvLayout l;
  const bool mapped = !f.layer_map.empty();
  l.block_size = f.block_size > 0           ? f.block_size
                 : kivi4 || kivi8 || mapped ? kDefaultChannelBlock
                                            : 16;
  l.sink_tokens = f.sink_tokens;
  l.window_tokens = f.window_tokens;
  const auto parse = [&](const std::string& flag, const std::string& name) -> Result<KvFormat> {
    auto r = parse_kv_format(name, f.group_size, l.block_size);
    if (!r) return Error{fmt::format("{}: {}", flag, r.error())};
    return r;
  };
  if (kivi4) {
    auto k = parse("--kv-cache-dtype", "int4_channel");
    if (!k) return Error{k.error()};
    auto v = parse("--kv-cache-dtype", "int4_asym");
    if (!v) return Error{v.error()};
    l.k = *k;
    l.v = *v;
  } else if (kivi8) {
    auto k = parse("--kv-cache-dtype", "int8_channel");
    if (!k) return Error{k.error()};
    l.k = *k;
    l.v = KvFormat{KvType::kInt8, 0};
  } else {
    auto both = parse("--kv-cache-dtype", f.dtype);
    if (!both) return Error{both.error()};
    l.k = l.v = *both;
  }
  if (!f.dtype_k.empty()) {
    auto k = parse("--kv-cache-dtype-k", f.dtype_k);
    if (!k) return Error{k.error()};
    l.k = *k;
  }
  if (!f.dtype_v.empty()) {
    auto v = parse("--kv-cache-dtype-v", f.dtype_v);
    if (!v) return Error{v.error()};
    l.v = *v;
  }
  if (is_per_channel(l.v)) {
    return Error{
        "--kv-cache-dtype-v: int4_channel / int8_channel are key formats (per-channel scales); "
        "use int4_asym or int8 for values"};
  }
  for (size_t il = 0; il < f.layer_map.size(); ++il) {
    const std::string flag = fmt::format("--kv-layer-map, layer {}", il);
    auto k = parse(flag + " k", f.layer_map[il].k);
    if (!k) return Error{k.error()};
    auto v = parse(flag + " v", f.layer_map[il].v);
    if (!v) return Error{v.error()};
    if (is_per_channel(*v)) {
      return Error{fmt::format("{}: {} is a key format; use int4_asym or int8 for values", flag,
                               kv_format_name(*v))};
    }
    l.per_layer.push_back({*k, *v});
  }
  // Rotation: on for per-token int4_asym keys (it halves their error); --kv-rotate / --no-kv-rotate
  // override.
  bool int4_asym_keys = mapped ? false : l.k.type == KvType::kInt4Asym;
  for (const KvLayerFormats& b : l.per_layer) int4_asym_keys |= b.k.type == KvType::kInt4Asym;
  l.rotate = f.rotate.value_or(int4_asym_keys);
  return l;
}

namespace {

// "int4_channel_t64 x26,int8_channel_t64 x2", in order of first use.
std::string count_formats(const std::vector<KvLayerFormats>& layers, bool keys) {
  std::vector<std::pair<KvFormat, int>> seen;
  for (const KvLayerFormats& b : layers) {
    const KvFormat f = keys ? b.k : b.v;
    auto it = std::find_if(seen.begin(), seen.end(), [&](const auto& p) { return p.first == f; });
    if (it == seen.end()) {
      seen.push_back({f, 1});
    } else {
      ++it->second;
    }
  }
  std::string s;
  for (const auto& [f, n] : seen)
    s += fmt::format("{}{} x{}", s.empty() ? "" : ",", kv_format_name(f), n);
  return s;
}

}  // namespace

std::string kv_layout_label(const KvLayout& l) {
  std::string s = !l.per_layer.empty()
                      ? fmt::format("layer-map k={} v={}", count_formats(l.per_layer, true),
                                    count_formats(l.per_layer, false))
                  : l.k == l.v ? kv_format_name(l.k)
                               : fmt::format("k={} v={}", kv_format_name(l.k), kv_format_name(l.v));
  if (l.rotate) s += " +rotate";
  return s;
}

}  // namespace bie::planner
