#include "bie/planner/kv_format.h"

#include <fmt/format.h>

#include <cassert>
#include <charconv>
#include <optional>

namespace bie::planner {

namespace {

// Bytes of the fp16 metadata scalars used by the formats below.
constexpr uint64_t kFp16Bytes = 2;
constexpr int kGgmlBlock = 32;  // QK8_0 == QK4_0 == 32

std::optional<int> parse_suffix_int(std::string_view s) {
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v <= 0) return std::nullopt;
  return v;
}

}  // namespace

std::string kv_format_name(KvFormat f) {
  switch (f.type) {
    case KvType::kF16:
      return "f16";
    case KvType::kFp8E4M3:
      return "fp8_e4m3";
    case KvType::kInt8:
      return "int8";
    case KvType::kInt4Asym:
      return fmt::format("int4_asym_g{}", f.group);
    case KvType::kInt4Channel:
      return fmt::format("int4_channel_t{}", f.group);
    case KvType::kInt8Channel:
      return fmt::format("int8_channel_t{}", f.group);
    case KvType::kQ8_0:
      return "q8_0";
    case KvType::kQ4_0:
      return "q4_0";
  }
  return "?";
}

Result<KvFormat> parse_kv_format(std::string_view name, int int4_group, int block_size) {
  const auto bad = [&](std::string_view why) {
    return Error{fmt::format(
        "unknown KV cache dtype '{}'{}; expected f16, fp8_e4m3, int8, "
        "int4_asym[_g32|_g64|_g128], int4_channel[_tN], int8_channel[_tN], q8_0 or q4_0",
        name, why)};
  };
  if (name == "f16" || name == "fp16" || name == "float16") return KvFormat{KvType::kF16, 0};
  if (name == "fp8" || name == "fp8_e4m3") return KvFormat{KvType::kFp8E4M3, 0};
  if (name == "int8") return KvFormat{KvType::kInt8, 0};
  if (name == "q8_0") return KvFormat{KvType::kQ8_0, 0};
  if (name == "q4_0") return KvFormat{KvType::kQ4_0, 0};
  constexpr std::string_view kAsym = "int4_asym";
  constexpr std::string_view kChan = "int4_channel";
  constexpr std::string_view kChan8 = "int8_channel";
  if (name.substr(0, kAsym.size()) == kAsym) {
    std::string_view rest = name.substr(kAsym.size());
    int g = int4_group;
    if (!rest.empty()) {
      if (rest.substr(0, 2) != "_g") return bad("");
      auto v = parse_suffix_int(rest.substr(2));
      if (!v) return bad(" (group must be a positive integer)");
      g = *v;
    }
    if (g != 32 && g != 64 && g != 128) {
      return Error{fmt::format("int4_asym group size must be 32, 64 or 128, got {}", g)};
    }
    return KvFormat{KvType::kInt4Asym, g};
  }
  const bool chan4 = name.substr(0, kChan.size()) == kChan;
  if (chan4 || name.substr(0, kChan8.size()) == kChan8) {
    const std::string_view base = chan4 ? kChan : kChan8;
    std::string_view rest = name.substr(base.size());
    int t = block_size;
    if (!rest.empty()) {
      if (rest.substr(0, 2) != "_t") return bad("");
      auto v = parse_suffix_int(rest.substr(2));
      if (!v) return bad(" (token group must be a positive integer)");
      t = *v;
    }
    if (t <= 0 || t > 4096) {
      return Error{fmt::format("{} token group must be in 1..4096, got {}", base, t)};
    }
    return KvFormat{chan4 ? KvType::kInt4Channel : KvType::kInt8Channel, t};
  }
  return bad("");
}

Status check_kv_format(KvFormat f, int head_dim) {
  if (head_dim < 0) return Error{fmt::format("head_dim must not be negative, got {}", head_dim)};
  if (head_dim == 0) return {};
  switch (f.type) {
    case KvType::kF16:
    case KvType::kFp8E4M3:
    case KvType::kInt8:
      return {};
    case KvType::kInt4Asym:
      if (f.group <= 0 || head_dim % f.group != 0) {
        return Error{fmt::format("{} needs head_dim to be a multiple of {}, got {}",
                                 kv_format_name(f), f.group, head_dim)};
      }
      return {};
    case KvType::kInt4Channel:
      // Per head-token: head_dim/2 data bytes + 4*head_dim/T metadata bytes, both whole.
      if (f.group <= 0 || head_dim % 2 != 0 || (4 * head_dim) % f.group != 0) {
        return Error{
            fmt::format("{} needs an even head_dim with 4*head_dim a multiple of {}, "
                        "got head_dim {}",
                        kv_format_name(f), f.group, head_dim)};
      }
      return {};
    case KvType::kInt8Channel:
      // Per head-token: head_dim data bytes + 4*head_dim/T metadata bytes.
      if (f.group <= 0 || (4 * head_dim) % f.group != 0) {
        return Error{fmt::format("{} needs 4*head_dim a multiple of {}, got head_dim {}",
                                 kv_format_name(f), f.group, head_dim)};
      }
      return {};
    case KvType::kQ8_0:
    case KvType::kQ4_0:
      if (head_dim % kGgmlBlock != 0) {
        return Error{fmt::format("{} needs head_dim to be a multiple of 32, got {}",
                                 kv_format_name(f), head_dim)};
      }
      return {};
  }
  return Error{"unknown KV format"};
}

uint64_t bytes_per_head_token(KvFormat f, int head_dim) {
  assert(check_kv_format(f, head_dim).ok());
  const auto d = static_cast<uint64_t>(head_dim);
  if (d == 0) return 0;
  switch (f.type) {
    case KvType::kF16:
      return 2 * d;
    case KvType::kFp8E4M3:
    case KvType::kInt8:
      return d + kFp16Bytes;
    case KvType::kInt4Asym:
      return d / 2 + (d / static_cast<uint64_t>(f.group)) * 2 * kFp16Bytes;
    case KvType::kInt4Channel:
      // A group of T tokens x d channels stores T*d/2 data bytes and d (scale, zero) pairs.
      return d / 2 + (2 * kFp16Bytes * d) / static_cast<uint64_t>(f.group);
    case KvType::kInt8Channel:
      return d + (2 * kFp16Bytes * d) / static_cast<uint64_t>(f.group);
    case KvType::kQ8_0:
      return d / kGgmlBlock * 34;
    case KvType::kQ4_0:
      return d / kGgmlBlock * 18;
  }
  return 0;
}

bool uses_fp16_sink_window(KvFormat f) {
  return f.type == KvType::kFp8E4M3 || f.type == KvType::kInt8 || f.type == KvType::kInt4Asym ||
         f.type == KvType::kInt4Channel || f.type == KvType::kInt8Channel;
}

}  // namespace bie::planner
