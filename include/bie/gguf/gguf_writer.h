// GgufWriter: writes a GGUF v3 file — metadata, tensor index, then tensor data streamed tensor by
// tensor in chunks from a caller's fill function, so multi-GB files never sit in memory. Offsets
// and sizes come from ggml_type_info, exactly as the reader checks them. Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "bie/common/result.h"
#include "bie/gguf/gguf_file.h"

namespace bie::gguf {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> ne;  // ne[0] innermost, as in TensorInfo
  uint32_t type = 0;        // ggml type id
  uint64_t n_bytes = 0;     // filled in by add_tensor
};

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t alignment = 32) : alignment_(alignment) {}

  void add_u32(const std::string& key, uint32_t v);
  void add_i32(const std::string& key, int32_t v);
  void add_f32(const std::string& key, float v);
  void add_bool(const std::string& key, bool v);
  void add_string(const std::string& key, const std::string& v);
  // Any value a GgufFile holds (copying metadata from another file), arrays included.
  void add_value(const std::string& key, ValueType type, const Value& v);

  // Errors on unknown type ids and rows that are not whole blocks.
  [[nodiscard]] Status add_tensor(const std::string& name, std::vector<int64_t> ne, uint32_t type);
  [[nodiscard]] const std::vector<TensorSpec>& tensors() const { return tensors_; }
  // Size of the file write() will produce.
  [[nodiscard]] uint64_t file_bytes() const;

  // Fills out[] with bytes [offset, offset + out.size()) of tensor `index`; chunks are whole
  // blocks.
  using FillFn =
      std::function<Status(size_t index, const TensorSpec& t, uint64_t offset, std::span<uint8_t>)>;
  // Writes the file; fill is called for every tensor in order, chunk by chunk (~chunk_bytes).
  [[nodiscard]] Status write(const std::string& path, const FillFn& fill,
                             uint64_t chunk_bytes = uint64_t{8} << 20) const;

 private:
  void begin_kv(const std::string& key, ValueType type);
  // Header, metadata and tensor index, padded to the data section's alignment.
  [[nodiscard]] std::vector<uint8_t> header() const;
  void put_value(ValueType type, const Value& v);

  uint32_t alignment_;
  uint64_t n_kv_ = 0;
  std::vector<uint8_t> meta_;
  std::vector<TensorSpec> tensors_;
};

}  // namespace bie::gguf
