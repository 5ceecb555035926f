#include "bie/gguf/gguf_writer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "bie/gguf/ggml_type_info.h"

namespace bie::gguf {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" as little-endian uint32

template <class T>
void put(std::vector<uint8_t>& b, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  b.insert(b.end(), p, p + sizeof(T));
}

void put_string(std::vector<uint8_t>& b, const std::string& s) {
  put<uint64_t>(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}

uint64_t align_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

}  // namespace

void GgufWriter::begin_kv(const std::string& key, ValueType type) {
  put_string(meta_, key);
  put<uint32_t>(meta_, static_cast<uint32_t>(type));
  ++n_kv_;
}

void GgufWriter::add_u32(const std::string& key, uint32_t v) {
  begin_kv(key, ValueType::kUint32);
  put(meta_, v);
}
void GgufWriter::add_i32(const std::string& key, int32_t v) {
  begin_kv(key, ValueType::kInt32);
  put(meta_, v);
}
void GgufWriter::add_f32(const std::string& key, float v) {
  begin_kv(key, ValueType::kFloat32);
  put(meta_, v);
}
void GgufWriter::add_bool(const std::string& key, bool v) {
  begin_kv(key, ValueType::kBool);
  put<uint8_t>(meta_, v ? 1 : 0);
}
void GgufWriter::add_string(const std::string& key, const std::string& v) {
  begin_kv(key, ValueType::kString);
  put_string(meta_, v);
}

void GgufWriter::add_value(const std::string& key, ValueType type, const Value& v) {
  begin_kv(key, type);
  put_value(type, v);
}

// The Value alternatives are declared in ValueType order, so index() is the type id.
void GgufWriter::put_value(ValueType type, const Value& v) {
  switch (type) {
    case ValueType::kUint8:
      put(meta_, std::get<uint8_t>(v));
      break;
    case ValueType::kInt8:
      put(meta_, std::get<int8_t>(v));
      break;
    case ValueType::kUint16:
      put(meta_, std::get<uint16_t>(v));
      break;
    case ValueType::kInt16:
      put(meta_, std::get<int16_t>(v));
      break;
    case ValueType::kUint32:
      put(meta_, std::get<uint32_t>(v));
      break;
    case ValueType::kInt32:
      put(meta_, std::get<int32_t>(v));
      break;
    case ValueType::kFloat32:
      put(meta_, std::get<float>(v));
      break;
    case ValueType::kBool:
      put<uint8_t>(meta_, std::get<bool>(v) ? 1 : 0);
      break;
    case ValueType::kString:
      put_string(meta_, std::get<std::string>(v));
      break;
    case ValueType::kUint64:
      put(meta_, std::get<uint64_t>(v));
      break;
    case ValueType::kInt64:
      put(meta_, std::get<int64_t>(v));
      break;
    case ValueType::kFloat64:
      put(meta_, std::get<double>(v));
      break;
    case ValueType::kArray: {
      const Array& a = *std::get<std::shared_ptr<const Array>>(v);
      put<uint32_t>(meta_, static_cast<uint32_t>(a.elem_type));
      put<uint64_t>(meta_, a.items.size());
      for (const Value& x : a.items) put_value(a.elem_type, x);
      break;
    }
  }
}

Status GgufWriter::add_tensor(const std::string& name, std::vector<int64_t> ne, uint32_t type) {
  const auto info = ggml_type_info(type);
  if (!info || info->block_size <= 0)
    return Error{fmt::format("tensor {}: unknown type {}", name, type)};
  if (ne.empty() || ne.size() > kMaxDims) return Error{fmt::format("tensor {}: bad rank", name)};
  int64_t n = 1;
  for (int64_t d : ne) {
    if (d <= 0) return Error{fmt::format("tensor {}: dimension {} must be >= 1", name, d)};
    n *= d;
  }
  if (ne[0] % info->block_size != 0) {
    return Error{fmt::format("tensor {}: row of {} values is not a whole number of {} blocks ({})",
                             name, ne[0], info->name, info->block_size)};
  }
  TensorSpec t{name, std::move(ne), type,
               static_cast<uint64_t>(n / info->block_size) * info->type_size};
  tensors_.push_back(std::move(t));
  return {};
}

std::vector<uint8_t> GgufWriter::header() const {
  std::vector<uint8_t> head;
  put<uint32_t>(head, kMagic);
  put<uint32_t>(head, 3);
  put<uint64_t>(head, tensors_.size());
  // general.alignment is only needed when it differs from the default of 32.
  put<uint64_t>(head, n_kv_ + (alignment_ != 32 ? 1 : 0));
  head.insert(head.end(), meta_.begin(), meta_.end());
  if (alignment_ != 32) {
    put_string(head, "general.alignment");
    put<uint32_t>(head, static_cast<uint32_t>(ValueType::kUint32));
    put<uint32_t>(head, alignment_);
  }
  uint64_t offset = 0;
  for (const TensorSpec& t : tensors_) {
    offset = align_up(offset, alignment_);
    put_string(head, t.name);
    put<uint32_t>(head, static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) put<uint64_t>(head, static_cast<uint64_t>(d));
    put<uint32_t>(head, t.type);
    put<uint64_t>(head, offset);
    offset += t.n_bytes;
  }
  head.resize(align_up(head.size(), alignment_), 0);
  return head;
}

uint64_t GgufWriter::file_bytes() const {
  uint64_t data = 0;
  for (const TensorSpec& t : tensors_) data = align_up(data, alignment_) + t.n_bytes;
  return header().size() + data;
}

Status GgufWriter::write(const std::string& path, const FillFn& fill, uint64_t chunk_bytes) const {
  const std::vector<uint8_t> head = header();
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f) return Error{fmt::format("cannot create {}: {}", path, std::strerror(errno))};
  const auto out = [&](const void* p, size_t n) -> Status {
    if (std::fwrite(p, 1, n, f.get()) != n) {
      return Error{fmt::format("writing {} failed: {}", path, std::strerror(errno))};
    }
    return {};
  };
  if (Status s = out(head.data(), head.size()); !s) return s;

  std::vector<uint8_t> buf;
  uint64_t written = 0;
  const std::vector<uint8_t> zeros(alignment_, 0);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorSpec& t = tensors_[i];
    const uint64_t pad = align_up(written, alignment_) - written;
    if (Status s = out(zeros.data(), pad); !s) return s;
    written += pad;
    const uint64_t block = ggml_type_info(t.type)->type_size;
    const uint64_t step = std::max<uint64_t>(block, chunk_bytes / block * block);
    for (uint64_t o = 0; o < t.n_bytes; o += step) {
      const uint64_t n = std::min(step, t.n_bytes - o);
      buf.resize(n);
      if (Status s = fill(i, t, o, std::span<uint8_t>(buf.data(), n)); !s) return s;
      if (Status s = out(buf.data(), n); !s) return s;
    }
    written += t.n_bytes;
  }
  if (std::fflush(f.get()) != 0) {
    return Error{fmt::format("writing {} failed: {}", path, std::strerror(errno))};
  }
  return {};
}

}  // namespace bie::gguf
