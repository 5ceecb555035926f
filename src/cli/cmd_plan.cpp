#include <cstdio>

#include "cli/commands.h"

namespace bie::cli {

void add_plan_command(CLI::App& root, int* rc) {
  CLI::App* cmd = root.add_subcommand("plan", "Plan memory and speed for a model, KV format and device");
  cmd->allow_extras();
  cmd->callback([rc] {
    std::fprintf(stderr, "bie plan: not implemented yet\n");
    *rc = kExitFailure;
  });
}

}  // namespace bie::cli
