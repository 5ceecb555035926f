// bie: run, info, plan, bench, quality.
#include <cstdio>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"bie — Benni Inference Engine"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "bie 0.1.0");
  int rc = bie::cli::kExitOk;
  bie::cli::add_run_command(app, &rc);
  bie::cli::add_info_command(app, &rc);
  bie::cli::add_plan_command(app, &rc);
  bie::cli::add_bench_command(app, &rc);
  bie::cli::add_quality_command(app, &rc);
  bie::cli::add_synth_command(app, &rc);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);            // --help, --version
    std::fprintf(stderr, "bie: %s (see --help)\n", e.what());  // one line, exit code 2
    return bie::cli::kExitBadInput;
  }
  return rc;
}
