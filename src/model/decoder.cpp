// The pre-norm decoder every supported architecture is (the table in architectures.cpp switches
// its features). Per layer, with n() the RMSNorm:
//   q, k, v = Wq·n(x) (+bq), Wk·n(x) (+bk), Wv·n(x) (+bv)
//   q, k = rope(q_norm(q)), rope(k_norm(k))            (q_norm/k_norm: qk_norm archs)
//   x += post_attn_norm(Wo · attn(q, k, v))             (post norm: post_norms archs)
//   x += post_ffn_norm(Wdown · (act(Wgate·n(x)) * Wup·n(x)))
// logits = W_out · n(x) (W_out = token_embd when output.weight is absent), soft-capped when the
// architecture and the file say so. Embeddings are scaled by sqrt(n_embd) for embd_scale archs.
// Local (sliding-window) layers attend to the last `window` positions with their own rope base
// (rope.freq_base_swa, default 10000, no scaling); which layers are local comes from the
// planner's geometry (one reading of the sliding-window metadata for planner and model). Norm
// weights are used as stored (llama.cpp's converter bakes Gemma's (1 + w) into the tensors).
#include <fmt/format.h>

#include <cmath>

#include "bie/backend/matmul.h"
#include "bie/backend/ops.h"
#include "bie/planner/model_geometry.h"
#include "bie/quant/traits.h"
#include "model/architectures.h"
#include "model/batch_plan.h"
#include "model/model_loader.h"

namespace bie {

namespace {

using model_loader::BatchPlan;
using model_loader::Binder;
using model_loader::for_each_token;
using model_loader::LoadError;

class DecoderModel final : public Model {
 public:
  DecoderModel(const ArchSpec& spec, std::unique_ptr<gguf::GgufFile> file, const LoadOptions& opts)
      : spec_(spec) {
    file_ = std::move(file);
    max_batch_ = opts.max_batch_tokens;
    Binder b(*file_);
    read_hparams(b);
    bind_weights(b);
    weight_bytes_ = b.bound_bytes();
    allocate_workspace();
  }

  Status forward_batch(std::span<const BatchSequence> seqs, ThreadPool& pool,
                       std::vector<float>& logits) override;

 private:
  struct Layer {
    const float* attn_norm;                 // [n_embd]
    WeightView wq;                          // [n_embd -> n_head * head_dim]
    WeightView wk;                          // [n_embd -> n_head_kv * head_dim]
    WeightView wv;                          // [n_embd -> n_head_kv * head_dim]
    const float* bq = nullptr;              // [n_head * head_dim] (qkv bias, e.g. qwen2)
    const float* bk = nullptr;              // [n_head_kv * head_dim]
    const float* bv = nullptr;              // [n_head_kv * head_dim]
    const float* q_norm = nullptr;          // [head_dim] per-head RMSNorm of q (qk_norm)
    const float* k_norm = nullptr;          // [head_dim] per-head RMSNorm of k (qk_norm)
    WeightView wo;                          // [n_head * head_dim -> n_embd]
    const float* attn_post_norm = nullptr;  // [n_embd] (post_norms)
    const float* ffn_norm;                  // [n_embd]
    WeightView w_gate;                      // [n_embd -> n_ff]
    WeightView w_up;                        // [n_embd -> n_ff]
    WeightView w_down;                      // [n_ff -> n_embd]
    const float* ffn_post_norm = nullptr;   // [n_embd] (post_norms)
  };

  void read_hparams(Binder& b);
  void bind_weights(Binder& b);
  void allocate_workspace();

  void mm(const WeightView& w, const float* x, float* y, ThreadPool& pool) {
    plan_.mm(w, x, y, pool, mm_);
  }

  const ArchSpec& spec_;
  int32_t max_batch_ = 512;
  float attn_scale_ = 1.0f;             // 1/sqrt(head_dim), or the architecture's own rule
  float softcap_ = 0.0f;                // final logit soft-capping; 0 = none
  WeightView tok_embd_;                 // [n_embd, n_vocab] rows are token embeddings
  const float* output_norm_ = nullptr;  // [n_embd]
  WeightView output_;                   // [n_embd -> n_vocab] (token_embd when tied)
  std::vector<Layer> layers_;
  ops::RopeParams rope_global_;  // full-attention layers
  ops::RopeParams rope_local_;   // sliding-window layers (sliding_window archs)

  // Activation workspace, sized for max_batch_ tokens.
  std::vector<float> x_;     // [max_batch, n_embd] residual stream
  std::vector<float> xn_;    // [max_batch, n_embd] normalised input of a sub-layer
  std::vector<float> q_;     // [max_batch, n_head * head_dim]
  std::vector<float> k_;     // [max_batch, n_head_kv * head_dim]
  std::vector<float> v_;     // [max_batch, n_head_kv * head_dim]
  std::vector<float> attn_;  // [max_batch, n_head * head_dim]
  std::vector<float> proj_;  // [max_batch, n_embd] output of Wo / Wdown
  std::vector<float> gate_;  // [max_batch, n_ff]
  std::vector<float> up_;    // [max_batch, n_ff]
  std::vector<float> cs_g_;  // [max_batch, n_rot] rope (cos, sin) per token, global layers
  std::vector<float> cs_l_;  // [max_batch, n_rot] same for local layers (sliding_window)
  MatmulScratch mm_;
  BatchPlan plan_;
};

void DecoderModel::read_hparams(Binder& b) {
  ModelHParams& hp = hp_;
  const std::string a = file_->architecture() + ".";
  model_loader::read_transformer_hparams(*file_, b, hp, spec_.default_ctx, spec_.default_eps);
  hp.rope_layout = spec_.rope;
  hp.qkv_bias = file_->find_tensor("blk.0.attn_q.bias") != nullptr;

  if (spec_.sliding_window) {
    // Local layers and their window, read as the planner reads them (llama.cpp's rule: the
    // sliding_window_pattern array, or period p = pattern key or 6 for gemma3, local iff
    // il % p < p - 1).
    auto geo = planner::geometry_from_gguf(*file_);
    if (!geo.ok()) throw LoadError{geo.error()};
    if (static_cast<int32_t>(geo->layers.size()) != hp.n_layer) {
      throw LoadError{"layer geometry does not match block_count"};
    }
    hp.layer_window.assign(static_cast<size_t>(hp.n_layer), 0);
    for (int il = 0; il < hp.n_layer; ++il) {
      hp.layer_window[static_cast<size_t>(il)] =
          static_cast<int32_t>(geo->layers[static_cast<size_t>(il)].window);
    }
  }

  // llama.cpp's gemma rule: 1/sqrt(n_embd / n_head) for the 27B (62 layers); else 1/sqrt(head_dim).
  const float scale_dim = spec_.scale_q && hp.n_layer == 62
                              ? static_cast<float>(hp.n_embd / hp.n_head)
                              : static_cast<float>(hp.head_dim);
  attn_scale_ = 1.0f / std::sqrt(scale_dim);
  if (spec_.softcap) softcap_ = b.optional_float(a + "final_logit_softcapping").value_or(0.0f);

  rope_global_.n_rot = hp.n_rot;
  rope_global_.freq_base = hp.rope_freq_base;
  rope_global_.freq_scale = hp.rope_freq_scale;
  rope_global_.neox = hp.rope_layout == RopeLayout::kNeox;
  rope_local_ = rope_global_;
  rope_local_.freq_base = b.optional_float(a + "rope.freq_base_swa").value_or(10000.0f);
  rope_local_.freq_scale = 1.0f;
}

void DecoderModel::bind_weights(Binder& b) {
  const ModelHParams& hp = hp_;
  const int64_t q_dim = static_cast<int64_t>(hp.n_head) * hp.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(hp.n_head_kv) * hp.head_dim;
  tok_embd_ = b.matrix("token_embd.weight", hp.n_embd, hp.n_vocab);
  output_norm_ = b.vector_f32("output_norm.weight", hp.n_embd);
  output_ = hp.tied_output ? tok_embd_ : b.matrix("output.weight", hp.n_embd, hp.n_vocab);
  if (b.has("rope_freqs.weight")) {
    rope_global_.freq_factors = b.vector_f32("rope_freqs.weight", hp.n_rot / 2);
  }
  layers_.resize(static_cast<size_t>(hp.n_layer));
  for (int il = 0; il < hp.n_layer; ++il) {
    Layer& l = layers_[static_cast<size_t>(il)];
    const std::string p = fmt::format("blk.{}.", il);
    l.attn_norm = b.vector_f32(p + "attn_norm.weight", hp.n_embd);
    l.wq = b.matrix(p + "attn_q.weight", hp.n_embd, q_dim);
    l.wk = b.matrix(p + "attn_k.weight", hp.n_embd, kv_dim);
    l.wv = b.matrix(p + "attn_v.weight", hp.n_embd, kv_dim);
    if (hp.qkv_bias) {
      l.bq = b.vector_f32(p + "attn_q.bias", q_dim);
      l.bk = b.vector_f32(p + "attn_k.bias", kv_dim);
      l.bv = b.vector_f32(p + "attn_v.bias", kv_dim);
    }
    if (spec_.qk_norm) {
      l.q_norm = b.vector_f32(p + "attn_q_norm.weight", hp.head_dim);
      l.k_norm = b.vector_f32(p + "attn_k_norm.weight", hp.head_dim);
    }
    l.wo = b.matrix(p + "attn_output.weight", q_dim, hp.n_embd);
    if (spec_.post_norms) {
      l.attn_post_norm = b.vector_f32(p + "post_attention_norm.weight", hp.n_embd);
    }
    l.ffn_norm = b.vector_f32(p + "ffn_norm.weight", hp.n_embd);
    l.w_gate = b.matrix(p + "ffn_gate.weight", hp.n_embd, hp.n_ff);
    l.w_up = b.matrix(p + "ffn_up.weight", hp.n_embd, hp.n_ff);
    l.w_down = b.matrix(p + "ffn_down.weight", hp.n_ff, hp.n_embd);
    if (spec_.post_norms) l.ffn_post_norm = b.vector_f32(p + "post_ffw_norm.weight", hp.n_embd);
  }
}

void DecoderModel::allocate_workspace() {
  const ModelHParams& hp = hp_;
  const auto n = static_cast<size_t>(max_batch_);
  const size_t q_dim = static_cast<size_t>(hp.n_head) * static_cast<size_t>(hp.head_dim);
  const size_t kv_dim = static_cast<size_t>(hp.n_head_kv) * static_cast<size_t>(hp.head_dim);
  x_.resize(n * static_cast<size_t>(hp.n_embd));
  xn_.resize(n * static_cast<size_t>(hp.n_embd));
  proj_.resize(n * static_cast<size_t>(hp.n_embd));
  q_.resize(n * q_dim);
  attn_.resize(n * q_dim);
  k_.resize(n * kv_dim);
  v_.resize(n * kv_dim);
  gate_.resize(n * static_cast<size_t>(hp.n_ff));
  up_.resize(n * static_cast<size_t>(hp.n_ff));
  cs_g_.resize(n * static_cast<size_t>(hp.n_rot));
  if (spec_.sliding_window) cs_l_.resize(n * static_cast<size_t>(hp.n_rot));
}

Status DecoderModel::forward_batch(std::span<const BatchSequence> seqs, ThreadPool& pool,
                                   std::vector<float>& logits) {
  const ModelHParams& hp = hp_;
  if (Status st = plan_.prepare(seqs, hp.n_vocab, max_batch_); !st) return st;
  const int64_t n = plan_.n_tokens();
  const int64_t n_embd = hp.n_embd;
  const int64_t hd = hp.head_dim;
  const int64_t q_dim = static_cast<int64_t>(hp.n_head) * hd;
  const int64_t kv_dim = static_cast<int64_t>(hp.n_head_kv) * hd;
  const int64_t n_ff = hp.n_ff;
  const float embd_scale = std::sqrt(static_cast<float>(n_embd));
  // Where the attention scale goes: into q (scale_q archs) or into the attention kernel.
  const float kernel_scale = spec_.scale_q ? 1.0f : attn_scale_;

  const quant::TypeTraits* emb_tr = quant::traits(tok_embd_.type);
  for_each_token(pool, n, [&](int64_t i) {
    const auto* emb = static_cast<const uint8_t*>(tok_embd_.data) +
                      static_cast<size_t>(plan_.token(i)) * tok_embd_.row_bytes;
    float* x = x_.data() + i * n_embd;
    emb_tr->to_float(emb, x, n_embd);
    if (spec_.embd_scale) {
      for (int64_t c = 0; c < n_embd; ++c) x[c] *= embd_scale;
    }
    ops::rope_cache(rope_global_, plan_.pos(i), cs_g_.data() + i * hp.n_rot);
    if (spec_.sliding_window) {
      ops::rope_cache(rope_local_, plan_.pos(i), cs_l_.data() + i * hp.n_rot);
    }
  });

  for (int il = 0; il < hp.n_layer; ++il) {
    const Layer& l = layers_[static_cast<size_t>(il)];
    const int64_t window = hp.layer_window.empty() ? 0 : hp.layer_window[static_cast<size_t>(il)];
    const ops::RopeParams& rope = window > 0 ? rope_local_ : rope_global_;
    const std::vector<float>& cs_all = window > 0 ? cs_l_ : cs_g_;
    for_each_token(pool, n, [&](int64_t i) {
      ops::rms_norm(x_.data() + i * n_embd, l.attn_norm, xn_.data() + i * n_embd, n_embd,
                    hp.rms_eps);
    });
    mm(l.wq, xn_.data(), q_.data(), pool);
    mm(l.wk, xn_.data(), k_.data(), pool);
    mm(l.wv, xn_.data(), v_.data(), pool);
    for_each_token(pool, n, [&](int64_t i) {
      float* q = q_.data() + i * q_dim;
      float* k = k_.data() + i * kv_dim;
      if (l.bq != nullptr) {
        ops::add_inplace(q, l.bq, q_dim);
        ops::add_inplace(k, l.bk, kv_dim);
        ops::add_inplace(v_.data() + i * kv_dim, l.bv, kv_dim);
      }
      if (l.q_norm != nullptr) {
        for (int h = 0; h < hp.n_head; ++h) {
          ops::rms_norm(q + h * hd, l.q_norm, q + h * hd, hd, hp.rms_eps);
        }
        for (int h = 0; h < hp.n_head_kv; ++h) {
          ops::rms_norm(k + h * hd, l.k_norm, k + h * hd, hd, hp.rms_eps);
        }
      }
      const float* cs = cs_all.data() + i * hp.n_rot;
      ops::rope_apply(rope, cs, q, hp.n_head, hp.head_dim);
      ops::rope_apply(rope, cs, k, hp.n_head_kv, hp.head_dim);
      if (spec_.scale_q) {
        for (int64_t c = 0; c < q_dim; ++c) q[c] *= attn_scale_;
      }
    });
    for (size_t sq = 0; sq < seqs.size(); ++sq) {
      KvCache& kv = *seqs[sq].kv;
      const int64_t r0 = plan_.seq_row(sq);
      const auto ns = static_cast<int64_t>(seqs[sq].tokens.size());
      kv.store(il, plan_.seq_pos(sq), ns, k_.data() + r0 * kv_dim, v_.data() + r0 * kv_dim);
      kv.attend(il, plan_.seq_pos(sq), ns, q_.data() + r0 * q_dim, hp.n_head, kernel_scale,
                attn_.data() + r0 * q_dim, pool, window);
    }
    mm(l.wo, attn_.data(), proj_.data(), pool);
    for_each_token(pool, n, [&](int64_t i) {
      float* x = x_.data() + i * n_embd;
      float* p = proj_.data() + i * n_embd;
      if (l.attn_post_norm != nullptr) ops::rms_norm(p, l.attn_post_norm, p, n_embd, hp.rms_eps);
      ops::add_inplace(x, p, n_embd);
      ops::rms_norm(x, l.ffn_norm, xn_.data() + i * n_embd, n_embd, hp.rms_eps);
    });
    mm(l.w_gate, xn_.data(), gate_.data(), pool);
    mm(l.w_up, xn_.data(), up_.data(), pool);
    for_each_token(pool, n, [&](int64_t i) {
      if (spec_.act == FfnActivation::kGelu) {
        ops::gelu_mul_inplace(gate_.data() + i * n_ff, up_.data() + i * n_ff, n_ff);
      } else {
        ops::silu_mul_inplace(gate_.data() + i * n_ff, up_.data() + i * n_ff, n_ff);
      }
    });
    mm(l.w_down, gate_.data(), proj_.data(), pool);
    for_each_token(pool, n, [&](int64_t i) {
      float* p = proj_.data() + i * n_embd;
      if (l.ffn_post_norm != nullptr) ops::rms_norm(p, l.ffn_post_norm, p, n_embd, hp.rms_eps);
      ops::add_inplace(x_.data() + i * n_embd, p, n_embd);
    });
  }

  const std::vector<int64_t>& out_rows = plan_.out_rows();
  const auto n_out = static_cast<int64_t>(out_rows.size());
  if (n_out == 0) {
    logits.clear();
    return {};
  }
  for_each_token(pool, n_out, [&](int64_t i) {
    ops::rms_norm(x_.data() + out_rows[static_cast<size_t>(i)] * n_embd, output_norm_,
                  xn_.data() + i * n_embd, n_embd, hp.rms_eps);
  });
  logits.resize(static_cast<size_t>(n_out) * static_cast<size_t>(hp.n_vocab));
  plan_.mm_out(output_, xn_.data(), logits.data(), pool, mm_);
  if (softcap_ > 0.0f) {
    for (float& z : logits) z = std::tanh(z * (1.0f / softcap_)) * softcap_;
  }
  return {};
}

}  // namespace

std::unique_ptr<Model> make_decoder_model(const ArchSpec& spec,
                                          std::unique_ptr<gguf::GgufFile> file,
                                          const LoadOptions& opts) {
  return std::make_unique<DecoderModel>(spec, std::move(file), opts);
}

}  // namespace bie
