// defines: GradReduction, OwnGradients
//
// How the inner step's gradients become the ones it applies, as train_step
// sees it: summed over the ranks as backward runs (GradSync, in any wire
// dtype or PowerSGD's products), or each rank's own (dist.sync = local: the
// ranks meet in the outer sync instead). The step calls every method the
// same way whichever it is.
#pragma once

namespace cohort {

class GradReduction {
 public:
  virtual ~GradReduction() = default;
  // True: the applied gradient is the global batch's mean, so every loss
  // term divides by its count over the whole global batch; false: by this
  // rank's own counts.
  virtual bool sums_over_ranks() const = 0;
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
  bool sums_over_ranks() const override { return false; }
  bool reduces_every_micro_batch() const override { return false; }
  void prepare(bool /*sync*/) override {}
  void finalize() override {}
};

}  // namespace cohort
