// defines: cli_main, configure_process
//
// The `cohort` command line (train, eval, export, prepare, plot, bench) as
// a function, so that a program built on the library is the same tool with
// its own tasks and models registered first:
//
//   int main(int argc, char** argv) {
//     cohort::register_task("my-task", make_my_task);
//     return cohort::cli_main(argc, argv);
//   }
//
// `cohort train --nproc-per-node N` re-executes the running program for its
// ranks, so the workers have the same registrations. Every error ends here
// as one line, `cohort: error: ...`, and an exit code: 2 for usage and
// config mistakes, 1 for runtime failures.
#pragma once

namespace cohort {

struct TrainOptions;
struct World;

int cli_main(int argc, char** argv);

// The process-wide settings a training process wants, made by the program
// and not the library: glibc malloc tuned against page-fault churn on large
// tensors, and intra-op threads (train.threads, or free cores / local ranks).
void configure_process(const TrainOptions& opts, const World& world);

}  // namespace cohort
