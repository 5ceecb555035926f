#include "bie/planner/weights.h"

#include <fmt/format.h>

#include <array>
#include <cctype>
#include <cmath>
#include <string>

namespace bie::planner {

namespace {

constexpr std::string_view kBrief = "VRAMLab effective-bpw table (../shared/BRIEF.md §4)";
constexpr std::string_view kGgml = "ggml block layout (bytes per 32-value block x 8 / 32)";

constexpr std::array kTable = {
    WeightQuant{"F32", "fp32,float32", 32.0, "4 bytes per value"},
    WeightQuant{"F16", "fp16,float16", 16.0, kBrief},
    WeightQuant{"BF16", "bfloat16", 16.0, kBrief},
    WeightQuant{"FP8", "fp8_e4m3,e4m3", 8.50, kBrief},
    WeightQuant{"INT8", "w8a16,w8", 8.50, kBrief},
    WeightQuant{"Q8_0", "", 8.50, kBrief},
    WeightQuant{"Q6_K", "", 6.56, kBrief},
    WeightQuant{"Q5_K_M", "q5_k", 5.69, kBrief},
    WeightQuant{"Q4_K_M", "q4_k", 4.85, kBrief},
    WeightQuant{"AWQ", "gptq,int4,awq_int4,gptq_int4,w4a16", 4.50, kBrief},
    WeightQuant{"IQ4_XS", "", 4.25, kBrief},
    WeightQuant{"Q3_K_M", "q3_k", 3.91, kBrief},
    WeightQuant{"Q2_K", "", 3.35, kBrief},
    WeightQuant{"Q5_1", "", 6.0, kGgml},
    WeightQuant{"Q5_0", "", 5.5, kGgml},
    WeightQuant{"Q4_1", "", 5.0, kGgml},
    WeightQuant{"Q4_0", "", 4.5, kGgml},
};

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool alias_match(std::string_view aliases, const std::string& want) {
  size_t start = 0;
  while (start <= aliases.size()) {
    const size_t comma = aliases.find(',', start);
    const std::string_view a = aliases.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    if (!a.empty() && lower(a) == want) return true;
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return false;
}

}  // namespace

std::span<const WeightQuant> weight_quant_table() {
  return kTable;
}

Result<WeightQuant> find_weight_quant(std::string_view name) {
  const std::string want = lower(name);
  for (const WeightQuant& q : kTable) {
    if (lower(q.name) == want || alias_match(q.aliases, want)) return q;
  }
  std::string known;
  for (const WeightQuant& q : kTable)
    known += fmt::format("{}{}", known.empty() ? "" : ", ", q.name);
  return Error{fmt::format("unknown weight quantisation '{}'; known: {}", name, known)};
}

uint64_t weight_bytes_for(double n_params, double bits_per_weight) {
  return static_cast<uint64_t>(std::llround(n_params * bits_per_weight / 8.0));
}

}  // namespace bie::planner
