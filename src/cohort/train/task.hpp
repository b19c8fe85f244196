// defines: TaskOutput, Task, make_task, task_names
//
// A task bundles a model, its data, its loss and its metrics, and is
// registered by name (train.task). The trainer only sees this interface.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "cohort/data/dataset.hpp"
#include "cohort/eval/tally.hpp"

namespace cohort {

struct Config;
struct World;

struct TaskOutput {
  // Loss summed (not averaged) over the batch's units. The trainer divides by
  // the global unit count, so gradients are a mean over the global batch
  // whatever the world size and the split across ranks.
  torch::Tensor loss_sum;
  int64_t units = 0;  // samples (images) or tokens the loss covers
  Tally tally;        // metric sums and counts, e.g. loss, accuracy
};

class Task {
 public:
  virtual ~Task() = default;
  virtual std::shared_ptr<torch::nn::Module> module() = 0;
  virtual const Dataset& train_set() const = 0;
  // Throws ConfigError for a split this task does not have.
  virtual std::shared_ptr<const Dataset> eval_set(const std::string& split) const = 0;
  // Runs the model on a collated batch (already on the task's device).
  virtual TaskOutput forward(const Example& batch) = 0;
  // The units forward(batch) will report, without running the model: the
  // trainer needs the global count before the first backward.
  virtual int64_t count_units(const Example& batch) const = 0;
  // True when a unit is a sample: the trainer then knows the global count
  // from the batch plan and skips a collective per step.
  virtual bool units_are_samples() const { return false; }
  // What `units` counts, for throughput lines ("images", "tokens").
  virtual std::string unit_name() const = 0;
  // Every metric forward() tallies. Ranks with no samples still report them
  // (as zero sums and counts), so all ranks reduce the same layout.
  virtual std::vector<std::string> metric_names() const = 0;

  // An empty tally holding every metric name.
  Tally empty_tally() const;
};

// Builds train.task on world.device. Throws ConfigError for an unknown name.
std::unique_ptr<Task> make_task(const Config& cfg, const World& world);
std::vector<std::string> task_names();

// Moves every tensor of a batch to `device`.
Example to_device(const Example& batch, const c10::Device& device);

}  // namespace cohort
