#include "model/architectures.h"

namespace bie {

namespace {

// clang-format off
constexpr ArchSpec kArchitectures[] = {
    // name       rope                 act                    ctx   eps    qk_norm post   embd   scale_q swa    softcap
    // llama 2/3, SmolLM2 (GGUF Q/K are pre-permuted for adjacent-pair rope)
    {"llama",   RopeLayout::kNorm, FfnActivation::kSilu, 2048, 1e-5f, false, false, false, false, false, false},
    {"mistral", RopeLayout::kNorm, FfnActivation::kSilu, 2048, 1e-5f, false, false, false, false, false, false},
    // qwen2 / qwen2.5: QKV bias (bound when present), rope on halves
    {"qwen2",   RopeLayout::kNeox, FfnActivation::kSilu, 2048, 1e-5f, false, false, false, false, false, false},
    // Gemma 3 (text), as llama.cpp's gemma3 graph
    {"gemma3",  RopeLayout::kNeox, FfnActivation::kGelu, 8192, 1e-6f, true,  true,  true,  true,  true,  true},
};
// clang-format on

}  // namespace

std::span<const ArchSpec> architecture_table() {
  return kArchitectures;
}

}  // namespace bie
