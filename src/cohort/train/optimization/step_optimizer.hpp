// defines: StepOptimizer, RangeSource, ShardsLost, read_ranges, make_step_optimizer
//
// The optimizer stage of a step, as one part whatever dist.shard is: what
// the step applies the summed gradients with, and the state it owns, saved
// and restored by itself. Two kinds: a whole optimizer (AdamW, LAMB or SGD
// over every parameter, its state in optimizer.pt) and ShardedOptimizer
// (sharded_optim.hpp: each rank's range of the moments, in range files).
// The trainer, the checkpoint keeper and the elastic hand-over ask this
// part, never which kind it is.
//
// Either kind reads either kind's checkpoint, at any world size: ranges come
// from a RangeSource, a checkpoint's range files or the survivors' memory,
// and one routine (RangeSource::for_each) deals them to what each rank keeps.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/ckpt/safetensors.hpp"
#include "cohort/config/config.hpp"
#include "cohort/core/error.hpp"
#include "cohort/train/optimization/precision.hpp"

namespace cohort {

class Comm;
class GradShardSink;
struct Handover;

// A new elastic world would go on from memory but cannot: a range of the
// sharded optimizer state (dist.shard-replicas = 1, or every holder lost)
// is gone. It goes on from the run's latest checkpoint instead.
class ShardsLost : public Error {
 public:
  using Error::Error;
};

// Ranges of AdamW's moments over the flat parameters (registration order,
// end to end), in order and covering [0, total): where they come from.
struct RangeSource {
  struct Range {
    int64_t lo = 0, hi = 0;
  };
  std::vector<Range> ranges;
  // Every rank takes part in every range (its pieces are broadcasts); else
  // a rank reads only the ranges that overlap what it wants.
  bool collective = false;
  // Range i's moments over [at, at + n), on this rank (collective: every
  // rank calls it, in the same order).
  std::function<std::pair<torch::Tensor, torch::Tensor>(size_t i, int64_t at, int64_t n)> piece;
  // Each parameter's step count (the same in every range).
  std::function<torch::Tensor()> steps;

  // The one re-shard routine: `take(at, exp_avg, exp_avg_sq)` for every
  // piece that overlaps [lo, hi) (collective sources: every piece, in
  // order), in pieces of at most `piece_floats`.
  void for_each(int64_t lo, int64_t hi, int64_t piece_floats,
                const std::function<void(int64_t at, const torch::Tensor&, const torch::Tensor&)>& take) const;
};

// A sharded checkpoint's range files (optimizer.shard-G.safetensors), each
// read once when first asked for and checked against state.json's record.
RangeSource read_ranges(const ResolvedCheckpoint& from);

class StepOptimizer {
 public:
  virtual ~StepOptimizer() = default;
  // The libtorch optimizer the step calls (learning rate, step()) and
  // optimizer.pt archives.
  virtual torch::optim::Optimizer& optimizer() = 0;

  // --- The step.
  // GradSync's sink when the summed gradients are kept in ranges
  // (dist.shard = gradients on several ranks); null when whole.
  virtual GradShardSink* sink() { return nullptr; }
  // Before each step's first backward.
  virtual void zero_grad_range() {}
  // The gradients this step applies, as this rank holds them.
  virtual GradientSet gradients() = 0;

  // --- Its state.
  // Collective, at a checkpoint: records the ranges in `record` and has each
  // range's first holder write its file into the checkpoint being written
  // (`checkpoints`, at `step`). A whole optimizer writes nothing here: rank
  // 0's optimizer.pt holds its state.
  virtual void write_ranges(Comm& comm, Checkpoints& checkpoints, int64_t step, CheckpointState& record) = 0;
  // A checkpoint's state, whichever kind wrote it and at any world size.
  // Returns a note for the log when its layout changed, else "".
  virtual std::string restore(const ResolvedCheckpoint& from) = 0;
  // Elastic: this process's range at the last completed step (clones), for
  // the hand-over; empty when whole, or while an update is half shared.
  virtual NamedTensors held_ranges() const { return {}; }
  // Elastic, collective: the new world's ranges from the members' held ones
  // (after the whole archive every rank took from rank 0). A note for the
  // log, or "" when whole; ShardsLost when a range has no holder left.
  virtual std::string adopt_ranges(Comm& /*comm*/, const Handover* /*held*/, int64_t /*step*/) { return ""; }
  // --- Its state as each rank's own. Under dist.sync = local every island
  // steps its own optimizer, so the sync stage keeps every rank's state in
  // the checkpoint (beside the range files or optimizer.pt, which hold the
  // first island's).
  // What this rank holds: a whole optimizer's archive ("optimizer"), or its
  // range of the moments ("optimizer.exp_avg", "optimizer.exp_avg_sq",
  // "optimizer.steps", "optimizer.range").
  virtual NamedTensors own_state() const = 0;
  // From the own states of one writer island's ranks (in their rank order),
  // whichever kind wrote them: a whole archive, or ranges that cover the
  // parameters. A note when the state was re-laid (joined, re-sharded),
  // else "".
  virtual std::string restore_own(const std::vector<NamedTensors>& island) = 0;

  // The start-up line, or "".
  virtual std::string describe() const { return ""; }
};

// An optimizer's torch::save archive as bytes, and back onto `device` (a
// checkpoint's tensors are read on the CPU).
torch::Tensor archive_bytes(torch::optim::Optimizer& optimizer);
void load_archive(torch::optim::Optimizer& optimizer, const torch::Tensor& bytes, const torch::Device& device);
// The tensor called `name`, or an undefined one.
torch::Tensor named_or_none(const NamedTensors& tensors, const std::string& name);

// The ranges among own states (StepOptimizer::own_state), each once, in
// order; a source with no ranges when they hold a whole archive instead.
// DataError when they leave part of [0, total) uncovered.
RangeSource own_ranges(const std::vector<NamedTensors>& island, int64_t total);

// make_optimizer's whole optimizer, or a ShardedOptimizer when dist.shard
// is on (collective then: the ranks agree on the layout).
std::unique_ptr<StepOptimizer> make_step_optimizer(Comm& comm, const Config& cfg, torch::nn::Module& module);

}  // namespace cohort
