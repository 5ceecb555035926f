#include "bie/planner/plan_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

namespace bie::planner {

namespace {

std::string gib(double bytes) {
  return fmt::format("{:.2f}", bytes / kGiB);
}

std::string tokens(int64_t n) {
  // 70512 -> "70,512"
  const std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out = n < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string context_text(int64_t n) {
  return n >= kMaxPlanContext ? "≥ " + tokens(n) : tokens(n);
}

std::string depth_label(int64_t d) {
  if (d % 1024 == 0) return fmt::format("{}k", d / 1024);
  return std::to_string(d);
}

std::string layout_text(const Plan& p, const KvOption& o) {
  std::string s = fmt::format("{} tokens x {} sequence{}, blocks of {}", tokens(p.max_model_len),
                              p.max_num_seqs, p.max_num_seqs == 1 ? "" : "s", o.layout.block_size);
  if (o.layout.mixed()) {
    s += fmt::format(", first {} + last {} tokens in FP16", o.layout.sink_tokens,
                     o.layout.window_tokens);
  }
  if (!o.layout.per_layer.empty()) {
    s += fmt::format(", body formats per layer (avg {:.3f} bits/value)",
                     kv_body_bits_per_value(p.model, o.layout));
  }
  return s;
}

std::string speed_text(const KvOption& o) {
  std::string s;
  for (const SpeedPoint& sp : o.speed) {
    s += fmt::format("{}{} {:.1f}", s.empty() ? "" : " · ", depth_label(sp.depth), sp.tok_s);
  }
  return s;
}

std::string xml_escape(std::string_view in) {
  std::string out;
  for (char c : in) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// 1, 2, 5 x 10^k at or above x.
double nice_ceil(double x) {
  if (x <= 0) return 1;
  const double p = std::pow(10.0, std::floor(std::log10(x)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (m * p >= x) return m * p;
  }
  return 10 * p;
}

}  // namespace

std::string format_bytes(double bytes) {
  if (bytes >= kGiB) return fmt::format("{:.2f} GiB", bytes / kGiB);
  if (bytes >= kMiB) return fmt::format("{:.1f} MiB", bytes / kMiB);
  if (bytes >= 1024) return fmt::format("{:.1f} KiB", bytes / 1024);
  return fmt::format("{:.0f} B", bytes);
}

std::string render_plan_text(const Plan& p) {
  const ModelGeometry& g = p.model;
  const Budget& b = p.budget;
  std::string out;
  auto line = [&](std::string s) { out += s + "\n"; };

  line(fmt::format("Model     {}  [{}]", g.name, g.source));
  std::string shape =
      fmt::format("{} · {} layers · {} heads / {} KV heads ({}) · head_dim {}", g.arch, g.n_layer,
                  g.n_head, g.n_head_kv(), attention_kind_name(g.attention_kind()), g.head_dim);
  if (g.n_swa_layers() > 0) {
    shape += fmt::format(" · {} local layers (window {}) + {} global", g.n_swa_layers(),
                         g.max_window(), g.n_layer - g.n_swa_layers());
  }
  if (g.mla) shape += fmt::format(" · latent {} + rope {}", g.kv_lora_rank, g.qk_rope_dim);
  line("          " + shape);
  std::string params = fmt::format("{:.3g} B parameters", g.n_params / 1e9);
  if (g.is_moe()) {
    params += fmt::format(
        " ({:.3g} B active: {} of {} experts{})", g.n_params_active / 1e9, g.moe.n_expert_used,
        g.moe.n_expert,
        g.moe.n_expert_shared ? fmt::format(" + {} shared", g.moe.n_expert_shared) : "");
  }
  if (g.n_ctx_train > 0) params += fmt::format(" · trained context {}", tokens(g.n_ctx_train));
  line("          " + params);
  line(fmt::format("Weights   {} GiB resident, {} GiB read per token ({})", gib(b.weights_bytes),
                   gib(p.weights.active_bytes), p.weights.label));
  if (!g.weight_types.empty() && p.weights.exact) line("          " + g.weight_types);
  line(fmt::format("Device    {}: {}, {:.2f} GiB, {:.4g} GB/s  [{}]", p.device.name,
                   p.device.description, p.device.memory_gib, p.device.bandwidth_gbs,
                   p.device.source));
  line("");
  line("Budget (GiB)");
  const auto row = [&](const std::string& label, double bytes) {
    line(fmt::format("  {:<48}{:>8}", label, gib(bytes)));
  };
  row(fmt::format("usable = device {} x {:.2f} - reserve {}", gib(b.device_bytes), b.utilization,
                  gib(b.reserve_bytes)),
      static_cast<double>(b.usable_bytes));
  const bool vulkan = p.device.kind == DeviceKind::kVulkan;
  if (vulkan && p.device.available_bytes > 0 && b.usable_bytes == p.device.available_bytes) {
    line(fmt::format("  (usable stops at the {} GiB VK_EXT_memory_budget says is available)",
                     gib(static_cast<double>(p.device.available_bytes))));
  }
  row(vulkan ? "- weights (the GGUF data section, on the device)" : "- weights",
      static_cast<double>(b.weights_bytes));
  row(vulkan
          ? fmt::format("- activations (device workspace, exact; chunk {})", p.chunked_prefill_size)
          : fmt::format("- activations (prefill chunk {})", p.chunked_prefill_size),
      static_cast<double>(b.activation_bytes));
  row("- runtime workspace", static_cast<double>(b.workspace_bytes));
  row(fmt::format("- speculative state ({} draft tokens)", p.speculative_draft_tokens),
      static_cast<double>(b.speculative_bytes));
  row("- safety margin", static_cast<double>(b.margin_bytes));
  row("= KV budget", static_cast<double>(b.kv_budget_bytes));
  line("");

  const KvOption& r = p.options.front();
  line(fmt::format("Request   KV {}: {}", r.label, layout_text(p, r)));
  std::string kvline = fmt::format("          KV {} ({} per token in the body format",
                                   format_bytes(r.kv_bytes), format_bytes(r.bytes_per_token));
  if (r.fp16_overhead_bytes > 0) {
    kvline += fmt::format("; FP16 sink + window add {} per sequence",
                          format_bytes(r.fp16_overhead_bytes));
  }
  line(kvline + ")");
  if (r.fits) {
    line(fmt::format(
        "          FITS: {} GiB of {} GiB usable, headroom {} GiB{}", gib(r.total_bytes),
        gib(b.usable_bytes), gib(r.headroom_bytes),
        b.margin_bytes > 0 ? fmt::format(" beyond the {} GiB margin", gib(b.margin_bytes)) : ""));
  } else if (r.headroom_bytes >= 0) {
    line(fmt::format(
        "          DOES NOT FIT: the KV pools need {} MiB, more than the {} MiB the device's "
        "bindings span (four per pool)",
        r.kv_bytes >> 20, p.device.max_pool_bytes >> 20));
  } else {
    line(fmt::format("          DOES NOT FIT: needs {} GiB, {} GiB more than the {} GiB usable",
                     gib(r.total_bytes), gib(-static_cast<double>(r.headroom_bytes)),
                     gib(b.usable_bytes)));
  }
  if (b.kv_budget_bytes <= 0) {
    line(
        "          nothing is left for the KV cache: the weights and overheads alone exceed the "
        "usable memory");
  } else if (r.fits) {
    line(fmt::format(
        "          largest context that fits: {} tokens per sequence with {} sequence{}; "
        "{} sequence{} of {} tokens fit",
        context_text(r.max_context), p.max_num_seqs, p.max_num_seqs == 1 ? "" : "s",
        tokens(r.max_seqs), r.max_seqs == 1 ? "" : "s", tokens(p.max_model_len)));
  } else {
    line(
        fmt::format("          stops fitting at {} tokens per sequence ({} fit) with {} sequence{}",
                    tokens(r.max_context + 1), tokens(r.max_context), p.max_num_seqs,
                    p.max_num_seqs == 1 ? "" : "s"));
  }
  if (p.device.bandwidth_gbs > 0) {
    line(fmt::format("          decode bound at {:.4g} GB/s, tok/s by depth: {}",
                     p.device.bandwidth_gbs, speed_text(r)));
    if (p.max_num_seqs > 1) {
      line(fmt::format("          all {} sequences together at {}: {:.1f} tok/s", p.max_num_seqs,
                       depth_label(r.speed.back().depth), r.speed.back().tok_s_all_seqs));
    }
    if (!r.fits) {
      line(fmt::format(
          "          if the overflow were read over PCIe ({:.4g} GB/s) at {}: {:.1f} tok/s "
          "instead of {:.1f}",
          p.pcie_gbs, depth_label(p.max_model_len), r.spill_tok_s, r.speed.back().tok_s));
    }
  }

  if (p.options.size() > 1) {
    line("");
    line(fmt::format(
        "KV formats at {} tokens x {} sequence{} (BIE formats keep sink + window in FP16; "
        "q8_0/q4_0 as llama.cpp)",
        tokens(p.max_model_len), p.max_num_seqs, p.max_num_seqs == 1 ? "" : "s"));
    line(fmt::format("  {:<36} {:>10} {:>9} {:>9} {:>4} {:>12} {:>8} {:>9} {:>9}", "format",
                     "per token", "KV GiB", "total GiB", "fits", "max context", "max seqs",
                     "tok/s " + depth_label(r.speed.front().depth),
                     "tok/s " + depth_label(r.speed.back().depth)));
    for (size_t i = 0; i < p.options.size(); ++i) {
      const KvOption& o = p.options[i];
      line(fmt::format("  {:<36} {:>10} {:>9} {:>9} {:>4} {:>12} {:>8} {:>9.1f} {:>9.1f}",
                       o.label + (i == 0 ? " (requested)" : ""), format_bytes(o.bytes_per_token),
                       gib(o.kv_bytes), gib(o.total_bytes), o.fits ? "yes" : "no",
                       context_text(o.max_context), tokens(o.max_seqs), o.speed.front().tok_s,
                       o.speed.back().tok_s));
    }
  }
  if (!p.notes.empty()) {
    line("");
    for (const std::string& n : p.notes) line("note: " + n);
  }
  return out;
}

std::string render_plan_json(const Plan& p) {
  using nlohmann::json;
  const ModelGeometry& g = p.model;
  json layers = json::array();
  for (const KvLayerGroup& grp : kv_layer_groups(g, KvLayout{})) {  // the model's shapes
    layers.push_back({{"n_layers", grp.n_layers},
                      {"n_head_kv", grp.shape.n_head_kv},
                      {"head_dim_k", grp.shape.head_dim_k},
                      {"head_dim_v", grp.shape.head_dim_v},
                      {"window", grp.shape.window}});
  }
  json model = {{"name", g.name},           {"arch", g.arch},
                {"source", g.source},       {"attention", attention_kind_name(g.attention_kind())},
                {"n_layer", g.n_layer},     {"n_embd", g.n_embd},
                {"n_head", g.n_head},       {"n_head_kv", g.n_head_kv()},
                {"head_dim", g.head_dim},   {"n_ff", g.n_ff},
                {"n_vocab", g.n_vocab},     {"n_ctx_train", g.n_ctx_train},
                {"n_params", g.n_params},   {"n_params_active", g.n_params_active},
                {"kv_layer_groups", layers}};
  if (g.mla) model["mla"] = {{"kv_lora_rank", g.kv_lora_rank}, {"qk_rope_dim", g.qk_rope_dim}};
  if (g.is_moe()) {
    model["moe"] = {{"n_expert", g.moe.n_expert},
                    {"n_expert_used", g.moe.n_expert_used},
                    {"n_expert_shared", g.moe.n_expert_shared},
                    {"expert_ff", g.moe.expert_ff},
                    {"n_dense_lead", g.moe.n_dense_lead}};
  }
  const Budget& b = p.budget;
  json options = json::array();
  for (const KvOption& o : p.options) {
    json speed = json::array();
    for (const SpeedPoint& s : o.speed) {
      speed.push_back({{"depth", s.depth},
                       {"kv_read_bytes", s.kv_read_bytes},
                       {"tok_s", s.tok_s},
                       {"tok_s_all_seqs", s.tok_s_all_seqs}});
    }
    json opt = {{"label", o.label},
                {"k", kv_format_name(o.layout.k)},
                {"v", kv_format_name(o.layout.v)},
                {"block_size", o.layout.block_size},
                {"sink_tokens", o.layout.mixed() ? o.layout.sink_tokens : 0},
                {"window_tokens", o.layout.mixed() ? o.layout.window_tokens : 0},
                {"bytes_per_token", o.bytes_per_token},
                {"fp16_overhead_bytes", o.fp16_overhead_bytes},
                {"kv_bytes", o.kv_bytes},
                {"total_bytes", o.total_bytes},
                {"fits", o.fits},
                {"headroom_bytes", o.headroom_bytes},
                {"max_context", o.max_context},
                {"max_context_capped", o.max_context >= kMaxPlanContext},
                {"max_seqs", o.max_seqs},
                {"speed", speed}};
    if (!o.fits) opt["spill_tok_s"] = o.spill_tok_s;
    opt["body_bits_per_value"] = kv_body_bits_per_value(g, o.layout);
    if (!o.layout.per_layer.empty()) {
      json per_layer = json::array();
      for (const KvLayerFormats& b : o.layout.per_layer) {
        per_layer.push_back({{"k", kv_format_name(b.k)}, {"v", kv_format_name(b.v)}});
      }
      opt["layer_map"] = per_layer;
    }
    options.push_back(opt);
  }
  json out = {{"model", model},
              {"weights",
               {{"bytes", p.weights.bytes},
                {"active_bytes", p.weights.active_bytes},
                {"label", p.weights.label},
                {"exact", p.weights.exact}}},
              {"device",
               {{"name", p.device.name},
                {"description", p.device.description},
                {"memory_gib", p.device.memory_gib},
                {"bandwidth_gbs", p.device.bandwidth_gbs},
                {"source", p.device.source}}},
              {"budget",
               {{"device_bytes", b.device_bytes},
                {"utilization", b.utilization},
                {"reserve_bytes", b.reserve_bytes},
                {"usable_bytes", b.usable_bytes},
                {"weights_bytes", b.weights_bytes},
                {"activation_bytes", b.activation_bytes},
                {"workspace_bytes", b.workspace_bytes},
                {"speculative_bytes", b.speculative_bytes},
                {"margin_bytes", b.margin_bytes},
                {"kv_budget_bytes", b.kv_budget_bytes}}},
              {"request",
               {{"max_model_len", p.max_model_len},
                {"max_num_seqs", p.max_num_seqs},
                {"chunked_prefill_size", p.chunked_prefill_size},
                {"speculative_draft_tokens", p.speculative_draft_tokens},
                {"pcie_gbs", p.pcie_gbs}}},
              {"fits", p.options.front().fits},
              {"options", options},
              {"notes", p.notes}};
  return out.dump(2) + "\n";
}

std::string render_plan_svg(const Plan& p) {
  constexpr double kW = 980, kH = 560;
  constexpr double kLeft = 70, kRight = 330, kTop = 50, kBottom = 55;
  constexpr double kPlotW = kW - kLeft - kRight, kPlotH = kH - kTop - kBottom;
  constexpr std::array<std::string_view, 10> kColors = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                                        "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                                                        "#bcbd22", "#17becf"};
  const Budget& b = p.budget;
  const double usable = static_cast<double>(b.usable_bytes) / kGiB;
  const double fixed = static_cast<double>(b.fixed_bytes()) / kGiB;
  const int64_t L = p.max_model_len;

  // x range: the requested length, stretched (up to 2x) to show where the other formats cross.
  double far = static_cast<double>(L);
  for (const KvOption& o : p.options) {
    if (o.max_context > 0) far = std::max(far, std::min(2.0 * L, 1.05 * o.max_context));
  }
  // Ticks in k = 1024 tokens.
  const double xmax = far >= 1024 ? nice_ceil(far / 1024) * 1024 : nice_ceil(far);
  const double ymax = nice_ceil(std::max(usable * 1.3, fixed * 1.2));
  const auto X = [&](double n) { return kLeft + n / xmax * kPlotW; };
  const auto Y = [&](double g) { return kTop + kPlotH - std::min(g, ymax * 1.02) / ymax * kPlotH; };

  std::string s;
  s += fmt::format(
      R"svg(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" viewBox="0 0 {} {}" font-family="sans-serif" font-size="12">)svg",
      kW, kH, kW, kH);
  s += "\n";
  s += fmt::format(R"svg(<rect width="{}" height="{}" fill="white"/>)svg", kW, kH) + "\n";
  s +=
      fmt::format(
          R"svg(<text x="{}" y="22" font-size="15" font-weight="bold">{} on {}: memory against context ({} sequence{})</text>)svg",
          kLeft, xml_escape(p.model.name), xml_escape(p.device.name), p.max_num_seqs,
          p.max_num_seqs == 1 ? "" : "s") +
      "\n";
  s += fmt::format(
           R"svg(<clipPath id="plot"><rect x="{}" y="{}" width="{}" height="{}"/></clipPath>)svg",
           kLeft, kTop, kPlotW, kPlotH) +
       "\n";
  // Grid and axes.
  for (int i = 0; i <= 5; ++i) {
    const double gy = ymax * i / 5;
    s += fmt::format(
        R"svg(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#e5e5e5"/>)svg", kLeft,
        Y(gy), kLeft + kPlotW, Y(gy));
    s += fmt::format(R"svg(<text x="{:.1f}" y="{:.1f}" text-anchor="end">{:g}</text>)svg",
                     kLeft - 6, Y(gy) + 4, gy) +
         "\n";
    const double gx = xmax * i / 5;
    s += fmt::format(
        R"svg(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#e5e5e5"/>)svg", X(gx),
        kTop, X(gx), kTop + kPlotH);
    s += fmt::format(R"svg(<text x="{:.1f}" y="{:.1f}" text-anchor="middle">{}</text>)svg", X(gx),
                     kTop + kPlotH + 18,
                     gx >= 1024 ? fmt::format("{:g}k", gx / 1024) : fmt::format("{:g}", gx)) +
         "\n";
  }
  s +=
      fmt::format(R"svg(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#333"/>)svg",
                  kLeft, kTop, kPlotW, kPlotH) +
      "\n";
  s +=
      fmt::format(
          R"svg(<text x="{:.1f}" y="{:.1f}" text-anchor="middle">context length (tokens per sequence; k = 1024)</text>)svg",
          kLeft + kPlotW / 2, kH - 12) +
      "\n";
  s +=
      fmt::format(
          R"svg(<text transform="translate(18 {:.1f}) rotate(-90)" text-anchor="middle">memory (GiB)</text>)svg",
          kTop + kPlotH / 2) +
      "\n";
  // Fixed part, usable line, requested length.
  s +=
      fmt::format(
          R"svg(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#888" stroke-dasharray="2 3"/>)svg",
          kLeft, Y(fixed), kLeft + kPlotW, Y(fixed)) +
      "\n";
  s += fmt::format(
           R"svg(<text x="{:.1f}" y="{:.1f}" fill="#666">weights + overheads {:.2f} GiB</text>)svg",
           kLeft + 6, Y(fixed) - 5, fixed) +
       "\n";
  s +=
      fmt::format(
          R"svg(<line id="usable" x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#d00" stroke-width="2" stroke-dasharray="8 4"/>)svg",
          kLeft, Y(usable), kLeft + kPlotW, Y(usable)) +
      "\n";
  s += fmt::format(R"svg(<text x="{:.1f}" y="{:.1f}" fill="#d00">usable {:.2f} GiB</text>)svg",
                   kLeft + 6, Y(usable) - 6, usable) +
       "\n";
  s +=
      fmt::format(
          R"svg(<line x1="{:.1f}" y1="{}" x2="{:.1f}" y2="{}" stroke="#444" stroke-dasharray="4 4"/>)svg",
          X(static_cast<double>(L)), kTop, X(static_cast<double>(L)), kTop + kPlotH) +
      "\n";
  s += fmt::format(
           R"svg(<text x="{:.1f}" y="{}" text-anchor="end" fill="#444">max-model-len {}</text>)svg",
           X(static_cast<double>(L)) - 4, kTop + 14, tokens(L)) +
       "\n";

  // One curve per KV format, with its crossing of the usable line.
  s +=
      fmt::format(
          R"svg(<text x="{:.1f}" y="{}" font-weight="bold">KV format: largest context that fits</text>)svg",
          kW - kRight + 15, kTop + 4) +
      "\n";
  constexpr int kSamples = 160;
  for (size_t i = 0; i < p.options.size(); ++i) {
    const KvOption& o = p.options[i];
    const std::string_view color = kColors[i % kColors.size()];
    std::string pts;
    for (int k = 0; k <= kSamples; ++k) {
      const auto n = static_cast<int64_t>(std::llround(xmax * k / kSamples));
      const double mem = fixed + static_cast<double>(p.max_num_seqs) *
                                     static_cast<double>(kv_sequence_bytes(p.model, o.layout, n)) /
                                     kGiB;
      pts += fmt::format("{:.1f},{:.1f} ", X(static_cast<double>(n)), Y(mem));
    }
    s +=
        fmt::format(
            R"svg(<polyline class="kv" data-format="{}" clip-path="url(#plot)" fill="none" stroke="{}" stroke-width="{}" points="{}"/>)svg",
            xml_escape(o.label), color, i == 0 ? 3 : 1.6, pts) +
        "\n";
    if (o.max_context > 0 && static_cast<double>(o.max_context) <= xmax && b.kv_budget_bytes > 0) {
      s +=
          fmt::format(
              R"svg(<circle class="crossing" data-format="{}" data-tokens="{}" cx="{:.1f}" cy="{:.1f}" r="4" fill="{}"/>)svg",
              xml_escape(o.label), o.max_context, X(static_cast<double>(o.max_context)), Y(usable),
              color) +
          "\n";
    }
    const double ly = kTop + 28 + 18.0 * static_cast<double>(i);
    s += fmt::format(
        R"svg(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="{}" stroke-width="3"/>)svg",
        kW - kRight + 15, ly, kW - kRight + 35, ly, color);
    s += fmt::format(R"svg(<text x="{:.1f}" y="{:.1f}" font-size="11">{}: {}</text>)svg",
                     kW - kRight + 40, ly + 4, xml_escape(o.label), context_text(o.max_context)) +
         "\n";
  }
  s += "</svg>\n";
  return s;
}

}  // namespace bie::planner
