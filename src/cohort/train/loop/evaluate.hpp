// defines: EvalRun, evaluate, evaluate_report, evaluate_checkpoint
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "cohort/data/dataset.hpp"
#include "cohort/eval/tally.hpp"

namespace cohort {

class Comm;
class Task;
struct Config;
struct EvalOptions;
struct EvalReport;
struct RunOptions;
struct RunSummary;

// Called after each batch with the samples done of this rank's share and
// the share's size: a progress line.
using EvalProgress = std::function<void(int64_t done, int64_t share)>;

struct EvalRun {
  int64_t batch = 512;        // samples per forward, per rank
  int64_t max_samples = 0;    // 0: all of `data`
  EvalProgress progress;      // null: none
};

// Runs `task` over this rank's shard of `data` (contiguous, no padding, no
// duplicates) in eval mode without gradients, then sums the metric tallies of
// all ranks: the result is the same for every world size. Collective: every
// rank calls it. Throws DataError when `data` is empty.
Tally evaluate(Task& task, const Dataset& data, Comm& comm, const EvalRun& run);

// evaluate() as reported: the split, the sample count and the task's
// metrics, at `step`; the reduced tally too when `reduced` is given. Collective.
EvalReport evaluate_report(Task& task, const Dataset& data, Comm& comm, const EvalOptions& opts, int64_t step,
                           Tally* reduced = nullptr, const EvalProgress& progress = nullptr);

// `cohort eval`: the model of checkpoint run.checkpoint(), evaluated on
// cfg.eval.split; one eval line goes to the reporter (by default the
// console, RUN_DIR/metrics.jsonl and, with log.tensorboard, TensorBoard).
// run.live_progress: a progress line on stderr. Nothing else in the run
// changes.
// `confusion_png` (not ""): also draw the confusion matrix there (a task
// that keeps one: UsageError otherwise, before evaluating).
RunSummary evaluate_checkpoint(const Config& cfg, Comm& comm, const RunOptions& run,
                               const std::string& confusion_png = "");

// `cohort predict`: the model of checkpoint run.checkpoint() on the inputs in
// `input` (the task's input_set), each rank a contiguous share; rank 0
// writes one JSON line per input, in input order, to `output`: its index,
// the predicted label, its probability, every class's probability, and
// the true label when the input has one. The same lines at any world size.
// Collective. Returns the number of inputs.
int64_t predict_checkpoint(const Config& cfg, Comm& comm, const RunOptions& run, const std::string& input,
                           const std::string& output);

}  // namespace cohort
