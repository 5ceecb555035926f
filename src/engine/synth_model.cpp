#include "bie/engine/synth_model.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <span>
#include <tuple>
#include <vector>

#include "bie/gguf/gguf_file.h"
#include "bie/gguf/gguf_writer.h"
#include "bie/quant/blocks.h"
#include "bie/quant/fp16.h"
#include "bie/quant/types.h"

namespace bie {

namespace {

using gguf::Array;
using gguf::Value;
using gguf::ValueType;

// splitmix64: seeds a stream per (tensor, offset) so the bytes do not depend on chunking.
uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform random bytes.
void random_bytes(uint64_t& s, uint8_t* p, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t r = splitmix(s);
    std::memcpy(p + i, &r, 8);
  }
  if (i < n) {
    const uint64_t r = splitmix(s);
    std::memcpy(p + i, &r, n - i);
  }
}

// Q4_K with every group's 6-bit scale and min = 32 and uniform 4-bit quants: x = d*32*q - dmin*32,
// q uniform on [0, 15] (mean 7.5, std 4.61). dmin = 7.5 d centres the weights on 0 and
// d = std / (32 * 4.61) gives them the asked-for standard deviation.
void fill_q4_k(uint64_t& s, float std_dev, std::span<uint8_t> out) {
  const float d = std_dev / (32.0f * std::sqrt(255.0f / 12.0f));
  quant::BlockQ4_K proto{};
  proto.d = quant::fp32_to_fp16(d);
  proto.dmin = quant::fp32_to_fp16(7.5f * d);
  // 6-bit value 32 = 0b10'0000 for all 8 scales and mins: bytes 0..7 hold the low six bits of
  // scales/mins 0..3 plus the high two bits of scales/mins 4..7; bytes 8..11 their low nibbles (0).
  for (int j = 0; j < 8; ++j) proto.scales[j] = 0xA0;
  const size_t nb = out.size() / sizeof(quant::BlockQ4_K);
  for (size_t b = 0; b < nb; ++b) {
    random_bytes(s, proto.qs, sizeof proto.qs);
    std::memcpy(out.data() + b * sizeof proto, &proto, sizeof proto);
  }
}

// Q8_0: int8 quants uniform on [-128, 127] (std 73.9), d = std / 73.9.
void fill_q8_0(uint64_t& s, float std_dev, std::span<uint8_t> out) {
  quant::BlockQ8_0 proto{};
  proto.d = quant::fp32_to_fp16(std_dev / 73.9f);
  const size_t nb = out.size() / sizeof(quant::BlockQ8_0);
  for (size_t b = 0; b < nb; ++b) {
    random_bytes(s, reinterpret_cast<uint8_t*>(proto.qs), sizeof proto.qs);
    std::memcpy(out.data() + b * sizeof proto, &proto, sizeof proto);
  }
}

// Copies the tokenizer.* metadata of `src`, the token list (and its scores and types) padded with
// unused placeholders up to n_vocab.
Result<int64_t> copy_tokenizer(const std::string& src, int64_t n_vocab, gguf::GgufWriter& w) {
  auto f = gguf::GgufFile::open(src);
  if (!f) return Error{fmt::format("tokenizer source {}: {}", src, f.error())};
  const Array* tokens = (*f)->get_array("tokenizer.ggml.tokens");
  if (tokens == nullptr) return Error{fmt::format("{} has no tokenizer.ggml.tokens", src)};
  const auto n_real = static_cast<int64_t>(tokens->items.size());
  if (n_real > n_vocab) {
    return Error{
        fmt::format("the tokenizer of {} has {} tokens, more than the model's vocabulary {}", src,
                    n_real, n_vocab)};
  }
  for (const gguf::KeyValue& kv : (*f)->metadata()) {
    if (!kv.key.starts_with("tokenizer.")) continue;
    const bool padded = kv.key == "tokenizer.ggml.tokens" || kv.key == "tokenizer.ggml.scores" ||
                        kv.key == "tokenizer.ggml.token_type";
    if (!padded) {
      w.add_value(kv.key, kv.type, kv.value);
      continue;
    }
    const auto& a = *std::get<std::shared_ptr<const Array>>(kv.value);
    if (static_cast<int64_t>(a.items.size()) != n_real) {
      return Error{
          fmt::format("{}: {} has {} entries for {} tokens", src, kv.key, a.items.size(), n_real)};
    }
    auto out = std::make_shared<Array>(a);
    for (int64_t i = n_real; i < n_vocab; ++i) {
      if (kv.key == "tokenizer.ggml.tokens") {
        out->items.emplace_back(fmt::format("<|bie_unused_{}|>", i));
      } else if (a.elem_type == ValueType::kFloat32) {
        out->items.emplace_back(-1e9f);
      } else if (a.elem_type == ValueType::kInt32) {
        out->items.emplace_back(int32_t{5});  // llama_token_type UNUSED
      } else {
        return Error{fmt::format("{}: {} has an unexpected element type", src, kv.key)};
      }
    }
    w.add_value(kv.key, ValueType::kArray, std::shared_ptr<const Array>(out));
  }
  return n_real;
}

}  // namespace

Result<SynthResult> write_synthetic_model(const std::string& path, const SynthOptions& o) {
  const planner::ModelGeometry& g = o.geometry;
  if (g.mla || g.moe.n_expert > 0 || g.n_swa_layers() > 0 || g.layers.empty()) {
    return Error{fmt::format(
        "{}: only dense llama-family models with global attention can be synthesised", o.label)};
  }
  const int64_t n_head_kv = g.layers[0].n_head_kv;
  for (const planner::LayerKv& l : g.layers) {
    if (l.n_head_kv != n_head_kv || l.head_dim_k != g.head_dim || l.head_dim_v != g.head_dim) {
      return Error{fmt::format("{}: layers of different KV shapes are not supported", o.label)};
    }
  }
  quant::GgmlType wt;
  if (o.weights == "Q4_K" || o.weights == "q4_K" || o.weights == "q4_k") {
    wt = quant::GgmlType::Q4_K;
  } else if (o.weights == "Q8_0" || o.weights == "q8_0") {
    wt = quant::GgmlType::Q8_0;
  } else {
    return Error{fmt::format("--weights {}: supported are Q4_K and Q8_0", o.weights)};
  }

  gguf::GgufWriter w;
  const std::string a = "llama.";
  w.add_string("general.architecture", "llama");
  w.add_string("general.name", fmt::format("{} (synthetic, random weights)", o.label));
  w.add_bool(kSyntheticKey, true);
  w.add_string("bie.synthetic.preset", o.label);
  w.add_string("bie.synthetic.note",
               "random weights of real geometry: for memory and speed measurements, never quality");
  w.add_u32(a + "context_length", static_cast<uint32_t>(g.n_ctx_train));
  w.add_u32(a + "embedding_length", static_cast<uint32_t>(g.n_embd));
  w.add_u32(a + "block_count", static_cast<uint32_t>(g.n_layer));
  w.add_u32(a + "feed_forward_length", static_cast<uint32_t>(g.n_ff));
  w.add_u32(a + "attention.head_count", static_cast<uint32_t>(g.n_head));
  w.add_u32(a + "attention.head_count_kv", static_cast<uint32_t>(n_head_kv));
  w.add_u32(a + "attention.key_length", static_cast<uint32_t>(g.head_dim));
  w.add_u32(a + "attention.value_length", static_cast<uint32_t>(g.head_dim));
  w.add_u32(a + "rope.dimension_count", static_cast<uint32_t>(g.head_dim));
  w.add_f32(a + "rope.freq_base", o.rope_freq_base);
  w.add_f32(a + "attention.layer_norm_rms_epsilon", 1e-5f);
  SynthResult r;
  if (!o.tokenizer_from.empty()) {
    auto n = copy_tokenizer(o.tokenizer_from, g.n_vocab, w);
    if (!n) return Error{n.error()};
    r.tokenizer_tokens = *n;
    r.placeholder_tokens = g.n_vocab - *n;
  }

  const auto t = static_cast<uint32_t>(wt);
  const uint32_t f32 = 0;
  const int64_t E = g.n_embd, Q = g.n_head * g.head_dim, K = n_head_kv * g.head_dim, F = g.n_ff;
  const auto add = [&](const std::string& name, std::vector<int64_t> ne, uint32_t type) {
    return w.add_tensor(name, std::move(ne), type);
  };
  // llama.cpp's order: embeddings, output, then the layers.
  if (Status s = add("token_embd.weight", {E, g.n_vocab}, t); !s) return Error{s.error()};
  if (Status s = add("output_norm.weight", {E}, f32); !s) return Error{s.error()};
  if (!g.tied_embeddings) {
    if (Status s = add("output.weight", {E, g.n_vocab}, t); !s) return Error{s.error()};
  }
  for (int64_t il = 0; il < g.n_layer; ++il) {
    const std::string p = fmt::format("blk.{}.", il);
    for (const auto& [name, ne, type] :
         std::vector<std::tuple<std::string, std::vector<int64_t>, uint32_t>>{
             {"attn_norm.weight", {E}, f32},
             {"attn_q.weight", {E, Q}, t},
             {"attn_k.weight", {E, K}, t},
             {"attn_v.weight", {E, K}, t},
             {"attn_output.weight", {Q, E}, t},
             {"ffn_norm.weight", {E}, f32},
             {"ffn_gate.weight", {E, F}, t},
             {"ffn_up.weight", {E, F}, t},
             {"ffn_down.weight", {F, E}, t},
         }) {
      if (Status s = add(p + name, ne, type); !s) return Error{s.error()};
    }
  }

  r.file_bytes = w.file_bytes();
  r.n_tensors = static_cast<int64_t>(w.tensors().size());
  for (const gguf::TensorSpec& ts : w.tensors()) r.weight_bytes += ts.n_bytes;
  uint64_t done = 0;
  const float std_dev = o.weight_std;
  const uint64_t seed = o.seed;
  const auto fill = [&](size_t i, const gguf::TensorSpec& ts, uint64_t off,
                        std::span<uint8_t> out) -> Status {
    uint64_t s = seed ^ (static_cast<uint64_t>(i) << 40) ^ off;
    splitmix(s);
    if (ts.type == f32) {
      const float one = 1.0f;  // RMSNorm gains
      for (size_t k = 0; k + 4 <= out.size(); k += 4) std::memcpy(out.data() + k, &one, 4);
    } else if (ts.type == static_cast<uint32_t>(quant::GgmlType::Q4_K)) {
      fill_q4_k(s, std_dev, out);
    } else {
      fill_q8_0(s, std_dev, out);
    }
    done += out.size();
    if (o.progress) o.progress(done, r.weight_bytes);
    return {};
  };
  if (Status s = w.write(path, fill); !s) return Error{s.error()};
  return r;
}

}  // namespace bie
