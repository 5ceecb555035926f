// The llama family: llama, mistral, qwen2 (QKV bias, NEOX rope) and SmolLM2 (a llama).
// Per layer: x += Wo·attn(rope(Wq·n(x)), rope(Wk·n(x)), Wv·n(x)); x += Wdown·(silu(Wgate·n(x)) *
// Wup·n(x)).
#include <fmt/format.h>

#include <cmath>

#include "bie/backend/matmul.h"
#include "bie/backend/ops.h"
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

class LlamaModel final : public Model {
 public:
  LlamaModel(std::unique_ptr<gguf::GgufFile> file, const LoadOptions& opts) {
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
    const float* attn_norm;     // [n_embd]
    WeightView wq;              // [n_embd -> n_head * head_dim]
    WeightView wk;              // [n_embd -> n_head_kv * head_dim]
    WeightView wv;              // [n_embd -> n_head_kv * head_dim]
    WeightView wo;              // [n_head * head_dim -> n_embd]
    const float* bq = nullptr;  // [n_head * head_dim] (qwen2)
    const float* bk = nullptr;  // [n_head_kv * head_dim]
    const float* bv = nullptr;  // [n_head_kv * head_dim]
    const float* ffn_norm;      // [n_embd]
    WeightView w_gate;          // [n_embd -> n_ff]
    WeightView w_up;            // [n_embd -> n_ff]
    WeightView w_down;          // [n_ff -> n_embd]
  };

  void read_hparams(Binder& b);
  void bind_weights(Binder& b);
  void allocate_workspace();

  int32_t max_batch_ = 512;
  WeightView tok_embd_;                 // [n_embd, n_vocab] rows are token embeddings
  const float* output_norm_ = nullptr;  // [n_embd]
  WeightView output_;                   // [n_embd -> n_vocab] (token_embd when tied)
  const float* rope_freqs_ = nullptr;   // [n_rot / 2] optional
  std::vector<Layer> layers_;
  ops::RopeParams rope_;

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
  std::vector<float> cs_;    // [max_batch, n_rot] rope (cos, sin) per token
  MatmulScratch mm_;
  BatchPlan plan_;

  void mm(const WeightView& w, const float* x, float* y, ThreadPool& pool) {
    plan_.mm(w, x, y, pool, mm_);
  }
};

void LlamaModel::read_hparams(Binder& b) {
  ModelHParams& hp = hp_;
  model_loader::read_transformer_hparams(*file_, b, hp, /*default_ctx=*/2048,
                                         /*default_eps=*/1e-5f);
  hp.rope_layout = hp.arch == "qwen2" ? RopeLayout::kNeox : RopeLayout::kNorm;
  hp.qkv_bias = file_->find_tensor("blk.0.attn_q.bias") != nullptr;

  rope_.n_rot = hp.n_rot;
  rope_.freq_base = hp.rope_freq_base;
  rope_.freq_scale = hp.rope_freq_scale;
  rope_.neox = hp.rope_layout == RopeLayout::kNeox;
}

void LlamaModel::bind_weights(Binder& b) {
  const ModelHParams& hp = hp_;
  const int64_t q_dim = static_cast<int64_t>(hp.n_head) * hp.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(hp.n_head_kv) * hp.head_dim;
  tok_embd_ = b.matrix("token_embd.weight", hp.n_embd, hp.n_vocab);
  output_norm_ = b.vector_f32("output_norm.weight", hp.n_embd);
  output_ = hp.tied_output ? tok_embd_ : b.matrix("output.weight", hp.n_embd, hp.n_vocab);
  if (b.has("rope_freqs.weight")) {
    rope_freqs_ = b.vector_f32("rope_freqs.weight", hp.n_rot / 2);
    rope_.freq_factors = rope_freqs_;
  }
  layers_.resize(static_cast<size_t>(hp.n_layer));
  for (int il = 0; il < hp.n_layer; ++il) {
    Layer& l = layers_[static_cast<size_t>(il)];
    const std::string p = fmt::format("blk.{}.", il);
    l.attn_norm = b.vector_f32(p + "attn_norm.weight", hp.n_embd);
    l.wq = b.matrix(p + "attn_q.weight", hp.n_embd, q_dim);
    l.wk = b.matrix(p + "attn_k.weight", hp.n_embd, kv_dim);
    l.wv = b.matrix(p + "attn_v.weight", hp.n_embd, kv_dim);
    l.wo = b.matrix(p + "attn_output.weight", q_dim, hp.n_embd);
    if (hp.qkv_bias) {
      l.bq = b.vector_f32(p + "attn_q.bias", q_dim);
      l.bk = b.vector_f32(p + "attn_k.bias", kv_dim);
      l.bv = b.vector_f32(p + "attn_v.bias", kv_dim);
    }
    l.ffn_norm = b.vector_f32(p + "ffn_norm.weight", hp.n_embd);
    l.w_gate = b.matrix(p + "ffn_gate.weight", hp.n_embd, hp.n_ff);
    l.w_up = b.matrix(p + "ffn_up.weight", hp.n_embd, hp.n_ff);
    l.w_down = b.matrix(p + "ffn_down.weight", hp.n_ff, hp.n_embd);
  }
}

void LlamaModel::allocate_workspace() {
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
  cs_.resize(n * static_cast<size_t>(hp.n_rot));
}

Status LlamaModel::forward_batch(std::span<const BatchSequence> seqs, ThreadPool& pool,
                                 std::vector<float>& logits) {
  const ModelHParams& hp = hp_;
  if (Status st = plan_.prepare(seqs, hp.n_vocab, max_batch_); !st) return st;
  const int64_t n = plan_.n_tokens();
  const size_t n_seq = seqs.size();

  const int64_t n_embd = hp.n_embd;
  const int64_t q_dim = static_cast<int64_t>(hp.n_head) * hp.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(hp.n_head_kv) * hp.head_dim;
  const int64_t n_ff = hp.n_ff;
  const float attn_scale = 1.0f / std::sqrt(static_cast<float>(hp.head_dim));

  const quant::TypeTraits* emb_tr = quant::traits(tok_embd_.type);
  for_each_token(pool, n, [&](int64_t i) {
    const auto* emb = static_cast<const uint8_t*>(tok_embd_.data) +
                      static_cast<size_t>(plan_.token(i)) * tok_embd_.row_bytes;
    emb_tr->to_float(emb, x_.data() + i * n_embd, n_embd);
    ops::rope_cache(rope_, plan_.pos(i), cs_.data() + i * hp.n_rot);
  });

  for (int il = 0; il < hp.n_layer; ++il) {
    const Layer& l = layers_[static_cast<size_t>(il)];
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
      const float* cs = cs_.data() + i * hp.n_rot;
      ops::rope_apply(rope_, cs, q, hp.n_head, hp.head_dim);
      ops::rope_apply(rope_, cs, k, hp.n_head_kv, hp.head_dim);
    });
    for (size_t sq = 0; sq < n_seq; ++sq) {
      KvCache& kv = *seqs[sq].kv;
      const int64_t r0 = plan_.seq_row(sq);
      const auto ns = static_cast<int64_t>(seqs[sq].tokens.size());
      kv.store(il, plan_.seq_pos(sq), ns, k_.data() + r0 * kv_dim, v_.data() + r0 * kv_dim);
      kv.attend(il, plan_.seq_pos(sq), ns, q_.data() + r0 * q_dim, hp.n_head, attn_scale,
                attn_.data() + r0 * q_dim, pool);
    }
    mm(l.wo, attn_.data(), proj_.data(), pool);
    for_each_token(pool, n, [&](int64_t i) {
      float* x = x_.data() + i * n_embd;
      ops::add_inplace(x, proj_.data() + i * n_embd, n_embd);
      ops::rms_norm(x, l.ffn_norm, xn_.data() + i * n_embd, n_embd, hp.rms_eps);
    });
    mm(l.w_gate, xn_.data(), gate_.data(), pool);
    mm(l.w_up, xn_.data(), up_.data(), pool);
    for_each_token(pool, n, [&](int64_t i) {
      ops::silu_mul_inplace(gate_.data() + i * n_ff, up_.data() + i * n_ff, n_ff);
    });
    mm(l.w_down, gate_.data(), proj_.data(), pool);
    for_each_token(pool, n, [&](int64_t i) {
      ops::add_inplace(x_.data() + i * n_embd, proj_.data() + i * n_embd, n_embd);
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
  return {};
}

}  // namespace

std::unique_ptr<Model> make_llama_model(std::unique_ptr<gguf::GgufFile> file,
                                        const LoadOptions& opts) {
  return std::make_unique<LlamaModel>(std::move(file), opts);
}

}  // namespace bie
