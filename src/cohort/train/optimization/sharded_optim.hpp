// defines: ShardedOptimizer
//
// dist.shard (ZeRO stages 1 and 2, in uneven pieces): every rank keeps the
// AdamW or LAMB moments of its group's range of the flat parameters
// (sync/shard_layout.hpp) and updates only that range; then each
// group's primary broadcasts the range it updated, so every rank holds every
// parameter again. The parameters are views into one flat buffer, so a range
// goes on the wire in place. `optimizer` mode reads its range out of the
// whole gradients GradSync summed; `gradients` mode is GradSync's sink and
// keeps only its range's sums.
//
// The math is the unsharded optimizer's: AdamW's update is elementwise (the
// same fused kernel), and LAMB's per-tensor norms and clipping's global norm
// sum partial squares over the groups' primaries.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/ckpt/safetensors.hpp"
#include "cohort/config/config.hpp"
#include "cohort/sync/bucket_reducer.hpp"
#include "cohort/sync/shard_layout.hpp"
#include "cohort/train/optimization/precision.hpp"
#include "cohort/train/optimization/step_optimizer.hpp"

namespace cohort {

class Comm;

class ShardedOptimizer : public torch::optim::AdamW, public GradShardSink, public StepOptimizer {
 public:
  // Collective: agrees the weights (dist.shard-weights) and the layout.
  ShardedOptimizer(Comm& comm, torch::nn::Module& module, const Config& cfg);

  torch::Tensor step(LossClosure closure = nullptr) override;

  // StepOptimizer: the step.
  torch::optim::Optimizer& optimizer() override { return *this; }
  // GradSync's sink in gradients mode on more than one rank; null otherwise.
  GradShardSink* sink() override { return shard_grads_ ? this : nullptr; }
  void add_reduced(const std::vector<size_t>& params, const torch::Tensor& flat) override;
  GradientSet gradients() override;
  void zero_grad_range() override;

  // StepOptimizer: its state, in ranges. A checkpoint holds one range file
  // per group, written by the group's primary; restore() reads only the files
  // that overlap this rank's range (or takes its range of a whole state);
  // adopt_ranges() deals the survivors' ranges, each sent by its
  // lowest-ranked holder in pieces.
  void write_ranges(Comm& comm, Checkpoints& checkpoints, int64_t step, CheckpointState& record) override;
  std::string restore(const ResolvedCheckpoint& from) override;
  NamedTensors held_ranges() const override;
  std::string adopt_ranges(Comm& comm, const Handover* held, int64_t step) override;
  NamedTensors own_state() const override;
  std::string restore_own(const std::vector<NamedTensors>& island) override;
  // The start-up line: the layout and what this rank holds.
  std::string describe() const override;

  const ShardLayout& layout() const { return layout_; }
  ShardMode mode() const { return mode_; }
  int group() const { return group_; }
  int64_t lo() const { return layout_.lo(group_); }
  int64_t hi() const { return layout_.hi(group_); }
  // False while a step's update is applied but not yet shared: a world that
  // ends then cannot go on from this rank's memory.
  bool consistent() const { return consistent_; }
  torch::TensorOptions state_options() const { return exp_avg_.options(); }

  // This rank's moments over [lo, hi), flat (the live tensors, not copies),
  // each parameter's step count and the range ("exp_avg", "exp_avg_sq",
  // "steps", "range").
  NamedTensors range_state() const;
  // Takes the part of moments over [from, from + n) that lies in this
  // rank's range; `steps` per parameter (the same on every rank).
  void take(int64_t from, const torch::Tensor& exp_avg, const torch::Tensor& exp_avg_sq);
  void set_steps(const torch::Tensor& steps);
  // From a whole optimizer's state over the same parameters (an unsharded
  // checkpoint): its options, its range and the step counts. False when it
  // holds no state.
  bool take_whole(torch::optim::Optimizer& whole);

 private:
  struct Segment {
    size_t param;
    int64_t offset, length, at;
    bool decay;
  };
  void share_params();
  void adamw_step();
  void lamb_step();
  torch::Tensor grad_of(const Segment& s) const;
  torch::Tensor param_of(const Segment& s) const { return flat_params_.narrow(0, starts_[s.param] + s.offset, s.length); }

  Comm& comm_;
  ShardMode mode_;
  OptimizerKind kind_;
  ShardLayout layout_;
  int group_ = 0;
  bool shard_grads_ = false;
  bool auto_weights_ = false;  // dist.shard-weights = auto: by free memory
  bool consistent_ = true;
  std::vector<torch::Tensor> params_;  // trainable, registration order: the flat order
  std::vector<int64_t> starts_;
  torch::Tensor flat_params_;
  std::vector<Segment> segments_;      // this rank's range
  torch::Tensor exp_avg_, exp_avg_sq_;  // over the range
  torch::Tensor grad_;                 // gradients mode: the range's summed gradients
  // The micro-batches' sums in fp64 (GradSync's exact sum), rounded into
  // grad_ once per step by gradients(): the order of the sums then cannot
  // change the result.
  torch::Tensor grad64_;
  bool has_exact_ = false;
  torch::Tensor& exact_sum();
  std::vector<int64_t> steps_;         // per parameter, as libtorch's AdamW counts them (the same on every rank)
  torch::nn::Module& module_;
};

}  // namespace cohort
