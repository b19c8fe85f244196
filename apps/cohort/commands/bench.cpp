#include <sstream>

#include "cohort/launch/bench.hpp"
#include "commands/command.hpp"

namespace cohort::cli {

namespace {

class Bench : public Command {
 public:
  CLI::App* add(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand(
        "bench", "Weak-scaling table: a short run of a config at each rank count (per-rank batch fixed). "
                 "Extra arguments after -- go to `cohort train`");
    // One token, split here: a vector option would swallow a following "--".
    sub->add_option_function<std::string>(
           "--ranks",
           [this](const std::string& list) {
             opts_.ranks.clear();
             std::stringstream in(list);
             for (std::string item; std::getline(in, item, ',');) {
               size_t used = 0;
               int n = 0;
               try {
                 n = std::stoi(item, &used);
               } catch (const std::exception&) {
                 used = 0;
               }
               if (used != item.size() || n < 1) throw CLI::ValidationError("--ranks", "'" + item + "' is not a rank count >= 1");
               opts_.ranks.push_back(n);
             }
           },
           "rank counts to run, e.g. 1,2,4")
        ->default_str("1,2");
    sub->add_option("--per-rank-batch", opts_.per_rank_batch, "samples per rank per step")->capture_default_str();
    sub->add_option("--steps", opts_.steps, "optimizer steps per run")->capture_default_str();
    sub->add_option("--threads-per-rank", opts_.threads_per_rank, "intra-op threads per rank")
        ->capture_default_str();
    sub->add_option("--peer", opts_.peer, "also run PyTorch DDP on the same model and batch: pytorch");
    sub->add_option("--hosts", opts_.hosts, "also run each rank count on N network-namespace hosts (root)")
        ->capture_default_str();
    sub->add_option("--netem", opts_.netem, "tc netem options for each host's link, e.g. 'delay 1ms rate 1gbit'");
    sub->add_option("--out", opts_.out_dir, "keep the runs here (default: a temp dir, removed)");
    sub->add_option("train-args", train_args_, "arguments for `cohort train` (--config, --model.*, ...)");
    sub->allow_extras(false);
    return sub;
  }

  int run(int, char**, std::string&) override { return run_bench(opts_, train_args_); }

 private:
  BenchOptions opts_;
  std::vector<std::string> train_args_;
};

}  // namespace

std::unique_ptr<Command> bench_command() { return std::make_unique<Bench>(); }

}  // namespace cohort::cli
