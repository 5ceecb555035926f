#include "bie/engine/kv_calibrate.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "bie/planner/kv_bytes.h"
#include "bie/planner/kv_layer_map.h"
#include "bie/planner/model_geometry.h"

namespace bie {

namespace {

// The formats one layer may take, cheapest first on each side. V's base is the widest int4_asym
// group the heads allow (g128 on 128-wide heads), its middle step the next narrower one.
constexpr const char* kKeyBase = "int4_channel";
constexpr const char* kKeyUp = "int8_channel";
constexpr const char* kValUp = "int8";

struct ValueSteps {
  std::string base, mid;
};

Result<ValueSteps> value_steps(const planner::ModelGeometry& g) {
  for (int group : {128, 64}) {
    const bool fits = std::all_of(g.layers.begin(), g.layers.end(), [&](const planner::LayerKv& l) {
      return l.n_head_kv == 0 || l.head_dim_v % group == 0;
    });
    if (fits) {
      return ValueSteps{fmt::format("int4_asym_g{}", group),
                        fmt::format("int4_asym_g{}", group / 2)};
    }
  }
  return Error{"--calibrate needs V heads of a multiple of 64 values"};
}

Result<QualityRegime> mapped_regime(const std::string& spec,
                                    const std::vector<planner::KvLayerNames>& map,
                                    const planner::KvLayoutFlags& base) {
  planner::KvLayoutFlags f = base;
  f.dtype = "f16";
  f.dtype_k.clear();
  f.dtype_v.clear();
  f.rotate = false;
  f.layer_map = map;
  auto l = planner::resolve_kv_layout(f);
  if (!l) return Error{l.error()};
  return QualityRegime{spec, f, *l};
}

// Mean KLD over every context size's scored positions of regime r.
double mean_kld(const RegimeQuality& r) {
  double kld = 0.0;
  int64_t n = 0;
  for (const PplStats& p : r.ppl) {
    kld += p.kld_sum;
    n += p.n_scored;
  }
  return n > 0 ? kld / static_cast<double>(n) : 0.0;
}

}  // namespace

Result<KvCalibration> calibrate_kv_layer_map(const QualityTarget& target,
                                             const planner::ModelGeometry& geom,
                                             const std::string& text, const KvCalibrateConfig& cfg,
                                             const QualityProgress& progress) {
  const size_t n_layer = geom.layers.size();
  if (n_layer == 0) return Error{"the model has no layers"};
  auto steps = value_steps(geom);
  if (!steps) return Error{steps.error()};
  const std::string kValBase = steps->base;
  const std::string kValMid = steps->mid;
  const std::vector<planner::KvLayerNames> base_map(n_layer, {kKeyBase, kValBase});

  QualityConfig qc;
  qc.ctx_sizes = cfg.ctx_sizes;
  qc.windows = cfg.windows;
  qc.batch = cfg.batch;
  qc.prompts = 0;
  qc.needle_ctx.clear();
  auto base = mapped_regime("base", base_map, cfg.base);
  if (!base) return Error{base.error()};
  if (const double bits = planner::kv_body_bits_per_value(geom, base->layout);
      bits > cfg.max_bits_per_value + 1e-9) {
    return Error{fmt::format(
        "a map within {:.3f} bits/value is impossible: the cheapest recipe (K int4_channel_t{} / "
        "V {}) already takes {:.3f}; raise --calibrate-bits or the block size",
        cfg.max_bits_per_value, base->layout.block_size, kValBase, bits)};
  }
  qc.regimes.push_back(*base);
  for (size_t il = 0; il < n_layer; ++il) {
    for (int m = 0; m < 3; ++m) {
      std::vector<planner::KvLayerNames> map = base_map;
      if (m == 0) map[il].k = kKeyUp;
      if (m == 1) map[il].v = kValMid;
      if (m == 2) map[il].v = kValUp;
      auto r = mapped_regime(fmt::format("L{}:{}", il, m), map, cfg.base);
      if (!r) return Error{r.error()};
      qc.regimes.push_back(*r);
    }
  }
  if (progress) {
    progress(fmt::format("calibrating {} layers: {} regimes in lock step with f16", n_layer,
                         qc.regimes.size()));
  }
  auto rep = measure_kv_quality(target, text, qc, progress);
  if (!rep) return Error{rep.error()};
  // rep->regimes: f16, base, then per layer its three moves.
  KvCalibration c;
  c.value_base = kValBase;
  c.value_mid = kValMid;
  c.block_size = base->layout.block_size;
  c.base_kld = mean_kld(rep->regimes[1]);
  c.base_bits = planner::kv_body_bits_per_value(geom, base->layout);
  for (size_t il = 0; il < n_layer; ++il) {
    const size_t r0 = 2 + 3 * il;
    KvLayerSensitivity s;
    s.k8_gain = c.base_kld - mean_kld(rep->regimes[r0]);
    s.v64_gain = c.base_kld - mean_kld(rep->regimes[r0 + 1]);
    s.v8_gain = c.base_kld - mean_kld(rep->regimes[r0 + 2]);
    c.layers.push_back(s);
  }

  // Greedy: the move with the most gain per added bit that keeps the map within the budget.
  c.map = base_map;
  auto bits_of = [&](const std::vector<planner::KvLayerNames>& map) -> Result<double> {
    auto r = mapped_regime("map", map, cfg.base);
    if (!r) return Error{r.error()};
    return planner::kv_body_bits_per_value(geom, r->layout);
  };
  double bits = c.base_bits;
  c.predicted_kld = c.base_kld;
  for (;;) {
    double best_ratio = 0.0, best_bits = 0.0, best_gain = 0.0;
    std::vector<planner::KvLayerNames> best;
    for (size_t il = 0; il < n_layer; ++il) {
      const KvLayerSensitivity& s = c.layers[il];
      const planner::KvLayerNames& now = c.map[il];
      const double v_now = now.v == kValUp ? s.v8_gain : now.v == kValMid ? s.v64_gain : 0.0;
      struct Move {
        std::string k, v;  // empty: unchanged
        double gain;
      };
      std::vector<Move> cand;
      if (now.k == kKeyBase) cand.push_back({kKeyUp, "", s.k8_gain});
      if (now.v == kValBase) cand.push_back({"", kValMid, s.v64_gain});
      if (now.v != kValUp) cand.push_back({"", kValUp, s.v8_gain - v_now});
      for (const Move& mv : cand) {
        if (mv.gain <= 0.0) continue;
        std::vector<planner::KvLayerNames> map = c.map;
        if (!mv.k.empty()) map[il].k = mv.k;
        if (!mv.v.empty()) map[il].v = mv.v;
        auto b = bits_of(map);
        if (!b) return Error{b.error()};
        if (*b > cfg.max_bits_per_value + 1e-9 || *b <= bits) continue;
        const double ratio = mv.gain / (*b - bits);
        if (ratio > best_ratio) {
          best_ratio = ratio;
          best_bits = *b;
          best_gain = mv.gain;
          best = std::move(map);
        }
      }
    }
    if (best.empty()) break;
    c.map = std::move(best);
    bits = best_bits;
    c.predicted_kld -= best_gain;
  }
  c.map_bits = bits;

  // The chosen map measured beside the uniform recipe, on the same windows.
  QualityConfig check = qc;
  check.regimes.clear();
  auto mapped = mapped_regime("layer-map", c.map, cfg.base);
  if (!mapped) return Error{mapped.error()};
  check.regimes.push_back(*mapped);
  planner::KvLayoutFlags uf = cfg.base;
  uf.dtype = "int4_asym";
  uf.dtype_k.clear();
  uf.dtype_v.clear();
  uf.layer_map.clear();
  uf.rotate.reset();
  auto uniform = planner::resolve_kv_layout(uf);
  if (!uniform) return Error{uniform.error()};
  check.regimes.push_back({"int4_asym", uf, *uniform});
  if (progress) progress("measuring the chosen map beside the uniform int4_asym");
  auto rep2 = measure_kv_quality(target, text, check, progress);
  if (!rep2) return Error{rep2.error()};
  c.map_kld = mean_kld(rep2->regimes[1]);
  c.map_dppl_pct = rep2->delta_ppl_pct(1, 0);
  c.uniform_kld = mean_kld(rep2->regimes[2]);
  c.uniform_dppl_pct = rep2->delta_ppl_pct(2, 0);
  c.uniform_bits = planner::kv_body_bits_per_value(geom, *uniform);
  return c;
}

std::string kv_calibration_json(const KvCalibration& c, const std::string& model,
                                const std::string& text, const KvCalibrateConfig& cfg) {
  nlohmann::ordered_json info;
  info["model"] = model;
  info["calibration_text"] = text;
  info["ctx_sizes"] = cfg.ctx_sizes;
  info["windows"] = cfg.windows;
  info["block_size"] = c.block_size;
  info["sink_tokens"] = cfg.base.sink_tokens;
  info["window_tokens"] = cfg.base.window_tokens;
  info["max_bits_per_value"] = cfg.max_bits_per_value;
  info["bits_per_value"] = c.map_bits;
  info["base_kld"] = c.base_kld;
  info["predicted_kld"] = c.predicted_kld;
  info["map_kld"] = c.map_kld;
  info["map_delta_ppl_pct"] = c.map_dppl_pct;
  info["uniform_int4_asym_kld"] = c.uniform_kld;
  info["uniform_int4_asym_delta_ppl_pct"] = c.uniform_dppl_pct;
  nlohmann::ordered_json sens = nlohmann::ordered_json::array();
  for (const KvLayerSensitivity& s : c.layers) {
    sens.push_back(
        {{"k_int8_gain", s.k8_gain}, {"v_g64_gain", s.v64_gain}, {"v_int8_gain", s.v8_gain}});
  }
  info["sensitivity"] = sens;
  return planner::kv_layer_map_json(c.map, info.dump());
}

}  // namespace bie
