// A tiny llama-family model with random f32 weights, written as a GGUF file, plus a naive
// double-precision reference forward pass — the exact formulas, to hold the engine's forward to.
#pragma once

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "support/gguf_builder.h"

namespace bie::test {

struct TinyLlama {
  std::string arch = "llama";  // "qwen2" adds QKV biases and uses the NEOX rope layout
  int n_vocab = 40, n_embd = 24, n_head = 4, n_head_kv = 2, n_ff = 40, n_layer = 2;
  float rope_base = 10000.0f, eps = 1e-5f;
  bool tied = true;
  uint64_t seed = 5;

  int head_dim() const { return n_embd / n_head; }
  bool neox() const { return arch == "qwen2"; }

  struct Weights {
    std::vector<float> tok_embd, out_norm, output;
    struct Layer {
      std::vector<float> attn_norm, wq, wk, wv, wo, bq, bk, bv, ffn_norm, gate, up, down;
    };
    std::vector<Layer> layers;
  } w;

  std::vector<float> rnd(size_t n, float scale, std::mt19937_64& rng) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
  }

  void make_weights() {
    std::mt19937_64 rng(seed);
    const size_t E = n_embd, Q = n_head * head_dim(), K = n_head_kv * head_dim(), F = n_ff;
    w.tok_embd = rnd(n_vocab * E, 1.0f, rng);
    w.out_norm = rnd(E, 0.1f, rng);
    for (float& x : w.out_norm) x += 1.0f;
    if (!tied) w.output = rnd(n_vocab * E, 0.3f, rng);
    w.layers.resize(n_layer);
    for (auto& l : w.layers) {
      l.attn_norm = rnd(E, 0.1f, rng);
      for (float& x : l.attn_norm) x += 1.0f;
      l.wq = rnd(Q * E, 0.3f, rng);
      l.wk = rnd(K * E, 0.3f, rng);
      l.wv = rnd(K * E, 0.3f, rng);
      l.wo = rnd(E * Q, 0.3f, rng);
      if (arch == "qwen2") {
        l.bq = rnd(Q, 0.2f, rng);
        l.bk = rnd(K, 0.2f, rng);
        l.bv = rnd(K, 0.2f, rng);
      }
      l.ffn_norm = rnd(E, 0.1f, rng);
      for (float& x : l.ffn_norm) x += 1.0f;
      l.gate = rnd(F * E, 0.3f, rng);
      l.up = rnd(F * E, 0.3f, rng);
      l.down = rnd(E * F, 0.3f, rng);
    }
  }

  GgufBuilder gguf() {
    if (w.layers.empty()) make_weights();
    GgufBuilder g;
    const std::string a = arch + ".";
    g.kv_str("general.architecture", arch);
    g.kv_u32(a + "block_count", n_layer);
    g.kv_u32(a + "context_length", 256);
    g.kv_u32(a + "embedding_length", n_embd);
    g.kv_u32(a + "feed_forward_length", n_ff);
    g.kv_u32(a + "attention.head_count", n_head);
    g.kv_u32(a + "attention.head_count_kv", n_head_kv);
    g.kv_f32(a + "attention.layer_norm_rms_epsilon", eps);
    g.kv_f32(a + "rope.freq_base", rope_base);
    const int64_t E = n_embd, Q = n_head * head_dim(), K = n_head_kv * head_dim(), F = n_ff;
    g.tensor_f32("token_embd.weight", {E, n_vocab}, w.tok_embd);
    g.tensor_f32("output_norm.weight", {E}, w.out_norm);
    if (!tied) g.tensor_f32("output.weight", {E, n_vocab}, w.output);
    for (int il = 0; il < n_layer; ++il) {
      const auto& l = w.layers[il];
      const std::string p = "blk." + std::to_string(il) + ".";
      g.tensor_f32(p + "attn_norm.weight", {E}, l.attn_norm);
      g.tensor_f32(p + "attn_q.weight", {E, Q}, l.wq);
      g.tensor_f32(p + "attn_k.weight", {E, K}, l.wk);
      g.tensor_f32(p + "attn_v.weight", {E, K}, l.wv);
      if (!l.bq.empty()) {
        g.tensor_f32(p + "attn_q.bias", {Q}, l.bq);
        g.tensor_f32(p + "attn_k.bias", {K}, l.bk);
        g.tensor_f32(p + "attn_v.bias", {K}, l.bv);
      }
      g.tensor_f32(p + "attn_output.weight", {Q, E}, l.wo);
      g.tensor_f32(p + "ffn_norm.weight", {E}, l.ffn_norm);
      g.tensor_f32(p + "ffn_gate.weight", {E, F}, l.gate);
      g.tensor_f32(p + "ffn_up.weight", {E, F}, l.up);
      g.tensor_f32(p + "ffn_down.weight", {F, E}, l.down);
    }
    return g;
  }

  // y[o] = sum_i W[o * n_in + i] x[i]
  static std::vector<double> mv(const std::vector<float>& W, const std::vector<double>& x,
                                size_t n_out) {
    std::vector<double> y(n_out, 0.0);
    const size_t n_in = x.size();
    for (size_t o = 0; o < n_out; ++o)
      for (size_t i = 0; i < n_in; ++i) y[o] += static_cast<double>(W[o * n_in + i]) * x[i];
    return y;
  }
  std::vector<double> rmsnorm(const std::vector<double>& x, const std::vector<float>& wt) const {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double s = 1.0 / std::sqrt(ss / x.size() + eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * s * wt[i];
    return y;
  }
  void rope(std::vector<double>& v, int n_heads, int pos) const {
    const int hd = head_dim();
    for (int h = 0; h < n_heads; ++h) {
      for (int i = 0; i < hd / 2; ++i) {
        const double theta = pos * std::pow(static_cast<double>(rope_base), -2.0 * i / hd);
        const int a = neox() ? h * hd + i : h * hd + 2 * i;
        const int b = neox() ? h * hd + i + hd / 2 : h * hd + 2 * i + 1;
        const double x0 = v[a], x1 = v[b];
        v[a] = x0 * std::cos(theta) - x1 * std::sin(theta);
        v[b] = x0 * std::sin(theta) + x1 * std::cos(theta);
      }
    }
  }

  // Logits after each token of `tokens` (full recompute, causal).
  std::vector<std::vector<double>> reference_logits(const std::vector<int>& tokens) {
    if (w.layers.empty()) make_weights();
    const int hd = head_dim(), E = n_embd, Q = n_head * hd, K = n_head_kv * hd,
              G = n_head / n_head_kv;
    const size_t T = tokens.size();
    std::vector<std::vector<double>> x(T, std::vector<double>(E));
    for (size_t t = 0; t < T; ++t)
      for (int i = 0; i < E; ++i) x[t][i] = w.tok_embd[tokens[t] * E + i];
    for (int il = 0; il < n_layer; ++il) {
      const auto& l = w.layers[il];
      std::vector<std::vector<double>> q(T), k(T), v(T);
      for (size_t t = 0; t < T; ++t) {
        const auto xn = rmsnorm(x[t], l.attn_norm);
        q[t] = mv(l.wq, xn, Q);
        k[t] = mv(l.wk, xn, K);
        v[t] = mv(l.wv, xn, K);
        if (!l.bq.empty()) {
          for (int i = 0; i < Q; ++i) q[t][i] += l.bq[i];
          for (int i = 0; i < K; ++i) k[t][i] += l.bk[i], v[t][i] += l.bv[i];
        }
        rope(q[t], n_head, static_cast<int>(t));
        rope(k[t], n_head_kv, static_cast<int>(t));
      }
      for (size_t t = 0; t < T; ++t) {
        std::vector<double> att(Q, 0.0);
        for (int h = 0; h < n_head; ++h) {
          const int g = h / G;
          std::vector<double> s(t + 1);
          double mx = -1e300;
          for (size_t j = 0; j <= t; ++j) {
            double d = 0;
            for (int i = 0; i < hd; ++i) d += q[t][h * hd + i] * k[j][g * hd + i];
            s[j] = d / std::sqrt(static_cast<double>(hd));
            mx = std::max(mx, s[j]);
          }
          double sum = 0;
          for (double& e : s) sum += (e = std::exp(e - mx));
          for (size_t j = 0; j <= t; ++j)
            for (int i = 0; i < hd; ++i) att[h * hd + i] += s[j] / sum * v[j][g * hd + i];
        }
        const auto o = mv(l.wo, att, E);
        for (int i = 0; i < E; ++i) x[t][i] += o[i];
        const auto xn = rmsnorm(x[t], l.ffn_norm);
        auto gt = mv(l.gate, xn, n_ff);
        const auto up = mv(l.up, xn, n_ff);
        for (int i = 0; i < n_ff; ++i) gt[i] = gt[i] / (1.0 + std::exp(-gt[i])) * up[i];
        const auto d = mv(l.down, gt, E);
        for (int i = 0; i < E; ++i) x[t][i] += d[i];
      }
    }
    std::vector<std::vector<double>> out;
    for (size_t t = 0; t < T; ++t)
      out.push_back(mv(tied ? w.tok_embd : w.output, rmsnorm(x[t], w.out_norm), n_vocab));
    return out;
  }
};

}  // namespace bie::test
