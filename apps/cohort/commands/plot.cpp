#include <cstdio>
#include <filesystem>

#include "cohort/core/error.hpp"
#include "cohort/obs/plot.hpp"
#include "cohort/train/optim.hpp"
#include "commands/command.hpp"

namespace cohort::cli {

namespace {

class Plot : public Command {
 public:
  CLI::App* add(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand("plot", "Draw RUN_DIR/metrics.jsonl as a PNG (loss, lr, throughput, eval)");
    sub->add_option("RUN_DIR", dir_, "run directory")->required();
    sub->add_option("--out,-o,--output", out_, "PNG to write (default RUN_DIR/plots.png)");
    return sub;
  }

  int run(int, char**, std::string&) override {
    PlotOptions po;
    po.output = out_;
    // The schedule the run followed, drawn whole, when its length is known.
    if (auto toml = std::filesystem::path(dir_) / "config.toml"; std::filesystem::exists(toml)) {
      try {
        Config run_cfg = load_config(toml.string());
        if (run_cfg.train.max_steps > 0) {
          po.total_steps = run_cfg.train.max_steps;
          po.lr_at = [s = LrSchedule::from(run_cfg.optim, run_cfg.train.max_steps)](int64_t step) { return s.at(step); };
        }
      } catch (const Error& e) {
        std::fprintf(stderr, "cohort: note: the learning-rate schedule is left out: %s\n", e.what());
      }
    }
    std::printf("cohort: wrote %s\n", plot_run(dir_, po).c_str());
    return 0;
  }

 private:
  std::string dir_, out_;
};

}  // namespace

std::unique_ptr<Command> plot_command() { return std::make_unique<Plot>(); }

}  // namespace cohort::cli
