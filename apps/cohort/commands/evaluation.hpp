// defines: Evaluation
//
// What `cohort eval` and `cohort predict` share: a checkpoint evaluated with
// its run's config, as one process or as a job of ranks, like train.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include "cohort/cli.hpp"
#include "cohort/train/lifecycle/run.hpp"
#include "commands/command.hpp"

namespace cohort::cli {

class Evaluation : public Command {
 protected:
  // The CHECKPOINT argument and the distributed flags on `sub`.
  void add_common(CLI::App* sub) {
    sub_ = sub;
    sub_->add_option("CHECKPOINT", request_.checkpoint, "a run dir (its newest checkpoint) or a checkpoint dir")
        ->required();
  }
  void add_dist() { dist_.add(*sub_, /*elastic=*/false); }

  // Plans the evaluation (the run's config, `adjust`ed), starts the ranks
  // or joins them, and calls `work` on each rank with its communicator.
  template <class Adjust, class Work>
  int evaluate(int argc, char** argv, std::string& who, Adjust adjust, Work work) {
    EvalPlan plan = plan_evaluation(request_);
    adjust(plan.cfg);
    validate(plan.cfg);
    Env env = process_env();
    if (auto code = dist_.launch_ranks(*sub_, env, plan.cfg, argc, argv)) return *code;
    dist_.complete(plan.cfg, 0);
    auto spec = detect_rank_spec(env, dist_.launch.init_method);
    std::unique_ptr<Comm> comm = spec ? Comm::connect(*spec, dist_.comm) : Comm::single(plan.cfg.train.device);
    if (comm->size() > 1) who = "rank " + std::to_string(comm->rank()) + ": ";
    // Only the process that reports draws a progress line (under mpirun every rank has a terminal).
    plan.run.live_progress = comm->world().is_main() && isatty(fileno(stderr)) != 0;
    configure_process(plan.cfg.train, comm->world());
    work(plan, *comm);
    return 0;
  }

  CLI::App* sub_ = nullptr;
  EvalRequest request_;
  DistFlags dist_;
};

}  // namespace cohort::cli
