#include "bie/planner/presets.h"

#include <fmt/format.h>

#include <array>
#include <cctype>
#include <string>

namespace bie::planner {

namespace {

// Field values copied from each model's config.json at the URL given (only the fields the planner
// reads). Parameter counts: model cards / papers as cited in docs/planner.md.
constexpr std::array kPresets = {
    ModelPreset{"llama-3-8b", "Meta Llama 3 8B",
                "https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json", 8.03e9,
                8.03e9,
                R"({"model_type":"llama","hidden_size":4096,"intermediate_size":14336,
                    "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,
                    "vocab_size":128256,"max_position_embeddings":8192,
                    "tie_word_embeddings":false})"},
    ModelPreset{"llama-3.1-8b", "Meta Llama 3.1 8B",
                "https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json", 8.03e9,
                8.03e9,
                R"({"model_type":"llama","hidden_size":4096,"intermediate_size":14336,
                    "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,
                    "vocab_size":128256,"max_position_embeddings":131072,
                    "tie_word_embeddings":false})"},
    ModelPreset{"llama-3-70b", "Meta Llama 3 70B",
                "https://huggingface.co/meta-llama/Meta-Llama-3-70B/blob/main/config.json", 70.6e9,
                70.6e9,
                R"({"model_type":"llama","hidden_size":8192,"intermediate_size":28672,
                    "num_hidden_layers":80,"num_attention_heads":64,"num_key_value_heads":8,
                    "vocab_size":128256,"max_position_embeddings":8192,
                    "tie_word_embeddings":false})"},
    ModelPreset{"llama-3.1-70b", "Meta Llama 3.1 70B",
                "https://huggingface.co/meta-llama/Llama-3.1-70B/blob/main/config.json", 70.6e9,
                70.6e9,
                R"({"model_type":"llama","hidden_size":8192,"intermediate_size":28672,
                    "num_hidden_layers":80,"num_attention_heads":64,"num_key_value_heads":8,
                    "vocab_size":128256,"max_position_embeddings":131072,
                    "tie_word_embeddings":false})"},
    ModelPreset{"llama-3.2-1b", "Meta Llama 3.2 1B",
                "https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json", 1.24e9,
                1.24e9,
                R"({"model_type":"llama","hidden_size":2048,"intermediate_size":8192,
                    "num_hidden_layers":16,"num_attention_heads":32,"num_key_value_heads":8,
                    "head_dim":64,"vocab_size":128256,"max_position_embeddings":131072,
                    "tie_word_embeddings":true})"},
    ModelPreset{"qwen2.5-0.5b", "Qwen2.5 0.5B",
                "https://huggingface.co/Qwen/Qwen2.5-0.5B/blob/main/config.json", 0.49e9, 0.49e9,
                R"({"model_type":"qwen2","hidden_size":896,"intermediate_size":4864,
                    "num_hidden_layers":24,"num_attention_heads":14,"num_key_value_heads":2,
                    "vocab_size":151936,"max_position_embeddings":32768,
                    "use_sliding_window":false,"sliding_window":32768,
                    "tie_word_embeddings":true})"},
    ModelPreset{"qwen2.5-7b", "Qwen2.5 7B",
                "https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json", 7.61e9, 7.61e9,
                R"({"model_type":"qwen2","hidden_size":3584,"intermediate_size":18944,
                    "num_hidden_layers":28,"num_attention_heads":28,"num_key_value_heads":4,
                    "vocab_size":152064,"max_position_embeddings":131072,
                    "use_sliding_window":false,"sliding_window":131072,
                    "tie_word_embeddings":false})"},
    ModelPreset{"qwen2.5-32b", "Qwen2.5 32B",
                "https://huggingface.co/Qwen/Qwen2.5-32B/blob/main/config.json", 32.76e9, 32.76e9,
                R"({"model_type":"qwen2","hidden_size":5120,"intermediate_size":27648,
                    "num_hidden_layers":64,"num_attention_heads":40,"num_key_value_heads":8,
                    "vocab_size":152064,"max_position_embeddings":131072,
                    "use_sliding_window":false,"sliding_window":131072,
                    "tie_word_embeddings":false})"},
    ModelPreset{"mistral-7b", "Mistral 7B v0.3",
                "https://huggingface.co/mistralai/Mistral-7B-v0.3/blob/main/config.json", 7.25e9,
                7.25e9,
                R"({"model_type":"mistral","hidden_size":4096,"intermediate_size":14336,
                    "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,
                    "vocab_size":32768,"max_position_embeddings":32768,"sliding_window":null,
                    "tie_word_embeddings":false})"},
    ModelPreset{"mistral-7b-v0.1", "Mistral 7B v0.1 (4096-token sliding window on every layer)",
                "https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json", 7.24e9,
                7.24e9,
                R"({"model_type":"mistral","hidden_size":4096,"intermediate_size":14336,
                    "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,
                    "vocab_size":32000,"max_position_embeddings":32768,"sliding_window":4096,
                    "tie_word_embeddings":false})"},
    ModelPreset{"mixtral-8x7b", "Mixtral 8x7B",
                "https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json", 46.7e9,
                12.9e9,
                R"({"model_type":"mixtral","hidden_size":4096,"intermediate_size":14336,
                    "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,
                    "num_local_experts":8,"num_experts_per_tok":2,"vocab_size":32000,
                    "max_position_embeddings":32768,"sliding_window":null,
                    "tie_word_embeddings":false})"},
    ModelPreset{"gemma-3-270m", "Gemma 3 270M",
                "https://huggingface.co/google/gemma-3-270m/blob/main/config.json", 0.268e9,
                0.268e9,
                R"({"model_type":"gemma3_text","hidden_size":640,"intermediate_size":2048,
                    "num_hidden_layers":18,"num_attention_heads":4,"num_key_value_heads":1,
                    "head_dim":256,"vocab_size":262144,"max_position_embeddings":32768,
                    "sliding_window":512,"sliding_window_pattern":6,
                    "tie_word_embeddings":true})"},
    ModelPreset{"gemma-3-27b", "Gemma 3 27B (language model)",
                "https://huggingface.co/google/gemma-3-27b-it/blob/main/config.json", 27.0e9,
                27.0e9,
                R"({"model_type":"gemma3","text_config":{"model_type":"gemma3_text",
                    "hidden_size":5376,"intermediate_size":21504,"num_hidden_layers":62,
                    "num_attention_heads":32,"num_key_value_heads":16,"head_dim":128,
                    "vocab_size":262208,"max_position_embeddings":131072,
                    "sliding_window":1024,"sliding_window_pattern":6,
                    "tie_word_embeddings":true}})"},
    ModelPreset{"deepseek-v3", "DeepSeek-V3 (671B MoE, MLA)",
                "https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json", 671e9, 37e9,
                R"({"model_type":"deepseek_v3","hidden_size":7168,"intermediate_size":18432,
                    "moe_intermediate_size":2048,"num_hidden_layers":61,
                    "num_attention_heads":128,"num_key_value_heads":128,
                    "n_routed_experts":256,"n_shared_experts":1,"num_experts_per_tok":8,
                    "first_k_dense_replace":3,"kv_lora_rank":512,"q_lora_rank":1536,
                    "qk_rope_head_dim":64,"qk_nope_head_dim":128,"v_head_dim":128,
                    "vocab_size":129280,"max_position_embeddings":163840,
                    "tie_word_embeddings":false})"},
    ModelPreset{"qwen3-30b-a3b", "Qwen3 30B-A3B (MoE)",
                "https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json", 30.5e9, 3.3e9,
                R"({"model_type":"qwen3_moe","hidden_size":2048,"intermediate_size":6144,
                    "moe_intermediate_size":768,"num_hidden_layers":48,
                    "num_attention_heads":32,"num_key_value_heads":4,"head_dim":128,
                    "num_experts":128,"num_experts_per_tok":8,"vocab_size":151936,
                    "max_position_embeddings":40960,"sliding_window":null,
                    "tie_word_embeddings":false})"},
    ModelPreset{"qwen3-235b-a22b", "Qwen3 235B-A22B (MoE)",
                "https://huggingface.co/Qwen/Qwen3-235B-A22B/blob/main/config.json", 235e9, 22e9,
                R"({"model_type":"qwen3_moe","hidden_size":4096,"intermediate_size":12288,
                    "moe_intermediate_size":1536,"num_hidden_layers":94,
                    "num_attention_heads":64,"num_key_value_heads":4,"head_dim":128,
                    "num_experts":128,"num_experts_per_tok":8,"vocab_size":151936,
                    "max_position_embeddings":40960,"sliding_window":null,
                    "tie_word_embeddings":false})"},
    ModelPreset{"smollm2-135m", "SmolLM2 135M",
                "https://huggingface.co/HuggingFaceTB/SmolLM2-135M/blob/main/config.json", 0.135e9,
                0.135e9,
                R"({"model_type":"llama","hidden_size":576,"intermediate_size":1536,
                    "num_hidden_layers":30,"num_attention_heads":9,"num_key_value_heads":3,
                    "vocab_size":49152,"max_position_embeddings":8192,
                    "tie_word_embeddings":true})"},
};

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::span<const ModelPreset> model_presets() {
  return kPresets;
}

Result<ModelGeometry> preset_geometry(std::string_view name) {
  const std::string want = lower(name);
  for (const ModelPreset& p : kPresets) {
    if (p.name != want) continue;
    auto g = geometry_from_hf_config(p.config_json, std::string(p.display));
    if (!g) return Error{fmt::format("preset {}: {}", p.name, g.error())};  // a defect in the table
    g->source = fmt::format("preset {} ({})", p.name, p.source);
    return g;
  }
  std::string known;
  for (const ModelPreset& p : kPresets)
    known += fmt::format("{}{}", known.empty() ? "" : ", ", p.name);
  return Error{fmt::format("unknown preset '{}'; known: {}", name, known)};
}

}  // namespace bie::planner
