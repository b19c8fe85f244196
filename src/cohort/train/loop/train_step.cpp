#include "cohort/train/loop/train_step.hpp"

#include <algorithm>
#include <optional>

#include "cohort/core/error.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/model/dropout.hpp"
#include "cohort/obs/reporter.hpp"
#include "cohort/sync/grad_reduction.hpp"
#include "cohort/train/lifecycle/train_state.hpp"
#include "cohort/train/optimization/precision.hpp"
#include "cohort/train/optimization/step_optimizer.hpp"
#include "cohort/train/task.hpp"

namespace cohort {

namespace {

// Zeroes gradients in place. (libtorch's Optimizer::zero_grad detaches them
// in place, which views into GradSync's buckets do not allow.)
void zero_gradients(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters()) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
}

// Unit counts per loss term over the ranks whose gradients the step sums
// (the world, an island, or this rank alone), then the throughput count over
// the world, known before any backward: from the batch plan, or small
// all-reduces.
std::vector<double> global_units(const StepParts& parts, const StepBatch& batch, int64_t step) {
  Comm* group = parts.reduction.summed_over();
  const bool world = group && group->size() == parts.comm.size();
  const auto global_samples = static_cast<double>(batch.global_samples);
  std::vector<double> units(parts.task.loss_terms() + 1, global_samples);
  if (!(world && parts.task.units_are_samples())) {
    std::vector<double> local(units.size(), 0.0);
    for (size_t m = 0; m < batch.micro.size(); ++m) {
      if (batch.micro[m].empty()) continue;
      Units u = parts.task.units_are_samples() ? Units{} : parts.task.count_units(batch.micro[m]);
      auto rows = static_cast<double>(batch.micro_rows.at(m).size());
      for (size_t i = 0; i + 1 < local.size(); ++i) {
        local[i] += parts.task.units_are_samples() ? rows : static_cast<double>(u.per_term.at(i));
      }
      local.back() += parts.task.units_are_samples() ? rows : static_cast<double>(u.throughput);
    }
    if (world) {
      units = parts.comm.all_reduce_sum(local, "unit count");
    } else {
      units = group ? group->all_reduce_sum(local, "unit count") : local;
      units.back() = parts.task.units_are_samples()
                         ? global_samples
                         : parts.comm.all_reduce_sum(std::vector<double>{local.back()}, "unit count")[0];
    }
  }
  for (size_t i = 0; i + 1 < units.size(); ++i) {
    // A term with no units in the summed batch adds nothing to the step:
    // where the task allows it (dynamic masking that picked no token of a few
    // short rows), or on a rank (island) dealt nothing this step; elsewhere
    // the data is broken.
    COHORT_CHECK(units[i] > 0 || parts.task.units_may_be_zero() || !world, Error, "step ", step,
                 ": the global batch has no units for loss term ", i);
    units[i] = std::max(units[i], 1.0);
  }
  return units;
}

// How many micro-batch rounds this step runs: this rank's micro-batches,
// or, when GradSync reduces every micro-batch (dist.shard = gradients), the
// most any rank has (shares differ between ranks),
// so that every rank issues as many sums; the extra rounds are empty.
size_t reduce_rounds(const StepParts& parts, const StepBatch& batch) {
  if (!parts.reduction.reduces_every_micro_batch()) return batch.micro.size();
  Comm& group = *parts.reduction.summed_over();
  std::vector<double> counts(group.size(), 0.0);
  counts[group.rank()] = static_cast<double>(batch.micro.size());
  counts = group.all_reduce_sum(counts, "micro-batch count");
  return static_cast<size_t>(*std::max_element(counts.begin(), counts.end()));
}

}  // namespace

StepResult train_step(const StepParts& parts, TrainState& state, const StepBatch& batch, PhaseTimer& timer) {
  auto& module = *parts.task.module();
  module.train();
  zero_gradients(module);
  parts.optimizer.zero_grad_range();
  std::vector<double> units = global_units(parts, batch, state.step);
  StepResult result;
  const size_t rounds = reduce_rounds(parts, batch);
  for (size_t m = 0; m < rounds; ++m) {
    parts.reduction.prepare(/*sync=*/m + 1 == rounds);  // only the last backward communicates
    if (m >= batch.micro.size() || batch.micro[m].empty()) continue;  // an empty round still takes its part
    const Example& micro = batch.micro[m];
    auto t0 = Clock::now();
    if (parts.clock) parts.clock->start();
    if (parts.at) parts.at(StepPoint::kForwardBegin, state.step + 1);
    TaskOutput out;
    {
      std::optional<DropoutRows> rows, packed_rows;
      if (parts.dropout_rng == DropoutRng::kSample) {
        const Slice r = batch.micro_rows.at(m);
        rows.emplace(parts.seed, state.step,
                     std::vector<int64_t>(batch.indices.begin() + r.begin, batch.indices.begin() + r.end));
        // Packed rows' token keys from the host's copy of the batch.
        if (micro.count("seq_ids")) packed_rows.emplace(*rows, micro.at("seq_ids"), micro.at("position_ids"));
      }
      AutocastScope autocast(parts.precision, parts.device);
      out = parts.task.forward(m < batch.staged.size() ? batch.staged[m] : to_device(micro, parts.device));
    }
    if (parts.at) parts.at(StepPoint::kForwardDone, state.step + 1);
    auto t1 = timer.lap(Phase::kForward, t0);
    torch::Tensor loss = out.loss_sums.at(0) / units[0];
    for (size_t i = 1; i < out.loss_sums.size(); ++i) loss = loss + out.loss_sums[i] / units[i];
    state.scaler.scale(loss).backward();
    if (parts.at) parts.at(StepPoint::kBackwardDone, state.step + 1);  // (a slowed rank's delay counts)
    if (parts.clock) parts.clock->stop();
    timer.lap(Phase::kBackward, t1);
    result.samples += batch.micro_rows.at(m).size();
    result.tally.merge(out.tally);
  }
  auto t_comm = Clock::now();
  parts.reduction.finalize();
  // The step's metrics are summed over the ranks before its update is
  // applied, so every rank that applies it holds its whole record: when a
  // member is lost right after, the survivors can still log the step. On a
  // GPU the sum is queued on the device like the rest of the step.
  const Tally layout = parts.task.empty_tally();
  torch::Tensor metrics = result.tally.flatten(layout, parts.device);
  parts.comm.all_reduce_sum(metrics, "step metrics");
  result.tally = DeviceTally::unflatten(layout, metrics);
  auto t_optim = timer.lap(Phase::kComm, t_comm);
  result.units = static_cast<int64_t>(units.back());
  // The gradients are all-reduced, so every rank sees the same ones and takes
  // the same decision (local steps: each rank its own). fp16: an overflow
  // skips the step and lowers the loss scale. Otherwise a non-finite gradient
  // is fatal (training diverged): the log point that reads grad_norm says so.
  GradientSet grads = parts.optimizer.gradients();
  if (state.scaler.unscale_and_update(grads)) {
    result.grad_norm = clip_gradients(grads, parts.clip_norm);  // global: the gradients are reduced
    set_lr(parts.optimizer.optimizer(), parts.schedule.at(state.step));
    parts.optimizer.optimizer().step();
  }
  timer.lap(Phase::kOptim, t_optim);
  return result;
}

}  // namespace cohort
