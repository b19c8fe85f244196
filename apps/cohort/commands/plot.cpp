#include <cstdio>
#include <filesystem>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/order.hpp"
#include "cohort/obs/plot.hpp"
#include "cohort/train/optimization/optim.hpp"
#include "commands/command.hpp"

namespace cohort::cli {

namespace {

// A run of train.epochs: its length from the training set's size, which a
// checkpoint records; 0 before the first checkpoint.
int64_t steps_of_epochs(const Config& cfg, const std::string& run_dir) {
  if (cfg.train.epochs <= 0 || !std::filesystem::exists(std::filesystem::path(run_dir) / "checkpoints")) return 0;
  const CheckpointState state = Checkpoints::resolve(run_dir, nullptr).state;
  if (state.train_samples <= 0) return 0;
  GlobalOrder order(state.train_samples, cfg.data.global_batch, cfg.train.seed, cfg.data.drop_last, {});
  return cfg.train.epochs * order.steps_per_epoch();
}

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
        int64_t total = run_cfg.train.max_steps;
        if (total <= 0) total = steps_of_epochs(run_cfg, dir_);
        if (total > 0) {
          po.total_steps = total;
          po.lr_at = [s = LrSchedule::from(run_cfg.optim, total)](int64_t step) { return s.at(step); };
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
