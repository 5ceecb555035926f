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

#include <algorithm>
#include <cmath>

#include "bie/attention/attention_entropy.h"
#include "bie/attention/attention_runner.h"
#include "bie/backend/backend.h"
#include "bie/planner/model_geometry.h"
#include "model/architectures.h"
#include "model/batch_plan.h"
#include "model/model_loader.h"

namespace bie {

namespace {

using model_loader::BatchPlan;
using model_loader::Binder;
using model_loader::LoadError;

class DecoderModel final : public Model {
 public:
  DecoderModel(const ArchSpec& spec, std::unique_ptr<gguf::GgufFile> file, const LoadOptions& opts)
      : spec_(spec) {
    file_ = std::move(file);
    max_batch_ = opts.max_batch_tokens;
    max_out_ = std::max<int32_t>(1, opts.max_output_rows);
    Binder b(*file_);
    read_geometry(b);
    bind_weights(b);
    weight_bytes_ = b.bound_bytes();
    n_logits_ = geo_.n_vocab;
    if (opts.logits_vocab > 0 && opts.logits_vocab < geo_.n_vocab) {
      n_logits_ = opts.logits_vocab;
      output_ = output_.slice_rows(0, n_logits_);  // the trimmed head reads its first rows only
    }
  }

  Result<std::span<float>> forward_batch(std::span<const BatchSequence> seqs, Backend& be) override;
  Result<std::span<const float>> logits_of(std::span<const int32_t> ids, Backend& be) override;
  Status bind(Backend& be) override;
  Status upload_weights(Backend& be);

 private:
  // The attention entropy of the token at `pos` of kv's sequence (query row q) at layer il, into
  // out[il * n_head, + n_head) (BatchSequence::attn_entropy).
  [[nodiscard]] Status last_token_entropy(KvCache& kv, int il, int64_t pos, const Tensor& q,
                                          float scale, int64_t window,
                                          std::span<attention::HeadEntropy> out, Backend& be) const;
  // Weights are tensors of the backend buffer that holds the file's data section (offsets from
  // its start); norm weights and biases are F32 [1, n].
  struct Layer {
    Tensor attn_norm;       // [n_embd]
    Tensor wq;              // [n_embd -> n_head * head_dim]
    Tensor wk;              // [n_embd -> n_head_kv * head_dim]
    Tensor wv;              // [n_embd -> n_head_kv * head_dim]
    Tensor bq;              // [n_head * head_dim] (qkv bias, e.g. qwen2); empty: none
    Tensor bk;              // [n_head_kv * head_dim]
    Tensor bv;              // [n_head_kv * head_dim]
    Tensor q_norm;          // [head_dim] per-head RMSNorm of q (qk_norm)
    Tensor k_norm;          // [head_dim] per-head RMSNorm of k (qk_norm)
    Tensor wo;              // [n_head * head_dim -> n_embd]
    Tensor attn_post_norm;  // [n_embd] (post_norms)
    Tensor ffn_norm;        // [n_embd]
    Tensor w_gate;          // [n_embd -> n_ff]
    Tensor w_up;            // [n_embd -> n_ff]
    Tensor w_down;          // [n_ff -> n_embd]
    Tensor ffn_post_norm;   // [n_embd] (post_norms)
  };
  // Activation workspace in the bound backend's memory, sized for max_batch_ tokens.
  struct Workspace {
    std::vector<std::unique_ptr<DeviceBuffer>> buffers;
    Tensor x;     // [max_batch, n_embd] residual stream
    Tensor xn;    // [max_batch, n_embd] normalised input of a sub-layer
    Tensor q;     // [max_batch, n_head * head_dim]
    Tensor k;     // [max_batch, n_head_kv * head_dim]
    Tensor v;     // [max_batch, n_head_kv * head_dim]
    Tensor attn;  // [max_batch, n_head * head_dim]
    Tensor proj;  // [max_batch, n_embd] output of Wo / Wdown
    Tensor gate;  // [max_batch, n_ff]
    Tensor up;    // [max_batch, n_ff]
    Tensor cs_g;  // [max_batch, n_rot] rope (cos, sin) per token, global layers
    Tensor cs_l;  // [max_batch, n_rot] same for local layers (sliding_window)
    Tensor ids;   // I32 [max_batch, 1] token ids of the batch, then the logits rows
    Tensor pos;   // I32 [max_batch, 1] positions
    std::unique_ptr<DeviceBuffer> logits_buf;
    Tensor logits;  // [logits rows, n_logits], grown to the most rows a pass needed
    // logits_of: ids I32 [cap, 1], their output rows F32 [cap, n_embd], logits F32 [1, cap].
    std::vector<std::unique_ptr<DeviceBuffer>> extra_bufs;
    Tensor extra_ids, extra_rows, extra_logits;
  };

  void read_geometry(Binder& b);
  void bind_weights(Binder& b);
  // An F32/I32 tensor in a new buffer of `be`, held by `owner`.
  [[nodiscard]] static Result<Tensor> alloc(Backend& be, quant::GgmlType type, int64_t rows,
                                            int64_t cols,
                                            std::vector<std::unique_ptr<DeviceBuffer>>& owner);

  const ArchSpec& spec_;
  int32_t max_batch_ = 512;
  int32_t max_out_ = 1;      // logits rows allocated by bind()
  float attn_scale_ = 1.0f;  // 1/sqrt(head_dim), or the architecture's own rule
  float softcap_ = 0.0f;     // final logit soft-capping; 0 = none
  float rms_eps_ = 1e-5f;    // RMSNorm epsilon
  Tensor tok_embd_;          // [n_embd, n_vocab] rows are token embeddings
  Tensor output_norm_;       // [n_embd]
  Tensor output_;            // [n_embd -> n_vocab] (token_embd when tied)
  std::vector<Layer> layers_;
  RopeConfig rope_global_;        // full-attention layers
  RopeConfig rope_local_;         // sliding-window layers (sliding_window archs)
  std::vector<Tensor*> weights_;  // every weight tensor above (bind() points them at the buffer)

  uint64_t bound_backend_ = 0;  // Backend::id() of the bound backend; 0: none
  // The weights on the bound backend: one buffer, or pieces of whole tensors when the data
  // section is longer than the backend's max_buffer_bytes(); weight_file_offsets_: each weights_
  // tensor's offset in the data section (its offset in its piece is relative to the piece).
  std::vector<std::unique_ptr<DeviceBuffer>> weight_bufs_;
  std::vector<size_t> weight_file_offsets_;
  Workspace ws_;
  std::vector<int32_t> out_ids_;    // logits rows of the pass, as I32
  std::vector<float> host_logits_;  // logits of a backend whose memory is not host-visible
  std::vector<float> host_extra_;   // logits_of's, same
  BatchPlan plan_;
  attention::AttentionRunner attn_runner_;  // one paged_attention call per layer and KV store
  std::vector<attention::AttnSequence> attn_seqs_;  // the pass's sequences: rows, positions
};

void DecoderModel::read_geometry(Binder& b) {
  const std::string a = file_->architecture() + ".";
  geo_ = model_loader::read_transformer_geometry(*file_, b, spec_.default_ctx);
  const planner::ModelGeometry& hp = geo_;
  // Local layers and their window as the planner reads them (llama.cpp's rule: the
  // sliding_window_pattern array, or period p = pattern key or 6 for gemma3, local iff
  // il % p < p - 1); an architecture without local layers attends to the whole prefix.
  if (!spec_.sliding_window) {
    for (planner::LayerKv& l : geo_.layers) l.window = 0;
  }
  rms_eps_ = model_loader::read_rms_eps(*file_, b, spec_.default_eps);

  // llama.cpp's gemma rule: 1/sqrt(n_embd / n_head) for the 27B (62 layers); else 1/sqrt(head_dim).
  const float scale_dim = spec_.scale_q && hp.n_layer == 62
                              ? static_cast<float>(hp.n_embd / hp.n_head)
                              : static_cast<float>(hp.head_dim);
  attn_scale_ = 1.0f / std::sqrt(scale_dim);
  if (spec_.softcap) softcap_ = b.optional_float(a + "final_logit_softcapping").value_or(0.0f);

  rope_global_ = model_loader::read_rope(*file_, b, geo_);
  rope_global_.neox = spec_.rope == RopeLayout::kNeox;
  rope_local_ = rope_global_;
  rope_local_.freq_base = b.optional_float(a + "rope.freq_base_swa").value_or(10000.0f);
  rope_local_.freq_scale = 1.0f;
}

void DecoderModel::bind_weights(Binder& b) {
  const planner::ModelGeometry& hp = geo_;
  const int64_t q_dim = static_cast<int64_t>(hp.n_head) * hp.head_dim;
  const int64_t kv_dim = hp.n_head_kv() * hp.head_dim;
  tok_embd_ = b.matrix("token_embd.weight", hp.n_embd, hp.n_vocab);
  output_norm_ = b.vector_f32("output_norm.weight", hp.n_embd);
  output_ = hp.tied_embeddings ? tok_embd_ : b.matrix("output.weight", hp.n_embd, hp.n_vocab);
  weights_ = {&tok_embd_, &output_norm_, &output_};
  if (b.has("rope_freqs.weight")) {
    rope_global_.freq_factors = b.vector_f32("rope_freqs.weight", hp.n_rot / 2);
    weights_.push_back(&rope_global_.freq_factors);
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
    if (spec_.post_norms) {
      l.ffn_post_norm = b.vector_f32(p + "post_ffw_norm.weight", hp.n_embd);
    }
    for (Tensor* t :
         {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.bq, &l.bk, &l.bv, &l.q_norm, &l.k_norm, &l.wo,
          &l.attn_post_norm, &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down, &l.ffn_post_norm}) {
      if (t->rows != 0) weights_.push_back(t);
    }
  }
}

Result<Tensor> DecoderModel::alloc(Backend& be, quant::GgmlType type, int64_t rows, int64_t cols,
                                   std::vector<std::unique_ptr<DeviceBuffer>>& owner) {
  const size_t row_bytes = static_cast<size_t>(cols) * 4;  // F32 and I32
  auto buf = be.alloc(static_cast<size_t>(rows) * row_bytes);
  if (!buf.ok()) return Error{buf.error()};
  Tensor t = tensor_of(**buf, type, rows, cols);
  owner.push_back(std::move(buf).value());
  return t;
}

// The `count` floats of t as host memory: t's own where the backend's memory is host-visible
// (after waiting for its operations), else a download into `staging`. Then the backend's status:
// a device backend reports the first failed operation of the pass here.
Result<std::span<float>> read_back(Backend& be, const Tensor& t, size_t count,
                                   std::vector<float>& staging) {
  std::span<float> out;
  if (auto* host = static_cast<float*>(t.host()); host != nullptr) {
    be.synchronize();
    out = std::span<float>(host, count);
  } else {
    staging.resize(count);
    be.download(t, staging.data());
    out = std::span<float>(staging);
  }
  if (Status st = be.status(); !st) return Error{st.error()};
  return out;
}

// The data section in one buffer, or cut at tensor starts into pieces of at most
// be.max_buffer_bytes() (an 8B model's 4.5 GB is more than many drivers allocate at once:
// maxMemoryAllocationSize is 2 GiB on lavapipe, 4 GiB on several GPU drivers). The pieces cover
// the whole section, so the device holds exactly its bytes.
Status DecoderModel::upload_weights(Backend& be) {
  if (weight_file_offsets_.empty()) {
    for (const Tensor* t : weights_) weight_file_offsets_.push_back(t->offset);
  }
  const std::span<const uint8_t> data = file_->data_section();
  const uint64_t cap = be.max_buffer_bytes();
  std::vector<size_t> starts(weight_file_offsets_);
  std::sort(starts.begin(), starts.end());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  std::vector<size_t> cuts = {0};  // piece i is [cuts[i], cuts[i + 1]), the last to the end
  for (size_t i = 0; i < starts.size(); ++i) {
    const size_t end = i + 1 < starts.size() ? starts[i + 1] : data.size();
    if (end - cuts.back() <= cap) continue;
    if (starts[i] > cuts.back()) cuts.push_back(starts[i]);
    if (end - cuts.back() > cap) {
      return Error{fmt::format(
          "a weight tensor of {} MiB (at byte {} of the model's data) is larger than one buffer "
          "the {} backend allocates ({} MiB); run it with --device cpu",
          (end - starts[i]) >> 20, starts[i], be.name(), cap >> 20)};
    }
  }
  weight_bufs_.clear();
  for (size_t i = 0; i < cuts.size(); ++i) {
    const size_t end = i + 1 < cuts.size() ? cuts[i + 1] : data.size();
    auto wb = be.upload_weights(data.subspan(cuts[i], end - cuts[i]));
    if (!wb.ok()) return Error{wb.error()};
    weight_bufs_.push_back(std::move(wb).value());
  }
  for (size_t i = 0; i < weights_.size(); ++i) {
    const size_t off = weight_file_offsets_[i];
    const auto piece =
        static_cast<size_t>(std::upper_bound(cuts.begin(), cuts.end(), off) - cuts.begin() - 1);
    weights_[i]->buffer = weight_bufs_[piece].get();
    weights_[i]->offset = off - cuts[piece];
  }
  // The matrices matmul reads (the token embeddings are only gathered from, unless tied to the
  // output, which is offered as output_).
  for (const Tensor* t : weights_) {
    if (t->rows > 1 && t != &tok_embd_) be.prepare_weight(*t);
  }
  return {};
}

Result<std::span<const float>> DecoderModel::logits_of(std::span<const int32_t> ids, Backend& be) {
  const planner::ModelGeometry& hp = geo_;
  const auto n = static_cast<int64_t>(ids.size());
  if (n == 0) return std::span<const float>();
  if (bound_backend_ != be.id() || ws_.x.empty()) return Error{"logits_of before a pass"};
  for (const int32_t id : ids) {
    if (id < 0 || id >= hp.n_vocab) {
      return Error{fmt::format("token id {} is outside the vocabulary [0, {})", id, hp.n_vocab)};
    }
  }
  if (ws_.extra_ids.rows < n) {  // grow to a power of two
    int64_t cap = 64;
    while (cap < n) cap *= 2;
    ws_.extra_bufs.clear();
    auto i = alloc(be, quant::GgmlType::I32, cap, 1, ws_.extra_bufs);
    auto r = alloc(be, quant::GgmlType::F32, cap, hp.n_embd, ws_.extra_bufs);
    auto l = alloc(be, quant::GgmlType::F32, 1, cap, ws_.extra_bufs);
    if (!i.ok() || !r.ok() || !l.ok()) {
      ws_.extra_bufs.clear();
      ws_.extra_ids = ws_.extra_rows = ws_.extra_logits = Tensor{};
      return Error{!i.ok() ? i.error() : !r.ok() ? r.error() : l.error()};
    }
    ws_.extra_ids = *i;
    ws_.extra_rows = *r;
    ws_.extra_logits = *l;
  }
  Tensor full = output_;  // a trimmed head is a slice of the first rows: the whole layer
  full.rows = hp.n_vocab;
  const Tensor idt = ws_.extra_ids.slice_rows(0, n);
  const Tensor rows = ws_.extra_rows.slice_rows(0, n);
  Tensor out = ws_.extra_logits;
  out.cols = n;
  be.upload(idt, ids.data());
  be.get_rows(full, idt, rows);
  be.matmul(rows, ws_.xn.slice_rows(0, 1), out, MatmulPath::kDecode);
  if (softcap_ > 0.0f) be.softcap(out, softcap_);
  auto result = read_back(be, out, static_cast<size_t>(n), host_extra_);
  if (!result.ok()) return Error{result.error()};
  return std::span<const float>(*result);
}

Status DecoderModel::bind(Backend& be) {
  if (bound_backend_ == be.id()) return {};
  bound_backend_ = 0;
  ws_ = Workspace{};
  for (const Tensor* t : weights_) {
    if (t->rows != 0 && !be.supports_weight_type(t->type)) {
      const auto n = std::count_if(weights_.begin(), weights_.end(), [&](const Tensor* u) {
        return u->rows != 0 && u->type == t->type;
      });
      return Error{fmt::format(
          "{} weight tensors of this model are {}, for which the {} backend has no kernel; run it "
          "with --device cpu",
          n, quant::type_name(t->type), be.name())};
    }
  }
  if (Status s = upload_weights(be); !s.ok()) return s;

  const planner::ModelGeometry& hp = geo_;
  const int64_t n = max_batch_;
  const int64_t q_dim = static_cast<int64_t>(hp.n_head) * hp.head_dim;
  const int64_t kv_dim = hp.n_head_kv() * hp.head_dim;
  const auto f32 = quant::GgmlType::F32;
  struct Slot {
    Tensor* t;
    quant::GgmlType type;
    int64_t cols;
  };
  std::vector<Slot> slots = {{&ws_.x, f32, hp.n_embd},
                             {&ws_.xn, f32, hp.n_embd},
                             {&ws_.proj, f32, hp.n_embd},
                             {&ws_.q, f32, q_dim},
                             {&ws_.attn, f32, q_dim},
                             {&ws_.k, f32, kv_dim},
                             {&ws_.v, f32, kv_dim},
                             {&ws_.gate, f32, hp.n_ff},
                             {&ws_.up, f32, hp.n_ff},
                             {&ws_.cs_g, f32, hp.n_rot},
                             {&ws_.ids, quant::GgmlType::I32, 1},
                             {&ws_.pos, quant::GgmlType::I32, 1}};
  if (spec_.sliding_window) slots.push_back({&ws_.cs_l, f32, hp.n_rot});
  for (const Slot& s : slots) {
    auto t = alloc(be, s.type, n, s.cols, ws_.buffers);
    if (!t.ok()) {
      ws_ = Workspace{};
      return Error{t.error()};
    }
    *s.t = *t;
  }
  auto logits = be.alloc(static_cast<size_t>(max_out_) * static_cast<size_t>(n_logits_) * 4);
  if (!logits.ok()) {
    ws_ = Workspace{};
    return Error{logits.error()};
  }
  ws_.logits_buf = std::move(logits).value();
  ws_.logits = tensor_of(*ws_.logits_buf, quant::GgmlType::F32, max_out_, n_logits_);
  bound_backend_ = be.id();
  return {};
}

Status DecoderModel::last_token_entropy(KvCache& kv, int il, int64_t pos, const Tensor& q,
                                        float scale, int64_t window,
                                        std::span<attention::HeadEntropy> out, Backend& be) const {
  const size_t n_head = static_cast<size_t>(geo_.n_head);
  if (out.size() != static_cast<size_t>(geo_.n_layer) * n_head) {
    return Error{
        fmt::format("attention entropy: {} values asked for, the model has {} layers x {} "
                    "heads",
                    out.size(), geo_.n_layer, n_head)};
  }
  const kv::HostKvBlocks blocks = kv.host_blocks(il, pos + 1);
  if (blocks.empty()) {
    return Error{
        "attention entropy is measured over KV blocks in host memory; this cache keeps "
        "none (run with --device cpu)"};
  }
  float *qp = nullptr, *unused = nullptr;
  if (Status st = host_rows(be, q, q, "queries", &qp, &unused); !st) return st;
  attention::attention_entropy(blocks, kv.geometry(), pos, qp, geo_.n_head, scale, window,
                               out.data() + static_cast<size_t>(il) * n_head);
  return {};
}

Result<std::span<float>> DecoderModel::forward_batch(std::span<const BatchSequence> seqs,
                                                     Backend& be) {
  const planner::ModelGeometry& hp = geo_;
  if (Status st = bind(be); !st) return Error{st.error()};
  if (Status st = plan_.prepare(seqs, hp.n_vocab, max_batch_); !st) return Error{st.error()};
  const int64_t n = plan_.n_tokens();
  const int64_t hd = hp.head_dim;
  const float embd_scale = std::sqrt(static_cast<float>(hp.n_embd));
  // Where the attention scale goes: into q (scale_q archs) or into the attention kernel.
  const float kernel_scale = spec_.scale_q ? 1.0f : attn_scale_;

  const Tensor x = ws_.x.slice_rows(0, n);
  const Tensor xn = ws_.xn.slice_rows(0, n);
  const Tensor q = ws_.q.slice_rows(0, n);
  const Tensor k = ws_.k.slice_rows(0, n);
  const Tensor v = ws_.v.slice_rows(0, n);
  const Tensor attn = ws_.attn.slice_rows(0, n);
  const Tensor proj = ws_.proj.slice_rows(0, n);
  const Tensor gate = ws_.gate.slice_rows(0, n);
  const Tensor up = ws_.up.slice_rows(0, n);
  const Tensor cs_g = ws_.cs_g.slice_rows(0, n);
  const Tensor cs_l = spec_.sliding_window ? ws_.cs_l.slice_rows(0, n) : Tensor{};
  const Tensor ids = ws_.ids.slice_rows(0, n);
  const Tensor pos = ws_.pos.slice_rows(0, n);

  be.upload(ids, plan_.tokens().data());
  be.upload(pos, plan_.positions().data());
  be.get_rows(tok_embd_, ids, x, spec_.embd_scale ? embd_scale : 1.0f);
  be.rope_cache(rope_global_, pos, cs_g);
  if (spec_.sliding_window) be.rope_cache(rope_local_, pos, cs_l);

  attn_seqs_.clear();
  for (size_t sq = 0; sq < seqs.size(); ++sq) {
    attn_seqs_.push_back({seqs[sq].kv, plan_.seq_row(sq),
                          static_cast<int64_t>(seqs[sq].tokens.size()), plan_.seq_pos(sq)});
  }
  for (int il = 0; il < hp.n_layer; ++il) {
    const Layer& l = layers_[static_cast<size_t>(il)];
    const int64_t window = hp.layers[static_cast<size_t>(il)].window;
    const RopeConfig& rope = window > 0 ? rope_local_ : rope_global_;
    const Tensor& cs = window > 0 ? cs_l : cs_g;
    be.rms_norm(x, l.attn_norm, xn, rms_eps_);
    plan_.mm(be, l.wq, xn, q);
    plan_.mm(be, l.wk, xn, k);
    plan_.mm(be, l.wv, xn, v);
    if (!l.bq.empty()) {
      be.add(q, l.bq);
      be.add(k, l.bk);
      be.add(v, l.bv);
    }
    if (!l.q_norm.empty()) {
      const Tensor qh = q.reshape(n * hp.n_head, hd);
      const Tensor kh = k.reshape(n * hp.n_head_kv(), hd);
      be.rms_norm(qh, l.q_norm, qh, rms_eps_);
      be.rms_norm(kh, l.k_norm, kh, rms_eps_);
    }
    be.rope(rope, cs, q, hp.n_head, hp.head_dim);
    be.rope(rope, cs, k, hp.n_head_kv(), hp.head_dim);
    if (spec_.scale_q) be.scale(q, attn_scale_);
    for (const attention::AttnSequence& s : attn_seqs_) {
      if (Status st =
              s.kv->write(il, s.pos0, k.slice_rows(s.row0, s.n), v.slice_rows(s.row0, s.n), be);
          !st) {
        return Error{st.error()};
      }
    }
    if (Status st = attn_runner_.run(attn_seqs_, il, q, attn, hp.n_head, kernel_scale, window, be);
        !st) {
      return Error{st.error()};
    }
    for (size_t sq = 0; sq < seqs.size(); ++sq) {
      if (seqs[sq].attn_entropy.empty()) continue;
      const attention::AttnSequence& s = attn_seqs_[sq];
      if (Status st =
              last_token_entropy(*s.kv, il, s.pos0 + s.n - 1, q.slice_rows(s.row0 + s.n - 1, 1),
                                 kernel_scale, window, seqs[sq].attn_entropy, be);
          !st) {
        return Error{st.error()};
      }
    }
    plan_.mm(be, l.wo, attn, proj);
    if (!l.attn_post_norm.empty()) be.rms_norm(proj, l.attn_post_norm, proj, rms_eps_);
    be.add(x, proj);
    be.rms_norm(x, l.ffn_norm, xn, rms_eps_);
    plan_.mm(be, l.w_gate, xn, gate);
    plan_.mm(be, l.w_up, xn, up);
    if (spec_.act == FfnActivation::kGelu) {
      be.gelu_mul(gate, up);
    } else {
      be.silu_mul(gate, up);
    }
    plan_.mm(be, l.w_down, gate, proj);
    if (!l.ffn_post_norm.empty()) be.rms_norm(proj, l.ffn_post_norm, proj, rms_eps_);
    be.add(x, proj);
  }

  const std::vector<int64_t>& out_rows = plan_.out_rows();
  const auto n_out = static_cast<int64_t>(out_rows.size());
  if (n_out == 0) return std::span<float>();
  // The logits rows' residuals, gathered and normalised.
  out_ids_.assign(out_rows.begin(), out_rows.end());
  const Tensor out_ids = ws_.ids.slice_rows(0, n_out);
  const Tensor xo = ws_.xn.slice_rows(0, n_out);
  be.upload(out_ids, out_ids_.data());
  be.get_rows(ws_.x, out_ids, xo);
  be.rms_norm(xo, output_norm_, xo, rms_eps_);
  if (ws_.logits.rows < n_out) {
    auto buf = be.alloc(static_cast<size_t>(n_out) * static_cast<size_t>(n_logits_) * 4);
    if (!buf.ok()) return Error{buf.error()};
    ws_.logits_buf = std::move(buf).value();
    ws_.logits = tensor_of(*ws_.logits_buf, quant::GgmlType::F32, n_out, n_logits_);
  }
  const Tensor logits = ws_.logits.slice_rows(0, n_out);
  plan_.mm_out(be, output_, xo, logits);
  if (softcap_ > 0.0f) be.softcap(logits, softcap_);
  const size_t count = static_cast<size_t>(n_out) * static_cast<size_t>(n_logits_);
  return read_back(be, logits, count, host_logits_);
}

}  // namespace

std::unique_ptr<Model> make_decoder_model(const ArchSpec& spec,
                                          std::unique_ptr<gguf::GgufFile> file,
                                          const LoadOptions& opts) {
  return std::make_unique<DecoderModel>(spec, std::move(file), opts);
}

}  // namespace bie
