// ModelGeometry: the widths, layer pattern and parameter counts the planner needs, read from a
// GGUF header (tensor infos only, never tensor data), from a Hugging Face config.json, or from a
// built-in preset. Plain data; the readers are pure functions and thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bie/common/result.h"

namespace bie::gguf {
class GgufFile;
}

namespace bie::planner {

enum class AttentionKind { kMha, kGqa, kMqa, kMla };

[[nodiscard]] std::string_view attention_kind_name(AttentionKind k);

// What one layer stores in the KV cache per token.
struct LayerKv {
  int n_head_kv = 0;   // KV heads (1 for MLA: the latent is one shared "head")
  int head_dim_k = 0;  // values per K head (MLA: kv_lora_rank + qk_rope_dim)
  int head_dim_v = 0;  // values per V head (MLA: 0, V is read out of the latent)
  int64_t window = 0;  // sliding-window length in tokens; 0 = global attention

  friend bool operator==(const LayerKv&, const LayerKv&) = default;
};

struct MoeGeometry {
  int n_expert = 0;         // routed experts per MoE layer (0: dense model)
  int n_expert_used = 0;    // routed experts active per token
  int n_expert_shared = 0;  // always-active shared experts
  int64_t expert_ff = 0;    // FFN width of one routed expert
  int64_t shared_ff = 0;    // FFN width of one shared expert
  int n_dense_lead = 0;     // leading layers with a dense FFN instead of experts
};

struct ModelGeometry {
  std::string name;    // display name
  std::string arch;    // "llama", "gemma3", "deepseek_v3", ...
  std::string source;  // file path, config path or preset citation

  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t head_dim = 0;  // query head width (for MLA: qk_nope + qk_rope)
  int64_t n_rot = 0;     // dimensions RoPE rotates per head (0: head_dim)
  int64_t n_ff = 0;      // dense FFN width
  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;
  bool tied_embeddings = false;
  bool qkv_bias = false;

  std::vector<LayerKv> layers;  // [n_layer]

  bool mla = false;
  int kv_lora_rank = 0;
  int qk_rope_dim = 0;
  int q_lora_rank = 0;
  int v_head_dim = 0;  // MLA value head width (query side only)

  MoeGeometry moe;

  // Parameters: exact sums of tensor sizes for a GGUF file, computed from the widths otherwise.
  double n_params = 0;         // everything resident
  double n_params_active = 0;  // read per decoded token: routed experts scaled by used/total,
                               // the token-embedding table counted as one row unless tied
  double n_params_embd = 0;    // the token-embedding table

  // Present only for a GGUF file: exact bytes of all tensors, and of what one decode step reads.
  std::optional<uint64_t> weight_bytes;
  std::optional<uint64_t> weight_bytes_active;
  // For a GGUF file: bytes of its data section (the tensors with their alignment padding): what a
  // device backend uploads as the weights.
  std::optional<uint64_t> data_bytes;
  std::string weight_types;  // for a GGUF file: "q4_1 66.4 MB, q8_0 30.1 MB, ..."

  [[nodiscard]] AttentionKind attention_kind() const;
  [[nodiscard]] int64_t n_swa_layers() const;
  [[nodiscard]] int64_t max_window() const;  // largest sliding window, 0 if none
  [[nodiscard]] int64_t n_head_kv() const;   // KV heads of the first layer that has any
  [[nodiscard]] int64_t head_dim_kv() const;
  [[nodiscard]] bool is_moe() const { return moe.n_expert > 0; }
};

// Sliding-window layer pattern as llama.cpp sets it: with period p > 0, layer il is local when
// il % p < p - 1 (gemma3: p = 6, five local layers then one global); p == 0 makes every layer
// local.
[[nodiscard]] bool is_swa_layer(int64_t il, int period);

// What the planner knows of an architecture beyond what its file or config.json states: the
// defaults of its model class. One table (model_geometry.cpp), read by the GGUF and the
// config.json readers alike; an architecture without a row has none of these.
struct ArchFacts {
  std::string_view name;         // GGUF general.architecture / HF model_type
  bool prefix = false;           // also matches names that start with `name` (qwen3_moe, ...)
  int swa_period = 0;            // local/global pattern when only the window is given (0: none)
  bool four_norms = false;       // norms after attention and after the FFN as well (Gemma 2/3)
  bool qk_norm = false;          // per-head RMSNorm of q and k (Gemma 3, Qwen 3)
  bool tied_embeddings = false;  // HF default when config.json does not say
  bool qkv_bias = false;         // q/k/v biases hard-wired in the model class (Qwen 2)
};
// The row of `arch`: exact rows first, then the first prefix row; nullptr if none.
[[nodiscard]] const ArchFacts* arch_facts(std::string_view arch);

// Reads the geometry from a parsed GGUF header. Exact weight bytes come from the tensor infos.
[[nodiscard]] Result<ModelGeometry> geometry_from_gguf(const gguf::GgufFile& file);
[[nodiscard]] Result<ModelGeometry> geometry_from_gguf_path(const std::string& path);

// Reads the geometry from the text of a Hugging Face config.json (a nested "text_config" is used
// when present). Parameter counts are computed from the widths.
[[nodiscard]] Result<ModelGeometry> geometry_from_hf_config(std::string_view json_text,
                                                            std::string name);
[[nodiscard]] Result<ModelGeometry> geometry_from_hf_config_file(const std::string& path);

// Fills n_params, n_params_active and n_params_embd from the widths (dense, MoE and MLA
// layouts). Norm weights and biases are included; rotary tables, vision towers and
// multi-token-prediction heads are not.
void count_params_from_widths(ModelGeometry& g);

}  // namespace bie::planner
