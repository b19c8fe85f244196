// defines: default_reporter, rank_reporter, report_phases, start_lines
//
// Where a run's reports go, and the per-phase step times of a train line.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cohort/config/config.hpp"
#include "cohort/obs/reporter.hpp"
#include "cohort/train/lifecycle/run.hpp"
#include "cohort/train/loop/phase_timer.hpp"
#include "cohort/train/optimization/optim.hpp"

namespace cohort {

class Balancer;
class Comm;
class Dataset;
class GlobalOrder;
class Task;
struct World;

// The console (unless run.quiet), RUN_DIR/metrics.jsonl and, as `log`
// asks, RUN_DIR/tensorboard/ and an MLflow run. Rank 0 only.
std::shared_ptr<ReporterFanOut> default_reporter(const RunOptions& run, const LogOptions& log);

// Where this rank reports: rank 0 to run.reporter, or the default one; the
// other ranks to a silent Reporter.
std::shared_ptr<Reporter> rank_reporter(const RunOptions& run, const World& world, const LogOptions& log);

// A log interval's per-phase step times into `r`: the slowest rank's per
// phase, and the rank with the most compute (forward + backward +
// optimizer: the others spend the difference waiting in communication).
// Collective.
void report_phases(Comm& comm, const PhaseTimer& timer, TrainReport& r);

// What a run says as it begins, after its notes: the model and where it
// runs, the data, the batch and schedule, data.balance's split, and "nothing
// to do" when `step` is already `total_steps`.
std::vector<std::string> start_lines(const Config& cfg, Task& task, const Dataset& eval, Precision precision,
                                     const World& world, const GlobalOrder& order, const LrSchedule& schedule,
                                     const Balancer& balancer, int64_t step, int64_t total_steps);

}  // namespace cohort
