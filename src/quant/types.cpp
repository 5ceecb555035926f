#include "bie/quant/types.h"

#include <array>
#include <cctype>

#include "bie/common/cpu_features.h"
#include "bie/gguf/ggml_type_info.h"
#include "bie/quant/traits.h"
#include "quant/quant_internal.h"

namespace bie::quant {

namespace {

bool in_range(GgmlType t) {
  const auto i = static_cast<int32_t>(t);
  return i >= 0 && i < kGgmlTypeIdLimit;
}

bool iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

const TypeTraits* lookup(const TypeTraits* table, GgmlType t) {
  if (table == nullptr || !in_range(t)) return nullptr;
  const TypeTraits* tr = &table[static_cast<int32_t>(t)];
  return tr->to_float != nullptr ? tr : nullptr;
}

}  // namespace

// Names and the set of known ids come from the GGUF format's type table (one table of ggml ids).
std::string_view type_name(GgmlType type) {
  const auto info =
      in_range(type) ? gguf::ggml_type_info(static_cast<uint32_t>(type)) : std::nullopt;
  return info ? info->name : std::string_view("unknown");
}

std::optional<GgmlType> type_from_name(std::string_view name) {
  for (int32_t i = 0; i < kGgmlTypeIdLimit; ++i) {
    const auto info = gguf::ggml_type_info(static_cast<uint32_t>(i));
    if (info && iequal(info->name, name)) return static_cast<GgmlType>(i);
  }
  return std::nullopt;
}

bool is_known(GgmlType type) {
  return in_range(type) && gguf::ggml_type_info(static_cast<uint32_t>(type)).has_value();
}

bool is_supported(GgmlType type) {
  return traits_scalar(type) != nullptr;
}

int64_t block_size(GgmlType type) {
  const TypeTraits* t = traits_scalar(type);
  return t ? t->block_size : 0;
}

size_t type_size(GgmlType type) {
  const TypeTraits* t = traits_scalar(type);
  return t ? t->type_size : 0;
}

size_t row_size(GgmlType type, int64_t n) {
  const TypeTraits* t = traits_scalar(type);
  // note: call only if the type is supported and n is a whole number of blocks.
  return t ? static_cast<size_t>(n / t->block_size) * t->type_size : 0;
}

const TypeTraits* traits_scalar(GgmlType type) {
  return lookup(scalar_table(), type);
}

const TypeTraits* traits_avx2(GgmlType type) {
  // Not cached: the active ISA may be lowered at run time (set_isa, for tests).
  return has_avx2() ? lookup(avx2_table(), type) : nullptr;
}

const TypeTraits* traits(GgmlType type) {
  const TypeTraits* t = traits_avx2(type);
  return t ? t : traits_scalar(type);
}

}  // namespace bie::quant
