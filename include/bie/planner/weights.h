// Effective bits per weight for a named weight quantisation, for sizing a model without its file
// (the table of ../shared/BRIEF.md §4 plus ggml's fixed-block formats). Constant data; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "bie/common/result.h"

namespace bie::planner {

struct WeightQuant {
  std::string_view name;     // canonical spelling, e.g. "Q4_K_M"
  std::string_view aliases;  // comma-separated other spellings, e.g. "awq,gptq,int4"
  double bits_per_weight;
  std::string_view source;
};

[[nodiscard]] std::span<const WeightQuant> weight_quant_table();

// Case-insensitive lookup by name or alias.
[[nodiscard]] Result<WeightQuant> find_weight_quant(std::string_view name);

// params * bpw / 8, rounded to whole bytes.
[[nodiscard]] uint64_t weight_bytes_for(double n_params, double bits_per_weight);

}  // namespace bie::planner
