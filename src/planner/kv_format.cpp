#include "bie/planner/kv_format.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <charconv>
#include <optional>

namespace bie::planner {

namespace {

constexpr int kMaxTokenGroup = 4096;

// The format table (bie/planner/kv_format.h documents the columns), one row per KvType.
// clang-format off
constexpr KvFormatSpec kSpecs[] = {
    // type                name            bits head group kind               fixed gmeta sinks
    {KvType::kF16,         "f16",          16,  0,   KvGroupKind::kNone,      0,    0,    false},
    {KvType::kFp8E4M3,     "fp8_e4m3",     8,   2,   KvGroupKind::kNone,      0,    0,    true},
    {KvType::kInt8,        "int8",         8,   2,   KvGroupKind::kNone,      0,    0,    true},
    {KvType::kInt4Asym,    "int4_asym",    4,   0,   KvGroupKind::kAlongHead, 0,    4,    true},
    {KvType::kInt4Channel, "int4_channel", 4,   0,   KvGroupKind::kTokens,    0,    4,    true},
    {KvType::kQ8_0,        "q8_0",         8,   0,   KvGroupKind::kAlongHead, 32,   2,    false},
    {KvType::kQ4_0,        "q4_0",         4,   0,   KvGroupKind::kAlongHead, 32,   2,    false},
    {KvType::kInt8Channel, "int8_channel", 8,   0,   KvGroupKind::kTokens,    0,    4,    true},
};
// clang-format on

// Groups along head_dim a parameterised kAlongHead type accepts.
constexpr int kHeadGroups[] = {32, 64, 128};

bool has_group_param(const KvFormatSpec& s) {
  return s.group_kind != KvGroupKind::kNone && s.fixed_group == 0;
}

int group_of(const KvFormatSpec& s, KvFormat f) {
  return s.fixed_group != 0 ? s.fixed_group : f.group;
}

std::optional<int> parse_suffix_int(std::string_view s) {
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v <= 0) return std::nullopt;
  return v;
}

}  // namespace

const KvFormatSpec& kv_format_spec(KvType type) {
  for (const KvFormatSpec& s : kSpecs) {
    if (s.type == type) return s;
  }
  assert(false && "KvType without a row in kSpecs");
  return kSpecs[0];
}

bool kv_group_valid(KvFormat f) {
  const KvFormatSpec& s = kv_format_spec(f.type);
  if (!has_group_param(s)) return true;
  if (s.group_kind == KvGroupKind::kTokens) return f.group > 0 && f.group <= kMaxTokenGroup;
  return std::find(std::begin(kHeadGroups), std::end(kHeadGroups), f.group) !=
         std::end(kHeadGroups);
}

std::string kv_format_name(KvFormat f) {
  const KvFormatSpec& s = kv_format_spec(f.type);
  if (!has_group_param(s)) return std::string(s.name);
  return fmt::format("{}_{}{}", s.name, s.group_kind == KvGroupKind::kAlongHead ? 'g' : 't',
                     f.group);
}

Result<KvFormat> parse_kv_format(std::string_view name, int int4_group, int block_size) {
  const auto bad = [&](std::string_view why) {
    return Error{fmt::format(
        "unknown KV cache dtype '{}'{}; expected f16, fp8_e4m3, int8, "
        "int4_asym[_g32|_g64|_g128], int4_channel[_tN], int8_channel[_tN], q8_0 or q4_0",
        name, why)};
  };
  if (name == "fp16" || name == "float16") return KvFormat{KvType::kF16, 0};
  if (name == "fp8") return KvFormat{KvType::kFp8E4M3, 0};
  for (const KvFormatSpec& s : kSpecs) {
    const bool exact = name == s.name;
    if (!has_group_param(s)) {
      if (exact) return KvFormat{s.type, 0};
      continue;
    }
    if (!exact && !(name.starts_with(s.name) && name[s.name.size()] == '_')) continue;
    const bool along_head = s.group_kind == KvGroupKind::kAlongHead;
    int g = along_head ? int4_group : block_size;
    if (!exact) {
      const std::string_view rest = name.substr(s.name.size());
      if (rest.substr(0, 2) != (along_head ? "_g" : "_t")) return bad("");
      auto v = parse_suffix_int(rest.substr(2));
      if (!v)
        return bad(along_head ? " (group must be a positive integer)"
                              : " (token group must be a positive integer)");
      g = *v;
    }
    const KvFormat f{s.type, g};
    if (kv_group_valid(f)) return f;
    if (along_head) {
      return Error{fmt::format("{} group size must be 32, 64 or 128, got {}", s.name, g)};
    }
    return Error{fmt::format("{} token group must be in 1..{}, got {}", s.name, kMaxTokenGroup, g)};
  }
  return bad("");
}

Status check_kv_format(KvFormat f, int head_dim) {
  if (head_dim < 0) return Error{fmt::format("head_dim must not be negative, got {}", head_dim)};
  if (head_dim == 0) return {};
  const KvFormatSpec& s = kv_format_spec(f.type);
  const int g = group_of(s, f);
  switch (s.group_kind) {
    case KvGroupKind::kNone:
      return {};
    case KvGroupKind::kAlongHead:
      if (g <= 0 || head_dim % g != 0) {
        return Error{fmt::format("{} needs head_dim to be a multiple of {}, got {}",
                                 kv_format_name(f), g, head_dim)};
      }
      return {};
    case KvGroupKind::kTokens:
      // Per head-token: head_dim code bytes (whole) + group_meta*head_dim/T metadata bytes.
      if (g <= 0 || (head_dim * s.value_bits) % 8 != 0 ||
          (s.group_meta_bytes * head_dim) % g != 0) {
        return Error{fmt::format(
            "{} needs {}{}*head_dim a multiple of {}, got head_dim {}", kv_format_name(f),
            s.value_bits < 8 ? "an even head_dim with " : "", s.group_meta_bytes, g, head_dim)};
      }
      return {};
  }
  return Error{"unknown KV format"};
}

uint64_t bytes_per_head_token(KvFormat f, int head_dim) {
  assert(check_kv_format(f, head_dim).ok());
  const auto d = static_cast<uint64_t>(head_dim);
  if (d == 0) return 0;
  const KvFormatSpec& s = kv_format_spec(f.type);
  const auto g = static_cast<uint64_t>(group_of(s, f));
  const auto gm = static_cast<uint64_t>(s.group_meta_bytes);
  uint64_t bytes =
      d * static_cast<uint64_t>(s.value_bits) / 8 + static_cast<uint64_t>(s.head_meta_bytes);
  if (s.group_kind == KvGroupKind::kAlongHead) bytes += (d / g) * gm;
  if (s.group_kind == KvGroupKind::kTokens) bytes += gm * d / g;
  return bytes;
}

bool uses_fp16_sink_window(KvFormat f) {
  return kv_format_spec(f.type).fp16_sink_window;
}

}  // namespace bie::planner
