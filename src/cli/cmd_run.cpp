#include <cstdio>

#include "cli/commands.h"

namespace bie::cli {

void add_run_command(CLI::App& root, int* rc) {
  CLI::App* cmd = root.add_subcommand("run", "Generate text from a prompt");
  cmd->callback([rc] {
    std::fprintf(stderr, "bie run: not implemented yet\n");
    *rc = kExitFailure;
  });
}

void add_info_command(CLI::App& root, int* rc) {
  CLI::App* cmd = root.add_subcommand("info", "Describe a model file");
  cmd->callback([rc] {
    std::fprintf(stderr, "bie info: not implemented yet\n");
    *rc = kExitFailure;
  });
}

}  // namespace bie::cli
