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

const gguf::TensorInfo& Binder::require(const std::string& name) const {
  const gguf::TensorInfo* t = f_.find_tensor(name);
  if (t == nullptr) throw LoadError{fmt::format("missing tensor '{}'", name)};
  return *t;
}

WeightView Binder::matrix(const std::string& name, int64_t n_in, int64_t n_out) {
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
  WeightView w;
  w.type = type;
  w.n_in = n_in;
  w.n_out = n_out;
  w.data = f_.tensor_data(t);
  w.row_bytes = quant::row_size(type, n_in);
  return w;
}

const float* Binder::vector_f32(const std::string& name, int64_t n) {
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
  // GGUF aligns tensor data (32 bytes by default), so the cast is aligned for float.
  return reinterpret_cast<const float*>(f_.tensor_data(t));
}

}  // namespace bie::model_loader
