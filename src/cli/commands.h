// Sub-commands of the `bie` program. Each add_* registers its sub-command on `root`; when it runs,
// its callback stores the process exit code in *rc. Commands hold no engine logic: they parse
// flags, call the library and print.
#pragma once

#include <CLI/CLI.hpp>

namespace bie::cli {

// Exit codes shared by all sub-commands.
constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;   // runtime failure (model cannot load, out of memory, ...)
constexpr int kExitBadInput = 2;  // bad flags or input the user can fix
constexpr int kExitInterrupted = 130;  // stopped by Ctrl-C (SIGINT), after printing what it had

void add_run_command(CLI::App& root, int* rc);
void add_info_command(CLI::App& root, int* rc);
void add_plan_command(CLI::App& root, int* rc);
void add_bench_command(CLI::App& root, int* rc);
void add_quality_command(CLI::App& root, int* rc);
void add_synth_command(CLI::App& root, int* rc);

}  // namespace bie::cli
