// defines: GradReduction, OwnGradients
//
// How the inner step's gradients become the ones it applies, as train_step
// sees it: summed over a group of ranks as backward runs (GradSync, in any
// wire dtype or PowerSGD's products: the world, or an island's ranks under
// dist.sync = local), or each rank's own (local steps with islands of one
// rank: the ranks meet in the outer sync instead). The step calls every
// method the same way whichever it is.
#pragma once

namespace cohort {

class Comm;

class GradReduction {
 public:
  virtual ~GradReduction() = default;
  // The ranks whose gradients the applied one sums: its mean over their
  // samples, so every loss term divides by its count over those ranks'
  // share of the batch. Null: this rank's own gradients and counts.
  virtual Comm* summed_over() const = 0;
  // Every micro-batch's gradients are summed (dist.shard = gradients), so
  // every rank runs as many micro-batch rounds, empty ones included.
  virtual bool reduces_every_micro_batch() const = 0;
  // Before each micro-batch's backward; `sync` for the step's last one.
  virtual void prepare(bool sync) = 0;
  // After the step's last backward: the applied gradients are in place.
  virtual void finalize() = 0;
};

// Each rank's gradients stay its own: nothing to do.
class OwnGradients : public GradReduction {
 public:
  Comm* summed_over() const override { return nullptr; }
  bool reduces_every_micro_batch() const override { return false; }
  void prepare(bool /*sync*/) override {}
  void finalize() override {}
};

}  // namespace cohort
