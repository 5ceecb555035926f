#include "bie/gguf/gguf_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "bie/gguf/ggml_type_info.h"

namespace bie::gguf {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian uint32
constexpr uint32_t kDefaultAlignment = 32;

struct ParseError {
  std::string message;
};

// Bounds-checked little-endian reader over [data, data + size).
class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}

  [[nodiscard]] uint64_t pos() const { return pos_; }
  [[nodiscard]] uint64_t remaining() const { return size_ - pos_; }

  void need(uint64_t n, std::string_view what) const {
    if (n > remaining()) {
      throw ParseError{fmt::format("file truncated: {} needs {} bytes at offset {}, only {} left",
                                   what, n, pos_, remaining())};
    }
  }

  template <class T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(std::string_view what, uint64_t max_len) {
    const uint64_t len = read<uint64_t>(what);
    if (len > max_len) {
      throw ParseError{
          fmt::format("{}: string length {} at offset {} exceeds the limit of {} bytes", what, len,
                      pos_ - 8, max_len)};
    }
    need(len, what);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return s;
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

// Smallest encoded size of one value of type t, used to reject counts the file cannot hold.
uint64_t min_encoded_size(ValueType t) {
  switch (t) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kBool:
      return 1;
    case ValueType::kUint16:
    case ValueType::kInt16:
      return 2;
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kFloat32:
      return 4;
    case ValueType::kUint64:
    case ValueType::kInt64:
    case ValueType::kFloat64:
    case ValueType::kString:  // length prefix
      return 8;
    case ValueType::kArray:  // elem type + count
      return 12;
  }
  return 1;
}

bool valid_value_type(uint32_t t) {
  return t <= static_cast<uint32_t>(ValueType::kFloat64);
}

Value read_value(Cursor& c, ValueType type, const ParseLimits& limits, int depth,
                 const std::string& key) {
  switch (type) {
    case ValueType::kUint8:
      return c.read<uint8_t>(key);
    case ValueType::kInt8:
      return c.read<int8_t>(key);
    case ValueType::kUint16:
      return c.read<uint16_t>(key);
    case ValueType::kInt16:
      return c.read<int16_t>(key);
    case ValueType::kUint32:
      return c.read<uint32_t>(key);
    case ValueType::kInt32:
      return c.read<int32_t>(key);
    case ValueType::kFloat32:
      return c.read<float>(key);
    case ValueType::kBool: {
      const uint8_t b = c.read<uint8_t>(key);
      if (b > 1) {
        throw ParseError{fmt::format("metadata '{}': bool value {} is neither 0 nor 1", key, b)};
      }
      return b == 1;
    }
    case ValueType::kString:
      return c.read_string(fmt::format("metadata '{}' string", key), limits.max_string_bytes);
    case ValueType::kUint64:
      return c.read<uint64_t>(key);
    case ValueType::kInt64:
      return c.read<int64_t>(key);
    case ValueType::kFloat64:
      return c.read<double>(key);
    case ValueType::kArray: {
      if (depth >= limits.max_array_depth) {
        throw ParseError{fmt::format("metadata '{}': arrays nested deeper than {}", key,
                                     limits.max_array_depth)};
      }
      const uint32_t raw_elem = c.read<uint32_t>(key);
      if (!valid_value_type(raw_elem)) {
        throw ParseError{
            fmt::format("metadata '{}': unknown array element type {}", key, raw_elem)};
      }
      const auto elem = static_cast<ValueType>(raw_elem);
      const uint64_t count = c.read<uint64_t>(key);
      if (count > c.remaining() / min_encoded_size(elem)) {
        throw ParseError{fmt::format(
            "metadata '{}': array of {} {} elements cannot fit in the {} bytes left in the file",
            key, count, value_type_name(elem), c.remaining())};
      }
      auto arr = std::make_shared<Array>();
      arr->elem_type = elem;
      arr->items.reserve(count);
      for (uint64_t i = 0; i < count; ++i) {
        arr->items.push_back(read_value(c, elem, limits, depth + 1, key));
      }
      return std::shared_ptr<const Array>(std::move(arr));
    }
  }
  throw ParseError{fmt::format("metadata '{}': unknown value type", key)};
}

// a * b with overflow detection.
bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

}  // namespace

std::string_view value_type_name(ValueType t) {
  switch (t) {
    case ValueType::kUint8:
      return "uint8";
    case ValueType::kInt8:
      return "int8";
    case ValueType::kUint16:
      return "uint16";
    case ValueType::kInt16:
      return "int16";
    case ValueType::kUint32:
      return "uint32";
    case ValueType::kInt32:
      return "int32";
    case ValueType::kFloat32:
      return "float32";
    case ValueType::kBool:
      return "bool";
    case ValueType::kString:
      return "string";
    case ValueType::kArray:
      return "array";
    case ValueType::kUint64:
      return "uint64";
    case ValueType::kInt64:
      return "int64";
    case ValueType::kFloat64:
      return "float64";
  }
  return "unknown";
}

std::optional<int64_t> value_as_int(const Value& v) {
  return std::visit(
      [](const auto& x) -> std::optional<int64_t> {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, uint64_t>) {
          if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
          return static_cast<int64_t>(x);
        } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          return static_cast<int64_t>(x);
        } else {
          return std::nullopt;
        }
      },
      v);
}

std::optional<double> value_as_float(const Value& v) {
  return std::visit(
      [](const auto& x) -> std::optional<double> {
        using T = std::decay_t<decltype(x)>;
        if constexpr ((std::is_integral_v<T> && !std::is_same_v<T, bool>) ||
                      std::is_floating_point_v<T>) {
          return static_cast<double>(x);
        } else {
          return std::nullopt;
        }
      },
      v);
}

GgufFile::~GgufFile() {
  if (owns_mapping_ && base_ != nullptr) {
    munmap(const_cast<uint8_t*>(base_), size_);
  }
}

Result<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path, ParseLimits limits) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return Error{fmt::format("cannot open model file '{}': {}", path, std::strerror(errno))};
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Error{fmt::format("cannot stat '{}': {}", path, std::strerror(err))};
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Error{fmt::format("'{}' is not a regular file", path)};
  }
  if (st.st_size == 0) {
    ::close(fd);
    return Error{fmt::format("'{}' is empty, not a GGUF file", path)};
  }
  void* map = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);
  if (map == MAP_FAILED) {
    return Error{fmt::format("cannot mmap '{}': {}", path, std::strerror(map_err))};
  }
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->base_ = static_cast<const uint8_t*>(map);
  f->size_ = static_cast<uint64_t>(st.st_size);
  f->owns_mapping_ = true;
  f->path_ = path;
  if (Status s = f->parse(limits); !s) {
    return Error{fmt::format("'{}': {}", path, s.error())};
  }
  return f;
}

Result<std::unique_ptr<GgufFile>> GgufFile::from_memory(const void* data, size_t size,
                                                        ParseLimits limits) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->base_ = static_cast<const uint8_t*>(data);
  f->size_ = size;
  f->path_ = "<memory>";
  if (Status s = f->parse(limits); !s) return Error{s.error()};
  return f;
}

Status GgufFile::parse(const ParseLimits& limits) {
  try {
    Cursor c(base_, size_);
    if (size_ < 4) throw ParseError{fmt::format("not a GGUF file: only {} bytes", size_)};
    const uint32_t magic = c.read<uint32_t>("magic");
    if (magic != kMagic) {
      throw ParseError{"not a GGUF file (bad magic; expected 'GGUF')"};
    }
    version_ = c.read<uint32_t>("version");
    if (version_ == 1) {
      throw ParseError{
          "GGUF version 1 is not supported (re-convert the model with a current tool)"};
    }
    if (version_ != 2 && version_ != 3) {
      if ((version_ & 0xFFFF) == 0 && version_ != 0) {
        throw ParseError{"GGUF file is big-endian; only little-endian files are supported"};
      }
      throw ParseError{fmt::format("unsupported GGUF version {} (supported: 2, 3)", version_)};
    }
    const uint64_t n_tensors = c.read<uint64_t>("tensor count");
    const uint64_t n_kv = c.read<uint64_t>("metadata count");
    // A key-value needs at least 8 (key length) + 4 (type) + 1 bytes; a tensor info 8+4+8+4+8.
    if (n_kv > limits.max_kv || n_kv > c.remaining() / 13) {
      throw ParseError{
          fmt::format("metadata count {} is impossible for a {}-byte file", n_kv, size_)};
    }
    if (n_tensors > limits.max_tensors || n_tensors > c.remaining() / 32) {
      throw ParseError{
          fmt::format("tensor count {} is impossible for a {}-byte file", n_tensors, size_)};
    }

    kv_.reserve(n_kv);
    for (uint64_t i = 0; i < n_kv; ++i) {
      std::string key = c.read_string(fmt::format("metadata key #{}", i), 65535);
      if (key.empty()) throw ParseError{fmt::format("metadata key #{} is empty", i)};
      const uint32_t raw_type = c.read<uint32_t>(key);
      if (!valid_value_type(raw_type)) {
        throw ParseError{fmt::format("metadata '{}': unknown value type {}", key, raw_type)};
      }
      const auto type = static_cast<ValueType>(raw_type);
      Value v = read_value(c, type, limits, 0, key);
      if (kv_index_.count(key) != 0)
        throw ParseError{fmt::format("duplicate metadata key '{}'", key)};
      kv_index_.emplace(key, kv_.size());
      kv_.push_back(KeyValue{std::move(key), type, std::move(v)});
    }

    if (const KeyValue* a = find("general.alignment")) {
      const auto al = value_as_int(a->value);
      if (!al || *al <= 0 || *al > (1 << 20) || (*al & (*al - 1)) != 0) {
        throw ParseError{"general.alignment must be a power of two between 1 and 1 MiB"};
      }
      alignment_ = static_cast<uint32_t>(*al);
    } else {
      alignment_ = kDefaultAlignment;
    }

    tensors_.reserve(n_tensors);
    for (uint64_t i = 0; i < n_tensors; ++i) {
      TensorInfo t;
      t.name = c.read_string(fmt::format("tensor #{} name", i), 65535);
      const uint32_t n_dims = c.read<uint32_t>(t.name);
      if (n_dims == 0 || n_dims > kMaxDims) {
        throw ParseError{
            fmt::format("tensor '{}': {} dimensions (must be 1..{})", t.name, n_dims, kMaxDims)};
      }
      t.n_dims = static_cast<int>(n_dims);
      uint64_t n_elements = 1;
      for (uint32_t d = 0; d < n_dims; ++d) {
        const uint64_t ne = c.read<uint64_t>(t.name);
        if (ne == 0 || ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
            mul_overflows(n_elements, ne, &n_elements) ||
            n_elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          throw ParseError{fmt::format("tensor '{}': dimension {} = {} is invalid", t.name, d, ne)};
        }
        t.ne[d] = static_cast<int64_t>(ne);
      }
      t.type = c.read<uint32_t>(t.name);
      const auto info = ggml_type_info(t.type);
      if (!info)
        throw ParseError{fmt::format("tensor '{}': unknown tensor type id {}", t.name, t.type)};
      if (t.ne[0] % info->block_size != 0) {
        throw ParseError{
            fmt::format("tensor '{}': row length {} is not a multiple of the {} block "
                        "size {}",
                        t.name, t.ne[0], info->name, info->block_size)};
      }
      uint64_t n_blocks = n_elements / static_cast<uint64_t>(info->block_size);
      if (mul_overflows(n_blocks, info->type_size, &t.n_bytes)) {
        throw ParseError{fmt::format("tensor '{}': byte size overflows", t.name)};
      }
      t.offset = c.read<uint64_t>(t.name);
      if (t.offset % alignment_ != 0) {
        throw ParseError{fmt::format("tensor '{}': data offset {} is not aligned to {}", t.name,
                                     t.offset, alignment_)};
      }
      if (tensor_index_.count(t.name) != 0) {
        throw ParseError{fmt::format("duplicate tensor name '{}'", t.name)};
      }
      tensor_index_.emplace(t.name, tensors_.size());
      tensors_.push_back(std::move(t));
    }

    const uint64_t pos = c.pos();
    data_offset_ = (pos + alignment_ - 1) / alignment_ * alignment_;
    if (data_offset_ > size_ && n_tensors > 0) {
      throw ParseError{
          fmt::format("file truncated: tensor data would start at {} but the file has "
                      "{} bytes",
                      data_offset_, size_)};
    }
    const uint64_t data_size = data_offset_ <= size_ ? size_ - data_offset_ : 0;
    for (const TensorInfo& t : tensors_) {
      if (t.offset > data_size || t.n_bytes > data_size - t.offset) {
        throw ParseError{fmt::format(
            "file truncated or corrupt: tensor '{}' ({} bytes at data offset {}) extends past the "
            "end of the file ({} data bytes)",
            t.name, t.n_bytes, t.offset, data_size)};
      }
    }
  } catch (const ParseError& e) {
    return Error{e.message};
  } catch (const std::bad_alloc&) {
    return Error{"out of memory while reading GGUF metadata"};
  }
  return {};
}

const KeyValue* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(std::string(key));
  return it == kv_index_.end() ? nullptr : &kv_[it->second];
}

std::optional<uint64_t> GgufFile::get_uint(std::string_view key) const {
  const KeyValue* kv = find(key);
  if (kv == nullptr) return std::nullopt;
  if (const auto* u = std::get_if<uint64_t>(&kv->value)) return *u;
  const auto i = value_as_int(kv->value);
  if (!i || *i < 0) return std::nullopt;
  return static_cast<uint64_t>(*i);
}

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  const KeyValue* kv = find(key);
  return kv == nullptr ? std::nullopt : value_as_int(kv->value);
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const KeyValue* kv = find(key);
  return kv == nullptr ? std::nullopt : value_as_float(kv->value);
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const KeyValue* kv = find(key);
  if (kv == nullptr) return std::nullopt;
  if (const auto* b = std::get_if<bool>(&kv->value)) return *b;
  return std::nullopt;
}

std::optional<std::string_view> GgufFile::get_string(std::string_view key) const {
  const KeyValue* kv = find(key);
  if (kv == nullptr) return std::nullopt;
  if (const auto* s = std::get_if<std::string>(&kv->value)) return std::string_view(*s);
  return std::nullopt;
}

const Array* GgufFile::get_array(std::string_view key) const {
  const KeyValue* kv = find(key);
  if (kv == nullptr) return nullptr;
  if (const auto* a = std::get_if<std::shared_ptr<const Array>>(&kv->value)) return a->get();
  return nullptr;
}

std::string GgufFile::architecture() const {
  auto s = get_string("general.architecture");
  return s ? std::string(*s) : std::string();
}

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace bie::gguf
