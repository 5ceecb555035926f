// GgufFile: a read-only, memory-mapped GGUF (v2/v3) model file — metadata, tensor index and
// tensor data views. Every count, length and offset is checked against the file before use, so a
// truncated or hostile file yields an Error naming what is wrong, never a crash, hang or huge
// allocation. Immutable after open(); safe to read from many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "bie/common/result.h"

namespace bie::gguf {

enum class ValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

[[nodiscard]] std::string_view value_type_name(ValueType t);

struct Array;

// One metadata value. Integers keep their declared width; use the GgufFile getters to read
// them without caring which width a writer chose.
using Value = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool,
                           std::string, std::shared_ptr<const Array>, uint64_t, int64_t, double>;

struct Array {
  ValueType elem_type;
  std::vector<Value> items;
};

struct KeyValue {
  std::string key;
  ValueType type;
  Value value;
};

constexpr int kMaxDims = 4;

struct TensorInfo {
  std::string name;
  int n_dims = 0;
  int64_t ne[kMaxDims] = {1, 1, 1, 1};  // ne[0] is the contiguous (innermost) dimension
  uint32_t type = 0;                    // ggml type id
  uint64_t offset = 0;                  // relative to the data section
  uint64_t n_bytes = 0;                 // computed from ne and the type's block layout

  [[nodiscard]] int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

// Resource limits applied while parsing, so hostile counts fail fast.
struct ParseLimits {
  uint64_t max_string_bytes = 1ull << 24;  // 16 MiB: largest chat templates are ~100 KiB
  int max_array_depth = 8;
  uint64_t max_tensors = 1ull << 20;
  uint64_t max_kv = 1ull << 20;
};

class GgufFile {
 public:
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  // Maps and parses `path`. Tensor data is not read.
  static Result<std::unique_ptr<GgufFile>> open(const std::string& path, ParseLimits limits = {});
  // Parses a buffer the caller keeps alive for the object's lifetime (tests, fuzzing).
  static Result<std::unique_ptr<GgufFile>> from_memory(const void* data, size_t size,
                                                       ParseLimits limits = {});

  [[nodiscard]] uint32_t version() const { return version_; }
  [[nodiscard]] uint64_t file_size() const { return size_; }
  [[nodiscard]] uint64_t data_offset() const { return data_offset_; }
  [[nodiscard]] uint32_t alignment() const { return alignment_; }
  [[nodiscard]] const std::string& path() const { return path_; }

  [[nodiscard]] const std::vector<KeyValue>& metadata() const { return kv_; }
  [[nodiscard]] const KeyValue* find(std::string_view key) const;

  // Typed getters: nullopt when the key is absent or of an incompatible type.
  // get_uint accepts any non-negative integer type; get_float any numeric type.
  [[nodiscard]] std::optional<uint64_t> get_uint(std::string_view key) const;
  [[nodiscard]] std::optional<int64_t> get_int(std::string_view key) const;
  [[nodiscard]] std::optional<double> get_float(std::string_view key) const;
  [[nodiscard]] std::optional<bool> get_bool(std::string_view key) const;
  [[nodiscard]] std::optional<std::string_view> get_string(std::string_view key) const;
  [[nodiscard]] const Array* get_array(std::string_view key) const;

  // "general.architecture", or "" when absent.
  [[nodiscard]] std::string architecture() const;

  [[nodiscard]] const std::vector<TensorInfo>& tensors() const { return tensors_; }
  [[nodiscard]] const TensorInfo* find_tensor(std::string_view name) const;
  // Start of a tensor's bytes inside the mapping (n_bytes long, bounds already checked).
  [[nodiscard]] const uint8_t* tensor_data(const TensorInfo& t) const {
    return base_ + data_offset_ + t.offset;
  }
  // The data section: every tensor's bytes (what a backend uploads once).
  [[nodiscard]] std::span<const uint8_t> data_section() const {
    return {base_ + data_offset_, static_cast<size_t>(size_ - data_offset_)};
  }

 private:
  GgufFile() = default;
  Status parse(const ParseLimits& limits);

  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  bool owns_mapping_ = false;
  std::string path_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<KeyValue> kv_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

// Integer-valued helpers for reading a Value regardless of width.
[[nodiscard]] std::optional<int64_t> value_as_int(const Value& v);
[[nodiscard]] std::optional<double> value_as_float(const Value& v);

}  // namespace bie::gguf
