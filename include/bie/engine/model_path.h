// Resolving the user's --model argument: a path, or "default" for the model fetched by
// scripts/fetch_models.sh into $BIE_HOME/models (default ~/.cache/bie/models).
#pragma once

#include <memory>
#include <string>

#include "bie/common/result.h"
#include "bie/model/model.h"

namespace bie {

// $BIE_HOME, or ~/.cache/bie.
[[nodiscard]] std::string bie_home();

// "default" -> the SmolLM2-135M-Instruct Q4_1 file; "gemma3" -> Gemma 3 270M Q4_K_M; otherwise
// the argument itself. Errors when the file does not exist, saying how to fetch it.
[[nodiscard]] Result<std::string> resolve_model_path(const std::string& arg);

// resolve_model_path() then load_model(): what every command that runs a model does.
[[nodiscard]] Result<std::unique_ptr<Model>> load_named_model(const std::string& arg,
                                                              LoadOptions opts = {});

}  // namespace bie
