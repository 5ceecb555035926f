// GgufBuilder: writes small GGUF v3 files in memory for tests (synthetic models, hostile inputs).
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace bie::test {

class GgufBuilder {
 public:
  explicit GgufBuilder(uint32_t version = 3, uint32_t alignment = 32)
      : version_(version), alignment_(alignment) {}

  void kv_u32(const std::string& k, uint32_t v) { kv_scalar(k, 4, &v, 4); }
  void kv_i32(const std::string& k, int32_t v) { kv_scalar(k, 5, &v, 4); }
  void kv_f32(const std::string& k, float v) { kv_scalar(k, 6, &v, 4); }
  void kv_bool(const std::string& k, bool v) {
    uint8_t b = v ? 1 : 0;
    kv_scalar(k, 7, &b, 1);
  }
  void kv_u64(const std::string& k, uint64_t v) { kv_scalar(k, 10, &v, 8); }
  void kv_str(const std::string& k, const std::string& v) {
    begin_kv(k, 8);
    put_str(meta_, v);
  }
  void kv_str_array(const std::string& k, const std::vector<std::string>& v) {
    begin_kv(k, 9);
    put_u32(meta_, 8);
    put_u64(meta_, v.size());
    for (const auto& s : v) put_str(meta_, s);
  }
  void kv_f32_array(const std::string& k, const std::vector<float>& v) {
    begin_kv(k, 9);
    put_u32(meta_, 6);
    put_u64(meta_, v.size());
    for (float f : v) put_raw(meta_, &f, 4);
  }
  void kv_i32_array(const std::string& k, const std::vector<int32_t>& v) {
    begin_kv(k, 9);
    put_u32(meta_, 5);
    put_u64(meta_, v.size());
    for (int32_t x : v) put_raw(meta_, &x, 4);
  }
  // Appends raw bytes to the metadata section (for hand-made nested arrays or hostile values).
  void kv_raw(const std::string& k, uint32_t type, const std::vector<uint8_t>& payload) {
    begin_kv(k, type);
    meta_.insert(meta_.end(), payload.begin(), payload.end());
  }

  // Adds a tensor; `data` must hold exactly the tensor's bytes.
  void tensor(const std::string& name, std::vector<int64_t> ne, uint32_t type,
              const std::vector<uint8_t>& data) {
    while (blob_.size() % alignment_ != 0) blob_.push_back(0);
    put_str(tinfo_, name);
    put_u32(tinfo_, static_cast<uint32_t>(ne.size()));
    for (int64_t d : ne) put_u64(tinfo_, static_cast<uint64_t>(d));
    put_u32(tinfo_, type);
    put_u64(tinfo_, blob_.size());
    blob_.insert(blob_.end(), data.begin(), data.end());
    ++n_tensors_;
  }
  void tensor_f32(const std::string& name, std::vector<int64_t> ne, const std::vector<float>& v) {
    std::vector<uint8_t> bytes(v.size() * 4);
    std::memcpy(bytes.data(), v.data(), bytes.size());
    tensor(name, std::move(ne), 0, bytes);
  }

  [[nodiscard]] std::vector<uint8_t> build() const {
    std::vector<uint8_t> out;
    put_u32(out, 0x46554747);
    put_u32(out, version_);
    put_u64(out, n_tensors_);
    put_u64(out, n_kv_);
    out.insert(out.end(), meta_.begin(), meta_.end());
    out.insert(out.end(), tinfo_.begin(), tinfo_.end());
    while (out.size() % alignment_ != 0) out.push_back(0);
    out.insert(out.end(), blob_.begin(), blob_.end());
    return out;
  }

  void write(const std::string& path) const {
    const auto bytes = build();
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  }

  static void put_u32(std::vector<uint8_t>& b, uint32_t v) { put_raw(b, &v, 4); }
  static void put_u64(std::vector<uint8_t>& b, uint64_t v) { put_raw(b, &v, 8); }
  static void put_str(std::vector<uint8_t>& b, const std::string& s) {
    put_u64(b, s.size());
    put_raw(b, s.data(), s.size());
  }
  static void put_raw(std::vector<uint8_t>& b, const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    b.insert(b.end(), c, c + n);
  }

 private:
  void begin_kv(const std::string& k, uint32_t type) {
    put_str(meta_, k);
    put_u32(meta_, type);
    ++n_kv_;
  }
  void kv_scalar(const std::string& k, uint32_t type, const void* v, size_t n) {
    begin_kv(k, type);
    put_raw(meta_, v, n);
  }

  uint32_t version_;
  uint32_t alignment_;
  uint64_t n_kv_ = 0;
  uint64_t n_tensors_ = 0;
  std::vector<uint8_t> meta_, tinfo_, blob_;
};

}  // namespace bie::test
