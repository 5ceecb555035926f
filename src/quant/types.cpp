#include "bie/quant/types.h"

#include <array>
#include <cctype>

#include "bie/backend/cpu_features.h"
#include "bie/quant/traits.h"
#include "quant/quant_internal.h"

namespace bie::quant {

namespace {

struct NameEntry {
  std::string_view name;
  bool known;  // false: an id ggml used once and removed
};

constexpr std::array<NameEntry, kGgmlTypeIdLimit> kNames = {{
    {"f32", true},         {"f16", true},         {"q4_0", true},        {"q4_1", true},
    {"q4_2", false},       {"q4_3", false},       {"q5_0", true},        {"q5_1", true},
    {"q8_0", true},        {"q8_1", true},        {"q2_K", true},        {"q3_K", true},
    {"q4_K", true},        {"q5_K", true},        {"q6_K", true},        {"q8_K", true},
    {"iq2_xxs", true},     {"iq2_xs", true},      {"iq3_xxs", true},     {"iq1_s", true},
    {"iq4_nl", true},      {"iq3_s", true},       {"iq2_s", true},       {"iq4_xs", true},
    {"i8", true},          {"i16", true},         {"i32", true},         {"i64", true},
    {"f64", true},         {"iq1_m", true},       {"bf16", true},        {"q4_0_4_4", false},
    {"q4_0_4_8", false},   {"q4_0_8_8", false},   {"tq1_0", true},       {"tq2_0", true},
    {"iq4_nl_4_4", false}, {"iq4_nl_4_8", false}, {"iq4_nl_8_8", false}, {"mxfp4", true},
}};

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

std::string_view type_name(GgmlType type) {
  return in_range(type) ? kNames[static_cast<size_t>(type)].name : std::string_view("unknown");
}

std::optional<GgmlType> type_from_name(std::string_view name) {
  for (int32_t i = 0; i < kGgmlTypeIdLimit; ++i) {
    if (kNames[static_cast<size_t>(i)].known && iequal(kNames[static_cast<size_t>(i)].name, name)) {
      return static_cast<GgmlType>(i);
    }
  }
  return std::nullopt;
}

bool is_known(GgmlType type) {
  return in_range(type) && kNames[static_cast<size_t>(type)].known;
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
  static const TypeTraits* const table = has_avx2() ? avx2_table() : nullptr;
  return lookup(table, type);
}

const TypeTraits* traits(GgmlType type) {
  const TypeTraits* t = traits_avx2(type);
  return t ? t : traits_scalar(type);
}

}  // namespace bie::quant
