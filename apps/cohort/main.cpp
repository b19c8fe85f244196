// The cohort command line. Every error ends here as one line,
// `cohort: error: ...`, and an exit code: 2 for usage and config mistakes,
// 1 for runtime failures.
#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include <cstdio>
#include <string>

#include "cohort/config/config.hpp"
#include "cohort/core/error.hpp"
#include "cohort/train/runtime.hpp"
#include "cohort/train/trainer.hpp"

namespace {

int fail(const std::string& msg, int code) {
  std::string line = msg;
  for (char& c : line) {
    if (c == '\n') c = ' ';
  }
  std::fprintf(stderr, "cohort: error: %s\n", line.c_str());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace cohort;
  CLI::App app{"Cohort: data-parallel training of transformer models across heterogeneous machines."};
  app.set_version_flag("--version", "cohort 0.1.0");
  app.require_subcommand(1);

  CLI::App* train = app.add_subcommand("train", "Train a model. Config keys come from --config FILE.toml "
                                                "and from --section.key flags, which win.");
  Config cfg;
  ConfigBinding binding(*train, cfg);
  std::string config_path;
  RunOptions run;
  train->add_option("--config", config_path, "TOML config file; command-line keys override it");
  train->add_option("--out", run.out_dir, "run directory: config.toml, metrics.jsonl")->required();
  train->add_flag("--overwrite", run.overwrite, "replace a run already in --out");
  train->add_flag("--quiet", run.quiet, "no console progress lines");

  if (argc > 1 && argv[1][0] != '-') {
    std::string known;
    bool found = false;
    for (const auto* sub : app.get_subcommands({})) {
      known += (known.empty() ? "" : ", ") + sub->get_name();
      found = found || sub->get_name() == argv[1];
    }
    if (!found)
      return fail("unknown command '" + std::string(argv[1]) + "' (commands: " + known + "; see 'cohort --help')", 2);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return fail(std::string(e.what()) + " (see 'cohort --help')", 2);
  }

  try {
    if (train->parsed()) {
      if (!config_path.empty()) binding.apply_file(config_path);
      validate(cfg);
      run.config_toml = binding.to_toml();
      World world;
      world.device = resolve_device(cfg.train.device, world.local_rank);
      Trainer(cfg, world, run).run();
    }
    return 0;
  } catch (const Error& e) {
    return fail(e.what(), e.exit_code());
  } catch (const c10::Error& e) {
    return fail(e.what_without_backtrace(), 1);
  } catch (const std::exception& e) {
    return fail(e.what(), 1);
  }
}
