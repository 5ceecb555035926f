// Hugging Face config.json -> ModelGeometry.
#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bie/planner/model_geometry.h"

namespace bie::planner {

namespace {

using nlohmann::json;

constexpr int64_t kMaxWidth = int64_t{1} << 24;

// The first of `keys` that is present and not null.
const json* find_any(const json& j, std::initializer_list<const char*> keys) {
  for (const char* k : keys) {
    auto it = j.find(k);
    if (it != j.end() && !it->is_null()) return &*it;
  }
  return nullptr;
}

Result<int64_t> get_int(const json& j, std::initializer_list<const char*> keys,
                        std::optional<int64_t> fallback, int64_t lo = 0, int64_t hi = kMaxWidth) {
  const json* v = find_any(j, keys);
  const char* name = *keys.begin();
  int64_t x = 0;
  if (!v) {
    if (!fallback) return Error{fmt::format("config.json: missing \"{}\"", name)};
    x = *fallback;  // derived defaults are range-checked too (e.g. head_dim = hidden / heads)
  } else if (!v->is_number_integer()) {
    return Error{fmt::format("config.json: \"{}\" must be an integer", name)};
  } else {
    x = v->get<int64_t>();
  }
  if (x < lo || x > hi) {
    return Error{fmt::format("config.json: \"{}\" = {} is out of range [{}, {}]", name, x, lo, hi)};
  }
  return x;
}

}  // namespace

Result<ModelGeometry> geometry_from_hf_config(std::string_view json_text, std::string name) {
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return Error{"config.json: not valid JSON"};
  if (!root.is_object()) return Error{"config.json: top level is not an object"};
  // Multimodal checkpoints (Gemma 3, Llava, ...) nest the language model's fields.
  const json* tc = find_any(root, {"text_config", "llm_config"});
  const json& j = (tc && tc->is_object()) ? *tc : root;

  ModelGeometry g;
  g.name = std::move(name);
  if (const json* mt = find_any(j, {"model_type"}); mt && mt->is_string())
    g.arch = mt->get<std::string>();
  if (g.arch.empty()) {
    if (const json* mt = find_any(root, {"model_type"}); mt && mt->is_string()) {
      g.arch = mt->get<std::string>();
    }
  }
  const ArchFacts* facts = arch_facts(g.arch);  // the model class's defaults (nullptr: none)

#define BIE_TRY_INT(var, ...)          \
  auto var##_r = get_int(__VA_ARGS__); \
  if (!var##_r) return Error{var##_r.error()};

  BIE_TRY_INT(n_layer, j, {"num_hidden_layers", "n_layer", "num_layers"}, std::nullopt, 1, 4096)
  BIE_TRY_INT(n_embd, j, {"hidden_size", "n_embd", "d_model"}, std::nullopt, 1)
  BIE_TRY_INT(n_head, j, {"num_attention_heads", "n_head"}, std::nullopt, 1)
  BIE_TRY_INT(n_vocab, j, {"vocab_size"}, std::nullopt, 1)
  g.n_layer = *n_layer_r;
  g.n_embd = *n_embd_r;
  g.n_head = *n_head_r;
  g.n_vocab = *n_vocab_r;
  BIE_TRY_INT(n_head_kv, j, {"num_key_value_heads", "n_head_kv"}, g.n_head, 1)
  BIE_TRY_INT(head_dim, j, {"head_dim"}, g.n_embd / g.n_head, 1)
  BIE_TRY_INT(n_ctx, j, {"max_position_embeddings", "n_positions", "max_sequence_length"},
              int64_t{0}, 0, int64_t{1} << 30)
  g.head_dim = *head_dim_r;
  g.n_ctx_train = *n_ctx_r;
  if (g.n_head % *n_head_kv_r != 0) {
    return Error{
        fmt::format("config.json: num_attention_heads {} is not a multiple of "
                    "num_key_value_heads {}",
                    g.n_head, *n_head_kv_r)};
  }

  // MoE fields (DeepSeek, Qwen-MoE, Mixtral spellings).
  BIE_TRY_INT(n_expert, j, {"n_routed_experts", "num_experts", "num_local_experts"}, int64_t{0}, 0,
              1 << 16)
  g.moe.n_expert = static_cast<int>(*n_expert_r);
  BIE_TRY_INT(n_ff, j, {"intermediate_size", "ffn_dim", "n_inner"},
              g.moe.n_expert > 0 ? std::optional<int64_t>(0) : std::nullopt, 0)
  g.n_ff = *n_ff_r;
  if (g.moe.n_expert > 0) {
    BIE_TRY_INT(used, j, {"num_experts_per_tok", "moe_topk"}, std::nullopt, 1, g.moe.n_expert)
    BIE_TRY_INT(expert_ff, j, {"moe_intermediate_size"},
                g.n_ff > 0 ? std::optional(g.n_ff) : std::nullopt, 1)
    BIE_TRY_INT(shared_ff, j, {"shared_expert_intermediate_size"}, int64_t{0}, 0)
    BIE_TRY_INT(n_shared, j, {"n_shared_experts", "num_shared_experts"}, *shared_ff_r > 0 ? 1 : 0,
                0, 1024)
    BIE_TRY_INT(dense_lead, j, {"first_k_dense_replace"}, int64_t{0}, 0, g.n_layer)
    g.moe.n_expert_used = static_cast<int>(*used_r);
    g.moe.expert_ff = *expert_ff_r;
    g.moe.n_expert_shared = static_cast<int>(*n_shared_r);
    g.moe.shared_ff = *shared_ff_r > 0 ? *shared_ff_r : g.moe.expert_ff;
    g.moe.n_dense_lead = static_cast<int>(*dense_lead_r);
    if (g.moe.n_dense_lead > 0 && g.n_ff == 0) {
      return Error{"config.json: missing \"intermediate_size\" for the dense leading layers"};
    }
  }

  // MLA (DeepSeek-V2/V3): the cache holds kv_lora_rank + qk_rope_head_dim values per token and
  // layer.
  if (const json* r = find_any(j, {"kv_lora_rank"})) {
    if (!r->is_number_integer() || r->get<int64_t>() <= 0) {
      return Error{"config.json: \"kv_lora_rank\" must be a positive integer"};
    }
    BIE_TRY_INT(rope, j, {"qk_rope_head_dim"}, std::nullopt, 0)
    BIE_TRY_INT(nope, j, {"qk_nope_head_dim"}, std::nullopt, 0)
    BIE_TRY_INT(vdim, j, {"v_head_dim"}, std::nullopt, 1)
    BIE_TRY_INT(qlora, j, {"q_lora_rank"}, int64_t{0}, 0)
    g.mla = true;
    g.kv_lora_rank = static_cast<int>(r->get<int64_t>());
    g.qk_rope_dim = static_cast<int>(*rope_r);
    g.v_head_dim = static_cast<int>(*vdim_r);
    g.q_lora_rank = static_cast<int>(*qlora_r);
    g.head_dim = *nope_r + *rope_r;
  }

  // Sliding window: an explicit per-layer list wins; then a period; then the family's rule.
  std::vector<bool> local(static_cast<size_t>(g.n_layer), false);
  int64_t window = 0;
  const json* sw = find_any(j, {"sliding_window"});
  const json* use_sw = find_any(j, {"use_sliding_window"});
  const bool sw_enabled = !(use_sw && use_sw->is_boolean() && !use_sw->get<bool>());
  if (sw && sw_enabled) {
    BIE_TRY_INT(w, j, {"sliding_window"}, std::nullopt, 1, int64_t{1} << 30)
    window = *w_r;
    if (const json* lt = find_any(j, {"layer_types"})) {
      if (!lt->is_array() || static_cast<int64_t>(lt->size()) != g.n_layer) {
        return Error{"config.json: \"layer_types\" must list one entry per layer"};
      }
      for (size_t i = 0; i < lt->size(); ++i) {
        local[i] = (*lt)[i].is_string() && (*lt)[i].get<std::string>() == "sliding_attention";
      }
    } else {
      int period = 0;  // Mistral-7B-v0.1 style: every layer local
      if (const json* p = find_any(j, {"sliding_window_pattern"}); p && p->is_number_integer()) {
        period = p->get<int>();
      } else if (facts) {
        period = facts->swa_period;
      }
      if (period < 0) return Error{"config.json: \"sliding_window_pattern\" must not be negative"};
      for (int64_t il = 0; il < g.n_layer; ++il)
        local[static_cast<size_t>(il)] = is_swa_layer(il, period);
    }
  }

  g.layers.resize(static_cast<size_t>(g.n_layer));
  for (int64_t il = 0; il < g.n_layer; ++il) {
    LayerKv& l = g.layers[static_cast<size_t>(il)];
    if (g.mla) {
      l = LayerKv{1, g.kv_lora_rank + g.qk_rope_dim, 0, 0};
    } else {
      l = LayerKv{static_cast<int>(*n_head_kv_r), static_cast<int>(g.head_dim),
                  static_cast<int>(g.head_dim), 0};
    }
    if (local[static_cast<size_t>(il)]) l.window = window;
  }
#undef BIE_TRY_INT

  // HF defaults differ per model class: Gemma ties embeddings, the Llama/Qwen/Mistral/DeepSeek
  // classes do not.
  if (const json* t = find_any(j, {"tie_word_embeddings"}); t && t->is_boolean()) {
    g.tied_embeddings = t->get<bool>();
  } else if (const json* t2 = find_any(root, {"tie_word_embeddings"}); t2 && t2->is_boolean()) {
    g.tied_embeddings = t2->get<bool>();
  } else {
    g.tied_embeddings = facts && facts->tied_embeddings;
  }
  if (const json* b = find_any(j, {"attention_bias"}); b && b->is_boolean()) {
    g.qkv_bias = b->get<bool>();
  }
  if (facts && facts->qkv_bias) g.qkv_bias = true;

  count_params_from_widths(g);
  return g;
}

Result<ModelGeometry> geometry_from_hf_config_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error{fmt::format("{}: cannot open", path)};
  std::ostringstream ss;
  ss << in.rdbuf();
  auto g = geometry_from_hf_config(ss.str(), path);
  if (!g) return Error{fmt::format("{}: {}", path, g.error())};
  g->source = path;
  return g;
}

}  // namespace bie::planner
