#include "bie/gguf/ggml_type_info.h"

#include <array>

namespace bie::gguf {

namespace {

// Indexed by ggml type id. Ids 4, 5 (old Q4_2/Q4_3) and 31..33, 36..38 (removed repacked
// variants) are holes. Sizes from ggml's block structs (d/dmin are fp16 unless noted).
constexpr std::array<GgmlTypeInfo, 40> kTypes = {{
    {"f32", 1, 4},         // 0
    {"f16", 1, 2},         // 1
    {"q4_0", 32, 18},      // 2: d + 16 B nibbles
    {"q4_1", 32, 20},      // 3: d, m + 16 B
    {"", 0, 0},            // 4
    {"", 0, 0},            // 5
    {"q5_0", 32, 22},      // 6: d + 4 B high bits + 16 B
    {"q5_1", 32, 24},      // 7: d, m + 4 B + 16 B
    {"q8_0", 32, 34},      // 8: d + 32 B
    {"q8_1", 32, 36},      // 9: d, s + 32 B
    {"q2_K", 256, 84},     // 10
    {"q3_K", 256, 110},    // 11
    {"q4_K", 256, 144},    // 12
    {"q5_K", 256, 176},    // 13
    {"q6_K", 256, 210},    // 14
    {"q8_K", 256, 292},    // 15: f32 d + 256 B + 16 x int16 bsums
    {"iq2_xxs", 256, 66},  // 16
    {"iq2_xs", 256, 74},   // 17
    {"iq3_xxs", 256, 98},  // 18
    {"iq1_s", 256, 50},    // 19
    {"iq4_nl", 32, 18},    // 20
    {"iq3_s", 256, 110},   // 21
    {"iq2_s", 256, 82},    // 22
    {"iq4_xs", 256, 136},  // 23
    {"i8", 1, 1},          // 24
    {"i16", 1, 2},         // 25
    {"i32", 1, 4},         // 26
    {"i64", 1, 8},         // 27
    {"f64", 1, 8},         // 28
    {"iq1_m", 256, 56},    // 29
    {"bf16", 1, 2},        // 30
    {"", 0, 0},            // 31
    {"", 0, 0},            // 32
    {"", 0, 0},            // 33
    {"tq1_0", 256, 54},    // 34
    {"tq2_0", 256, 66},    // 35
    {"", 0, 0},            // 36
    {"", 0, 0},            // 37
    {"", 0, 0},            // 38
    {"mxfp4", 32, 17},     // 39: e8m0 scale + 16 B
}};

}  // namespace

std::optional<GgmlTypeInfo> ggml_type_info(uint32_t type_id) {
  if (type_id >= kTypes.size() || kTypes[type_id].block_size == 0) return std::nullopt;
  return kTypes[type_id];
}

}  // namespace bie::gguf
