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
#include "bie/planner/model_geometry.h"

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

// The decoder-only transformer's geometry, read by the planner's one reader of a file's shape
// (planner::geometry_from_gguf: widths, heads, head dim = key_length, rotated dims, vocabulary =
// token_embd rows, tied output, per-layer KV heads and sliding windows) and checked for what the
// decoder computes: every layer one head count, GQA (head_count a multiple of head_count_kv),
// head dim even, <= 512 and = value_length, rotated dims even and <= head dim. The context is
// default_ctx where the file is silent. Throws LoadError naming the key.
[[nodiscard]] planner::ModelGeometry read_transformer_geometry(const gguf::GgufFile& f,
                                                               const Binder& b,
                                                               int32_t default_ctx);

// RMS epsilon (default_eps where the file is silent).
[[nodiscard]] float read_rms_eps(const gguf::GgufFile& f, const Binder& b, float default_eps);

// RoPE of the global layers: rotated dims (the geometry's), base, and linear scaling (other
// scaling types are refused with a LoadError).
[[nodiscard]] RopeConfig read_rope(const gguf::GgufFile& f, const Binder& b,
                                   const planner::ModelGeometry& g);

}  // namespace bie::model_loader
