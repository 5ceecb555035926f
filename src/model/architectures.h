// Constructors of the architectures load_model() knows. Each throws model_loader::LoadError on
// a file it cannot bind.
#pragma once

#include <memory>

#include "bie/model/model.h"

namespace bie {

std::unique_ptr<Model> make_llama_model(std::unique_ptr<gguf::GgufFile> file,
                                        const LoadOptions& opts);
std::unique_ptr<Model> make_gemma3_model(std::unique_ptr<gguf::GgufFile> file,
                                         const LoadOptions& opts);

}  // namespace bie
