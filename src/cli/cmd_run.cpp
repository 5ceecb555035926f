#include "cli/commands.h"
namespace bie::cli {
void add_run_command(CLI::App& root, int* rc) { root.add_subcommand("run", "(pending tokenizer)"); (void)rc; }
}
