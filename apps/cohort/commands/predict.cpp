#include <map>

#include "cohort/train/loop/evaluate.hpp"
#include "commands/evaluation.hpp"

namespace cohort::cli {

namespace {

class Predict : public Evaluation {
 public:
  CLI::App* add(CLI::App& app) override {
    add_common(app.add_subcommand(
        "predict", "Predict the classes of the inputs in a TSV or JSONL file (bert-classify) with a checkpoint; "
                   "writes one JSON line per input, in input order: its index and text (or --data.id-column), "
                   "the label, its probability and every class's"));
    sub_->add_option("--input", input_, "inputs: the run's columns; labels optional")->required();
    sub_->add_option("--out,-o", out_, "JSONL to write (default RUN_DIR/predictions.jsonl)");
    sub_->add_option("--batch", batch_, "inputs per forward; 0 = the run's eval.batch")
        ->capture_default_str()->check(at_least(0));
    // The input's columns, when they are not named as in the run's data.
    for (const char* key : {"data.text-column", "data.text-pair-column", "data.label-column", "data.id-column"}) {
      sub_->add_option_function<std::string>(
          std::string("--") + key, [this, key](const std::string& v) { columns_[key] = v; },
          std::string(key) == "data.id-column"
              ? "a column of the input written beside each prediction instead of its text"
              : std::string("the input's column for the run's ") + key);
    }
    add_dist();
    return sub_;
  }

  int run(int argc, char** argv, std::string& who) override {
    auto adjust = [&](Config& cfg) {
      if (batch_ > 0) cfg.eval.batch = batch_;
      for (const auto& [key, value] : columns_) cfg.task[key] = value;
    };
    return evaluate(argc, argv, who, adjust, [&](EvalPlan& plan, Comm& comm) {
      if (out_.empty()) out_ = plan.run.out_dir + "/predictions.jsonl";
      int64_t n = predict_checkpoint(plan.cfg, comm, plan.run, input_, out_);
      if (comm.world().is_main()) {
        std::printf("cohort: wrote %lld predictions to %s\n", static_cast<long long>(n), out_.c_str());
      }
    });
  }

 private:
  std::string input_, out_;
  int64_t batch_ = 0;
  std::map<std::string, std::string> columns_;
};

}  // namespace

std::unique_ptr<Command> predict_command() { return std::make_unique<Predict>(); }

}  // namespace cohort::cli
