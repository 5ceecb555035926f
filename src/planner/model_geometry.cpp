#include "bie/planner/model_geometry.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "bie/gguf/ggml_type_info.h"
#include "bie/gguf/gguf_file.h"

namespace bie::planner {

std::string_view attention_kind_name(AttentionKind k) {
  switch (k) {
    case AttentionKind::kMha:
      return "MHA";
    case AttentionKind::kGqa:
      return "GQA";
    case AttentionKind::kMqa:
      return "MQA";
    case AttentionKind::kMla:
      return "MLA";
  }
  return "?";
}

AttentionKind ModelGeometry::attention_kind() const {
  if (mla) return AttentionKind::kMla;
  const int64_t kv = n_head_kv();
  if (kv == n_head) return AttentionKind::kMha;
  if (kv == 1) return AttentionKind::kMqa;
  return AttentionKind::kGqa;
}

int64_t ModelGeometry::n_swa_layers() const {
  return std::count_if(layers.begin(), layers.end(), [](const LayerKv& l) { return l.window > 0; });
}

int64_t ModelGeometry::max_window() const {
  int64_t w = 0;
  for (const auto& l : layers) w = std::max(w, l.window);
  return w;
}

int64_t ModelGeometry::n_head_kv() const {
  for (const auto& l : layers) {
    if (l.n_head_kv > 0) return l.n_head_kv;
  }
  return 0;
}

int64_t ModelGeometry::head_dim_kv() const {
  for (const auto& l : layers) {
    if (l.n_head_kv > 0) return l.head_dim_k;
  }
  return 0;
}

namespace {

// The values are the model classes' own: Hugging Face transformers for the config.json defaults,
// llama.cpp (llama-model.cpp, set_swa_pattern) for the local/global periods of GGUF files that
// carry only the window length.
// clang-format off
constexpr ArchFacts kArchFacts[] = {
    // name          prefix swa four_norms qk_norm tied  qkv_bias
    {"gemma2",       false, 2,  true,      false,  true, false},
    {"gemma3",       false, 6,  true,      true,   true, false},
    {"gemma3_text",  false, 6,  true,      true,   true, false},
    {"cohere2",      false, 4,  false,     false,  false, false},
    {"qwen2",        false, 0,  false,     false,  false, true},
    {"qwen2_moe",    false, 0,  false,     false,  false, true},
    {"gemma3",       true,  6,  true,      false,  true, false},  // gemma3n, ... (HF period)
    {"gemma",        true,  0,  true,      false,  true, false},
    {"qwen3",        true,  0,  false,     true,   false, false},
};
// clang-format on

}  // namespace

const ArchFacts* arch_facts(std::string_view arch) {
  for (const ArchFacts& a : kArchFacts) {
    if (!a.prefix && arch == a.name) return &a;
  }
  for (const ArchFacts& a : kArchFacts) {
    if (a.prefix && arch.starts_with(a.name)) return &a;
  }
  return nullptr;
}

bool is_swa_layer(int64_t il, int period) {
  return period == 0 || (il % period < period - 1);
}

void count_params_from_widths(ModelGeometry& g) {
  const double E = static_cast<double>(g.n_embd);
  const double embd = static_cast<double>(g.n_vocab) * E;
  double total = embd + (g.tied_embeddings ? 0.0 : embd) + E;  // + final norm
  double active = (g.tied_embeddings ? embd : E + embd) + E;   // one embedding row read per token
  // Gemma 2/3 put a norm after attention and after the FFN as well; Gemma 3 and Qwen 3 normalise
  // q and k per head.
  const ArchFacts* facts = arch_facts(g.arch);
  const bool four_norms = facts && facts->four_norms;
  const bool qk_norm = facts && facts->qk_norm;
  for (int64_t il = 0; il < g.n_layer; ++il) {
    double attn = 0;
    if (g.mla) {
      const double H = static_cast<double>(g.n_head);
      const double qk = static_cast<double>(g.head_dim);  // nope + rope
      const double q = g.q_lora_rank > 0
                           ? E * g.q_lora_rank + g.q_lora_rank + g.q_lora_rank * H * qk
                           : E * H * qk;
      const double kv_a = E * (g.kv_lora_rank + g.qk_rope_dim) + g.kv_lora_rank;
      const double kv_b =
          static_cast<double>(g.kv_lora_rank) * H * ((qk - g.qk_rope_dim) + g.v_head_dim);
      const double o = H * g.v_head_dim * E;
      attn = q + kv_a + kv_b + o;
    } else {
      const LayerKv& l = g.layers[static_cast<size_t>(il)];
      const double q = static_cast<double>(g.n_head * g.head_dim);
      const double k = static_cast<double>(l.n_head_kv) * l.head_dim_k;
      const double v = static_cast<double>(l.n_head_kv) * l.head_dim_v;
      attn = E * (q + k + v) + q * E;
      if (g.qkv_bias) attn += q + k + v;
      if (qk_norm) attn += static_cast<double>(g.head_dim + l.head_dim_k);
    }
    const double norms = (four_norms ? 4.0 : 2.0) * E;
    double ffn_total = 0;
    double ffn_active = 0;
    if (g.is_moe() && il >= g.moe.n_dense_lead) {
      const double expert = 3.0 * E * static_cast<double>(g.moe.expert_ff);  // gate, up, down
      const double shared = g.moe.n_expert_shared * 3.0 * E * static_cast<double>(g.moe.shared_ff);
      const double router = E * g.moe.n_expert;
      ffn_total = router + g.moe.n_expert * expert + shared;
      ffn_active = router + g.moe.n_expert_used * expert + shared;
    } else {
      ffn_total = ffn_active = 3.0 * E * static_cast<double>(g.n_ff);
    }
    total += attn + norms + ffn_total;
    active += attn + norms + ffn_active;
  }
  g.n_params = total;
  g.n_params_active = active;
  g.n_params_embd = embd;
}

// ---- GGUF ---------------------------------------------------------------------------------

namespace {

// A per-layer integer: a scalar applies to all layers, an array gives one value per layer.
Result<std::vector<int64_t>> per_layer(const gguf::GgufFile& f, const std::string& key,
                                       int64_t n_layer, std::optional<int64_t> fallback) {
  std::vector<int64_t> out(static_cast<size_t>(n_layer), 0);
  if (const gguf::Array* a = f.get_array(key)) {
    if (static_cast<int64_t>(a->items.size()) != n_layer) {
      return Error{fmt::format("GGUF key {} has {} entries but the model has {} layers", key,
                               a->items.size(), n_layer)};
    }
    for (size_t i = 0; i < a->items.size(); ++i) {
      auto v = gguf::value_as_int(a->items[i]);
      if (!v || *v < 0) return Error{fmt::format("GGUF key {} holds a bad value", key)};
      out[i] = *v;
    }
    return out;
  }
  if (auto v = f.get_int(key)) {
    if (*v < 0) return Error{fmt::format("GGUF key {} is negative", key)};
    std::fill(out.begin(), out.end(), *v);
    return out;
  }
  if (fallback) {
    std::fill(out.begin(), out.end(), *fallback);
    return out;
  }
  return Error{fmt::format("GGUF file lacks {}", key)};
}

constexpr int64_t kMaxWidth = int64_t{1} << 24;  // no real model has a width near 16M

Status check_range(std::string_view what, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    return Error{fmt::format("{} = {} is out of range [{}, {}]", what, v, lo, hi)};
  }
  return {};
}

}  // namespace

Result<ModelGeometry> geometry_from_gguf(const gguf::GgufFile& f) {
  ModelGeometry g;
  g.arch = f.architecture();
  if (g.arch.empty()) return Error{"GGUF file has no general.architecture"};
  g.source = f.path();
  g.name = std::string(f.get_string("general.name").value_or(g.arch));
  const std::string A = g.arch + ".";

  const auto req = [&](const std::string& key) -> Result<int64_t> {
    auto v = f.get_int(A + key);
    if (!v) return Error{fmt::format("GGUF file lacks {}{}", A, key)};
    return *v;
  };
  auto n_layer = req("block_count");
  if (!n_layer) return Error{n_layer.error()};
  auto n_embd = req("embedding_length");
  if (!n_embd) return Error{n_embd.error()};
  g.n_layer = *n_layer;
  g.n_embd = *n_embd;
  if (auto s = check_range(A + "block_count", g.n_layer, 1, 4096); !s) return Error{s.error()};
  if (auto s = check_range(A + "embedding_length", g.n_embd, 1, kMaxWidth); !s) {
    return Error{s.error()};
  }

  auto heads = per_layer(f, A + "attention.head_count", g.n_layer, std::nullopt);
  if (!heads) return Error{heads.error()};
  g.n_head = *std::max_element(heads->begin(), heads->end());
  if (auto s = check_range(A + "attention.head_count", g.n_head, 1, kMaxWidth); !s) {
    return Error{s.error()};
  }
  auto heads_kv = per_layer(f, A + "attention.head_count_kv", g.n_layer, std::nullopt);
  if (!heads_kv) heads_kv = *heads;  // llama.cpp's default: no GQA
  auto ff = per_layer(f, A + "feed_forward_length", g.n_layer, int64_t{0});
  if (!ff) return Error{ff.error()};
  g.n_ff = *std::max_element(ff->begin(), ff->end());

  const int64_t dk = f.get_int(A + "attention.key_length").value_or(g.n_embd / g.n_head);
  const int64_t dv = f.get_int(A + "attention.value_length").value_or(g.n_embd / g.n_head);
  if (auto s = check_range(A + "attention.key_length", dk, 1, kMaxWidth); !s)
    return Error{s.error()};
  if (auto s = check_range(A + "attention.value_length", dv, 1, kMaxWidth); !s) {
    return Error{s.error()};
  }
  g.head_dim = dk;
  g.n_rot = f.get_int(A + "rope.dimension_count").value_or(dk);
  g.n_ctx_train = f.get_int(A + "context_length").value_or(0);
  // The logits' width is the embedding table's row count (Qwen2.5 pads it past its 151,665
  // tokens); the keys only stand in for a file without the table.
  if (const gguf::TensorInfo* t = f.find_tensor("token_embd.weight"); t && t->n_dims >= 2) {
    g.n_vocab = t->ne[1];
  } else if (auto v = f.get_int(A + "vocab_size")) {
    g.n_vocab = *v;
  } else if (const gguf::Array* toks = f.get_array("tokenizer.ggml.tokens")) {
    g.n_vocab = static_cast<int64_t>(toks->items.size());
  }

  // MLA (deepseek2 and kin): the cache holds the compressed latent plus the rope part of K.
  if (auto r = f.get_int(A + "attention.kv_lora_rank"); r && *r > 0) {
    g.mla = true;
    g.kv_lora_rank = static_cast<int>(*r);
    g.qk_rope_dim = static_cast<int>(f.get_int(A + "rope.dimension_count").value_or(0));
    g.q_lora_rank = static_cast<int>(f.get_int(A + "attention.q_lora_rank").value_or(0));
    g.v_head_dim = static_cast<int>(f.get_int(A + "attention.value_length_mla").value_or(dv));
    if (auto kmla = f.get_int(A + "attention.key_length_mla")) g.head_dim = *kmla;
  }

  // Sliding window: which layers are local, and how far they look back.
  const int64_t window = f.get_int(A + "attention.sliding_window").value_or(0);
  std::vector<bool> local(static_cast<size_t>(g.n_layer), false);
  if (window > 0) {
    if (const gguf::Array* pat = f.get_array(A + "attention.sliding_window_pattern")) {
      if (static_cast<int64_t>(pat->items.size()) != g.n_layer) {
        return Error{
            fmt::format("GGUF key {}attention.sliding_window_pattern has {} entries for {} "
                        "layers",
                        A, pat->items.size(), g.n_layer)};
      }
      for (size_t i = 0; i < pat->items.size(); ++i) {
        const bool* b = std::get_if<bool>(&pat->items[i]);
        auto n = gguf::value_as_int(pat->items[i]);
        local[i] = b ? *b : (n && *n != 0);
      }
    } else {
      int period = 0;  // every layer local unless a pattern says otherwise
      if (auto p = f.get_int(A + "attention.sliding_window_pattern")) {
        period = static_cast<int>(*p);
      } else if (const ArchFacts* facts = arch_facts(g.arch); facts && !facts->prefix) {
        period = facts->swa_period;  // GGUF architecture names are exact
      }
      for (int64_t il = 0; il < g.n_layer; ++il)
        local[static_cast<size_t>(il)] = is_swa_layer(il, period);
    }
  }

  g.layers.resize(static_cast<size_t>(g.n_layer));
  for (int64_t il = 0; il < g.n_layer; ++il) {
    LayerKv& l = g.layers[static_cast<size_t>(il)];
    const int64_t hkv = (*heads_kv)[static_cast<size_t>(il)];
    if (g.mla) {
      l = LayerKv{1, g.kv_lora_rank + g.qk_rope_dim, 0, 0};
    } else {
      l = LayerKv{static_cast<int>(hkv), static_cast<int>(dk), static_cast<int>(dv), 0};
    }
    if (local[static_cast<size_t>(il)]) l.window = window;
  }

  g.moe.n_expert = static_cast<int>(f.get_int(A + "expert_count").value_or(0));
  g.moe.n_expert_used = static_cast<int>(f.get_int(A + "expert_used_count").value_or(0));
  g.moe.n_expert_shared = static_cast<int>(f.get_int(A + "expert_shared_count").value_or(0));
  g.moe.expert_ff = f.get_int(A + "expert_feed_forward_length").value_or(0);
  g.moe.shared_ff = f.get_int(A + "expert_shared_feed_forward_length").value_or(g.moe.expert_ff);
  g.moe.n_dense_lead = static_cast<int>(f.get_int(A + "leading_dense_block_count").value_or(0));
  if (g.moe.n_expert > 0 && (g.moe.n_expert_used <= 0 || g.moe.n_expert_used > g.moe.n_expert)) {
    return Error{fmt::format("GGUF file has {} experts but {}expert_used_count is {}",
                             g.moe.n_expert, A, g.moe.n_expert_used)};
  }

  // Exact parameters and bytes from the tensor index (the data itself is never touched).
  const bool has_output = f.find_tensor("output.weight") != nullptr;
  g.tied_embeddings = !has_output;
  g.qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  uint64_t bytes = 0;
  uint64_t bytes_active = 0;
  double params = 0;
  double params_active = 0;
  std::map<std::string, uint64_t> by_type;
  for (const gguf::TensorInfo& t : f.tensors()) {
    const double n = static_cast<double>(t.n_elements());
    params += n;
    bytes += t.n_bytes;
    auto info = gguf::ggml_type_info(t.type);
    by_type[info ? std::string(info->name) : fmt::format("type{}", t.type)] += t.n_bytes;
    if (t.name == "token_embd.weight") {
      g.n_params_embd = n;
      if (has_output && t.ne[1] > 0) {  // one row per token
        bytes_active += t.n_bytes / static_cast<uint64_t>(t.ne[1]);
        params_active += static_cast<double>(t.ne[0]);
        continue;
      }
    }
    if (g.moe.n_expert > 0 && t.name.find("_exps") != std::string::npos) {
      bytes_active += t.n_bytes / static_cast<uint64_t>(g.moe.n_expert) *
                      static_cast<uint64_t>(g.moe.n_expert_used);
      params_active += n * g.moe.n_expert_used / g.moe.n_expert;
      continue;
    }
    bytes_active += t.n_bytes;
    params_active += n;
  }
  if (f.tensors().empty()) return Error{"GGUF file has no tensors"};
  g.n_params = params;
  g.n_params_active = params_active;
  g.weight_bytes = bytes;
  g.weight_bytes_active = bytes_active;
  g.data_bytes = f.data_section().size();
  std::string types;
  for (const auto& [name, b] : by_type) {
    types += fmt::format("{}{} {:.1f} MB", types.empty() ? "" : ", ", name, b / 1e6);
  }
  g.weight_types = types;
  return g;
}

Result<ModelGeometry> geometry_from_gguf_path(const std::string& path) {
  auto file = gguf::GgufFile::open(path);
  if (!file) return Error{file.error()};  // the reader's message names the file
  auto g = geometry_from_gguf(*file.value());
  if (!g) return Error{fmt::format("{}: {}", path, g.error())};
  return g;
}

}  // namespace bie::planner
