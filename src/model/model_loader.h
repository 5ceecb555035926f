// Shared helpers for architecture loaders: reading hyper-parameters with clear errors and
// binding weight tensors by name with their expected shape and a computable type.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bie/backend/backend.h"
#include "bie/common/result.h"
#include "bie/gguf/gguf_file.h"
#include "bie/model/model.h"

namespace bie::model_loader {

// Thrown inside loaders, turned into an Error by load_model(); never escapes the library.
struct LoadError {
  std::string message;
};

class Binder {
 public:
  explicit Binder(const gguf::GgufFile& f) : f_(f) {}

  // "{arch}.{key}" as an integer > 0; throws LoadError if absent or out of range.
  int32_t require_int(const std::string& key) const;
  std::optional<int32_t> optional_int(const std::string& key) const;
  std::optional<float> optional_float(const std::string& key) const;

  // A matmul weight [n_in, n_out] (ne0 = n_in) of any computable type, as a tensor view of the
  // file's data section (offset from its start; the buffer is set when the weights are uploaded).
  Tensor matrix(const std::string& name, int64_t n_in, int64_t n_out);
  // An f32 vector of length n (norm weights, biases): F32 [1, n], like matrix().
  Tensor vector_f32(const std::string& name, int64_t n);
  [[nodiscard]] bool has(const std::string& name) const { return f_.find_tensor(name) != nullptr; }

  [[nodiscard]] uint64_t bound_bytes() const { return bound_bytes_; }

 private:
  const gguf::TensorInfo& require(const std::string& name) const;
  [[nodiscard]] size_t data_offset(const gguf::TensorInfo& t) const;

  const gguf::GgufFile& f_;
  uint64_t bound_bytes_ = 0;
};

// The decoder-only transformer hyper-parameters every architecture reads the same way: name,
// layers, widths, heads (GQA checked), head dim (key_length; even, <= 512, = value_length), RMS
// epsilon, RoPE base, rotated dims and linear RoPE scaling, vocabulary (token_embd rows) and a
// tied output. Defaults where the file is silent: context default_ctx, epsilon default_eps.
// Throws LoadError naming the key.
void read_transformer_hparams(const gguf::GgufFile& f, const Binder& b, ModelHParams& hp,
                              int32_t default_ctx, float default_eps);

}  // namespace bie::model_loader
