#include "cohort/train/loop/evaluate.hpp"
#include "commands/evaluation.hpp"

namespace cohort::cli {

namespace {

class Eval : public Evaluation {
 public:
  CLI::App* add(CLI::App& app) override {
    add_common(app.add_subcommand("eval", "Evaluate a checkpoint on a split with the run's own config; appends an "
                                          "eval line to RUN_DIR/metrics.jsonl"));
    sub_->add_option("--split", request_.split, "split to evaluate")->capture_default_str();
    sub_->add_option("--max-samples", request_.max_samples, "the first N samples only; 0 = all")
        ->capture_default_str()->check(at_least(0));
    sub_->add_flag("--plot", plot_,
                   "also draw the confusion matrix (bert-classify) as RUN_DIR/confusion-SPLIT-step-N.png");
    add_dist();
    return sub_;
  }

  int run(int argc, char** argv, std::string& who) override {
    return evaluate(argc, argv, who, [](Config&) {}, [&](EvalPlan& plan, Comm& comm) {
      std::string png;
      if (plot_) {
        png = plan.run.out_dir + "/confusion-" + plan.cfg.eval.split + "-step-" +
              std::to_string(plan.run.checkpoint()->state.step) + ".png";
      }
      evaluate_checkpoint(plan.cfg, comm, plan.run, png);
    });
  }

 private:
  bool plot_ = false;
};

}  // namespace

std::unique_ptr<Command> eval_command() { return std::make_unique<Eval>(); }

}  // namespace cohort::cli
