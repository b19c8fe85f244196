// defines: StepParts, StepResult, train_step
//
// One optimizer step, the heart of data-parallel training: forward and
// backward over this rank's micro-batches with gradients all-reduced as
// backward runs, then unscale, clip and step. Nothing in it waits for the
// device: metrics and the gradient norm stay there until a log point. Every loss term is divided by
// its unit count over the whole global batch, so the gradient is the same
// mean whatever the world size and however samples split across ranks.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

#include "cohort/config/choice.hpp"
#include "cohort/data/loader.hpp"
#include "cohort/device/device_feed.hpp"
#include "cohort/device/device_tally.hpp"
#include "cohort/train/lifecycle/step_point.hpp"
#include "cohort/train/loop/phase_timer.hpp"
#include "cohort/train/optimization/optim.hpp"

namespace cohort {

class Comm;
class GradReduction;
class StepOptimizer;
class Task;
struct TrainState;

// What a step works with; owned by the trainer, set field by field.
struct StepParts {
  StepParts(Task& task, Comm& comm, GradReduction& reduction, StepOptimizer& optimizer, const LrSchedule& schedule)
      : task(task), comm(comm), reduction(reduction), optimizer(optimizer), schedule(schedule) {}
  Task& task;
  Comm& comm;
  // Summed over the ranks (GradSync), or each rank's own (local steps: the
  // ranks meet in the outer sync every few steps).
  GradReduction& reduction;
  StepOptimizer& optimizer;  // whole, or this rank's range (dist.shard), which may hold only its range's gradients
  const LrSchedule& schedule;
  Precision precision = Precision::kFp32;  // resolved: fp32, bf16 or fp16
  c10::Device device = c10::Device(c10::kCPU);
  double clip_norm = 0;
  DropoutRng dropout_rng = DropoutRng::kSample;
  uint64_t seed = 0;            // train.seed: keys per-sample dropout masks
  ComputeClock* clock = nullptr;  // data.balance = auto: times each forward and backward
  StepHook at;                    // testing aid, at kForwardBegin, kForwardDone and kBackwardDone
};

// What a step leaves on the device for the log point to read
// (TrainLog::settle), so that the step itself never waits for the device.
struct StepResult {
  DeviceTally tally;         // the step's metric sums over all ranks
  torch::Tensor grad_norm;   // the global gradient norm before clipping; non-finite: the step diverged
  int64_t units = 0;         // global throughput units (images, tokens)
  int64_t samples = 0;       // this rank's samples
};

// Takes step `state.step` on `batch` (collective: every rank calls it with
// its share), reading nothing back from the device, except fp16's overflow
// flag (LossScaler). The step's metrics are reduced over the ranks before the
// update is applied. Updates the loss scale; the caller advances the step and
// cursor, and checks grad_norm when it reads the step's metrics.
StepResult train_step(const StepParts& parts, TrainState& state, const StepBatch& batch, PhaseTimer& timer);

}  // namespace cohort
