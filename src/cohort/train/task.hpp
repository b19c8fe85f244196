// defines: TaskOutput, Units, Task, TaskFactory, register_task, make_task, task_names
//
// A task bundles a model, its data, its loss and its metrics, and is
// registered by name (train.task). The trainer only sees this interface.
// A program adds its own with register_task (see examples/extend/).
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cohort/data/dataset.hpp"
#include "cohort/device/device_tally.hpp"
#include "cohort/eval/tally.hpp"

namespace cohort {

struct Config;
struct TaskKey;
struct World;

struct TaskOutput {
  // One loss per term (an image task has one; BERT has MLM and NSP), each
  // summed, not averaged, over its own units. The trainer divides each by its
  // global unit count, so gradients are per-term means over the global batch
  // whatever the world size and the split across ranks.
  std::vector<torch::Tensor> loss_sums;
  // Metric sums and counts, e.g. loss, accuracy. Add sums as tensors
  // (loss.detach(), correct.sum()): the trainer reads them once per log
  // interval, so that a step never waits for the device.
  DeviceTally tally;
};

// What forward(batch) will be normalised by, known without running the model.
struct Units {
  std::vector<int64_t> per_term;  // one count per loss term
  int64_t throughput = 0;         // what unit_name() counts, for rates
};

class Task {
 public:
  virtual ~Task() = default;
  virtual std::shared_ptr<torch::nn::Module> module() = 0;
  virtual const Dataset& train_set() const = 0;
  // Throws ConfigError for a split this task does not have.
  virtual std::shared_ptr<const Dataset> eval_set(const std::string& split) const = 0;
  // Adds to a batch, while it is still on the host, what forward would
  // otherwise read back from the device (bert-pretrain: the indices of the
  // real masked tokens), and checks it (token ids within the vocabulary).
  // The trainer and evaluation call it before the batch moves to the device.
  virtual void add_host_inputs(Example& batch) const { (void)batch; }
  // Runs the model on a collated batch (already on the task's device), after
  // add_host_inputs. It reads nothing back from the device.
  virtual TaskOutput forward(const Example& batch) = 0;
  // The units forward(batch) will report: the trainer needs the global
  // counts before the first backward.
  virtual Units count_units(const Example& batch) const = 0;
  // How many loss terms forward() returns.
  virtual size_t loss_terms() const { return 1; }
  // True when the only loss term is per sample: the trainer then knows the
  // global count from the batch plan and skips a collective per step.
  virtual bool units_are_samples() const { return false; }
  // True when a loss term may have no units in a whole global batch
  // (bert-pretrain's dynamic masks can pick no token of a few short rows);
  // the term then adds nothing that step. Otherwise no units is an error.
  virtual bool units_may_be_zero() const { return false; }
  // What Units::throughput counts ("images", "tokens").
  virtual std::string unit_name() const = 0;
  // Every metric forward() tallies. Ranks with no samples still report them
  // (as zero sums and counts), so all ranks reduce the same layout.
  virtual std::vector<std::string> metric_names() const = 0;
  // The metrics a reduced tally reports, in print order; by default every
  // tallied name's mean (0 when nothing was counted). Must include "loss".
  virtual std::vector<std::pair<std::string, double>> report(const Tally& tally) const;
  // The metric whose count is the number of evaluated samples.
  virtual std::string count_metric() const { return "loss"; }
  // What `cohort eval` says beyond the metrics: a line for the terminal (a
  // per-class summary) and a table for a file (the confusion matrix). Both
  // "" for a task with none.
  struct EvalDetails {
    std::string summary;
    std::string table;
  };
  virtual EvalDetails eval_details(const Tally& /*tally*/) const { return {}; }
  // The confusion matrix in `tally` (rows true, columns predicted, in
  // class_names() order), for `cohort eval --plot`; empty when the task
  // keeps none.
  virtual std::vector<std::vector<double>> confusion(const Tally& /*tally*/) const { return {}; }

  // model.init for fine-tuning: true lets the task start from weights that
  // lack its heads (initialised) or hold others (ignored), logged by name.
  virtual bool init_partially() const { return false; }
  // model.init without init_partially: tensors the model or the file may
  // lack and still load (bert-pretrain: the pooler and NSP head, so that
  // MLM-only training starts from a BertForPreTraining and back); the rest
  // must match.
  virtual bool init_may_skip(const std::string& name) const {
    (void)name;
    return false;
  }
  // Files the run directory keeps for this task (name -> contents; a name
  // may hold a folder), e.g. the label names and the tokenizer that
  // `cohort export` copies; written by rank 0 when the run starts.
  virtual std::vector<std::pair<std::string, std::string>> run_files() const { return {}; }

  // `cohort predict`: the inputs in `path` (labels optional), the class
  // names, and the class probabilities [B, classes] of a batch of them.
  // By default a task cannot predict (UsageError).
  virtual std::shared_ptr<const Dataset> input_set(const std::string& path) const;
  // What a predict line shows of input `index` of input_set's dataset (its
  // text, or the id column the user named); nothing by default.
  virtual std::vector<std::pair<std::string, std::string>> input_fields(const Dataset& /*inputs*/,
                                                                        int64_t /*index*/) const {
    return {};
  }
  virtual std::vector<std::string> class_names() const { return {}; }
  virtual torch::Tensor probabilities(const Example& batch);

  // An empty tally holding every metric name.
  Tally empty_tally() const;
};

// A tally's mean, 0 when its count is 0 (a rank with an empty share).
double mean_or_zero(const Tally& tally, const std::string& name);

// Builds a task from the config, on world.device.
using TaskFactory = std::function<std::unique_ptr<Task>(const Config& cfg, const World& world)>;

// Makes `name` a train.task, with config keys of its own (`keys`: on the
// command line and in config files like the built-in keys; the task reads
// them with cfg.task_key<T>). Call it before the config is used (in main,
// before cohort::cli_main). UsageError when the name or a key is taken.
void register_task(const std::string& name, TaskFactory factory, const std::vector<TaskKey>& keys = {});

// Builds train.task on world.device. Throws ConfigError for an unknown name,
// listing the registered ones.
std::unique_ptr<Task> make_task(const Config& cfg, const World& world);
std::vector<std::string> task_names();

// Moves every tensor of a batch to `device`.
Example to_device(const Example& batch, const c10::Device& device);

}  // namespace cohort
