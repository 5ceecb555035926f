// The decoder architectures load_model() knows, as one table: every architecture is the same
// pre-norm transformer (src/model/decoder.cpp) with a few features switched on or off. Adding
// an architecture whose layers differ only in these features is one row here (plus goldens).
#pragma once

#include <memory>
#include <span>

#include "bie/model/model.h"

namespace bie {

enum class FfnActivation { kSilu, kGelu };

struct ArchSpec {
  const char* name;  // general.architecture
  RopeLayout rope;
  FfnActivation act;
  int32_t default_ctx;  // context_length when the file has none
  float default_eps;    // layer_norm_rms_epsilon when the file has none
  bool qk_norm;         // per-head RMSNorm of q and k before rope (attn_q_norm / attn_k_norm)
  bool post_norms;      // RMSNorm of the attention and FFN outputs before the residual add
  bool embd_scale;      // embeddings scaled by sqrt(n_embd)
  bool scale_q;         // q multiplied by the attention scale before attention (as llama.cpp's
                        // gemma graph), instead of the scale inside attention
  bool sliding_window;  // local layers from the sliding-window metadata, own rope base
  bool softcap;         // final_logit_softcapping from the metadata, when present
};

// One row per architecture; QKV biases and rope_freqs.weight are used whenever the file has them.
[[nodiscard]] std::span<const ArchSpec> architecture_table();

// The pre-norm decoder for one row of the table. Throws model_loader::LoadError on a file it
// cannot bind.
std::unique_ptr<Model> make_decoder_model(const ArchSpec& spec,
                                          std::unique_ptr<gguf::GgufFile> file,
                                          const LoadOptions& opts);

}  // namespace bie
