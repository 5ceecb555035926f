#include "model/model_loader.h"

#include <fmt/format.h>

#include <limits>

#include "bie/gguf/ggml_type_info.h"
#include "bie/quant/traits.h"
#include "bie/quant/types.h"

namespace bie::model_loader {

int32_t Binder::require_int(const std::string& key) const {
  const auto v = optional_int(key);
  if (!v) throw LoadError{fmt::format("missing or invalid metadata '{}'", key)};
  return *v;
}

std::optional<int32_t> Binder::optional_int(const std::string& key) const {
  const auto v = f_.get_int(key);
  if (!v) {
    if (f_.find(key) != nullptr)
      throw LoadError{fmt::format("metadata '{}' is not an integer", key)};
    return std::nullopt;
  }
  if (*v <= 0 || *v > std::numeric_limits<int32_t>::max()) {
    throw LoadError{fmt::format("metadata '{}' = {} is out of range", key, *v)};
  }
  return static_cast<int32_t>(*v);
}

std::optional<float> Binder::optional_float(const std::string& key) const {
  const auto v = f_.get_float(key);
  if (!v && f_.find(key) != nullptr)
    throw LoadError{fmt::format("metadata '{}' is not a number", key)};
  if (!v) return std::nullopt;
  return static_cast<float>(*v);
}

size_t Binder::data_offset(const gguf::TensorInfo& t) const {
  return static_cast<size_t>(f_.tensor_data(t) - f_.data_section().data());
}

const gguf::TensorInfo& Binder::require(const std::string& name) const {
  const gguf::TensorInfo* t = f_.find_tensor(name);
  if (t == nullptr) throw LoadError{fmt::format("missing tensor '{}'", name)};
  return *t;
}

Tensor Binder::matrix(const std::string& name, int64_t n_in, int64_t n_out) {
  const gguf::TensorInfo& t = require(name);
  if (t.n_dims != 2 || t.ne[0] != n_in || t.ne[1] != n_out) {
    throw LoadError{fmt::format("tensor '{}' has shape [{}, {}], expected [{}, {}]", name, t.ne[0],
                                t.ne[1], n_in, n_out)};
  }
  const auto type = static_cast<quant::GgmlType>(t.type);
  const quant::TypeTraits* tr = quant::traits(type);
  if (tr == nullptr || tr->vec_dot == nullptr) {
    const auto info = gguf::ggml_type_info(t.type);
    throw LoadError{fmt::format(
        "tensor '{}' has type {}, which BIE cannot compute with (supported: f32, f16, bf16, q4_0, "
        "q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, q5_K, q6_K)",
        name, info ? std::string(info->name) : std::to_string(t.type))};
  }
  bound_bytes_ += t.n_bytes;
  Tensor w;
  w.offset = data_offset(t);
  w.type = type;
  w.rows = n_out;
  w.cols = n_in;
  w.row_bytes = quant::row_size(type, n_in);
  return w;
}

Tensor Binder::vector_f32(const std::string& name, int64_t n) {
  const gguf::TensorInfo& t = require(name);
  if (t.n_elements() != n || t.ne[0] != n) {
    throw LoadError{
        fmt::format("tensor '{}' has {} elements, expected {}", name, t.n_elements(), n)};
  }
  if (t.type != 0) {
    const auto info = gguf::ggml_type_info(t.type);
    throw LoadError{fmt::format("tensor '{}' has type {}, expected f32", name,
                                info ? std::string(info->name) : std::to_string(t.type))};
  }
  bound_bytes_ += t.n_bytes;
  // GGUF aligns tensor data (32 bytes by default), so the view is aligned for float.
  Tensor v;
  v.offset = data_offset(t);
  v.type = quant::GgmlType::F32;
  v.rows = 1;
  v.cols = n;
  v.row_bytes = static_cast<size_t>(n) * sizeof(float);
  return v;
}

planner::ModelGeometry read_transformer_geometry(const gguf::GgufFile& f, const Binder& b,
                                                 int32_t default_ctx) {
  const std::string a = f.architecture() + ".";
  // The integer keys the decoder needs, present and > 0, one value for every layer.
  for (const char* key : {"block_count", "embedding_length", "feed_forward_length",
                          "attention.head_count"}) {
    (void)b.require_int(a + key);
  }
  const std::optional<int32_t> n_head_kv = b.optional_int(a + "attention.head_count_kv");
  auto r = planner::geometry_from_gguf(f);
  if (!r.ok()) throw LoadError{r.error()};
  planner::ModelGeometry g = std::move(r).value();
  if (g.mla || g.is_moe()) {
    throw LoadError{fmt::format("{}: {} layers are not supported by the decoder",
                                g.arch, g.mla ? "MLA" : "mixture-of-experts")};
  }
  const int64_t hkv = n_head_kv.value_or(static_cast<int32_t>(g.n_head));
  if (hkv > g.n_head || g.n_head % hkv != 0) {
    throw LoadError{
        fmt::format("head_count {} is not a multiple of head_count_kv {}", g.n_head, hkv)};
  }
  if (g.head_dim % 2 != 0 || g.head_dim > 512) {
    throw LoadError{
        fmt::format("head dimension {} is unsupported (must be even, <= 512)", g.head_dim)};
  }
  if (auto vl = b.optional_int(a + "attention.value_length"); vl && *vl != g.head_dim) {
    throw LoadError{"key_length != value_length is not supported for this architecture"};
  }
  for (planner::LayerKv& l : g.layers) l.head_dim_v = static_cast<int>(g.head_dim);
  if (g.n_rot > g.head_dim || g.n_rot % 2 != 0) {
    throw LoadError{
        fmt::format("rope.dimension_count {} is invalid for head dim {}", g.n_rot, g.head_dim)};
  }
  if (g.n_ctx_train <= 0) g.n_ctx_train = default_ctx;
  if (f.find_tensor("token_embd.weight") == nullptr) {
    throw LoadError{"missing tensor 'token_embd.weight'"};
  }
  return g;
}

float read_rms_eps(const gguf::GgufFile& f, const Binder& b, float default_eps) {
  return b.optional_float(f.architecture() + ".attention.layer_norm_rms_epsilon")
      .value_or(default_eps);
}

RopeConfig read_rope(const gguf::GgufFile& f, const Binder& b, const planner::ModelGeometry& g) {
  const std::string a = f.architecture() + ".";
  RopeConfig rope;
  rope.n_rot = static_cast<int>(g.n_rot);
  rope.freq_base = b.optional_float(a + "rope.freq_base").value_or(10000.0f);
  if (auto st = f.get_string(a + "rope.scaling.type")) {
    if (*st == "linear") {
      const float factor = b.optional_float(a + "rope.scaling.factor").value_or(1.0f);
      if (!(factor > 0.0f)) throw LoadError{"rope.scaling.factor must be > 0"};
      rope.freq_scale = 1.0f / factor;
    } else if (*st != "none") {
      throw LoadError{
          fmt::format("rope scaling type '{}' is not supported yet (supported: none, linear)",
                      std::string(*st))};
    }
  }
  return rope;
}

}  // namespace bie::model_loader
