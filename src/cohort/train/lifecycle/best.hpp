// defines: BestMetric
//
// ckpt.best-metric and train.early-stop-patience: the best evaluation so
// far, where it was reached, and how many evaluations have not beaten it.
// Every rank sees the same reduced metrics, so every rank takes the same
// decisions without a collective. Lower is better for a loss.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "cohort/obs/reporter.hpp"

namespace cohort {

class BestMetric {
 public:
  BestMetric() = default;
  // `metric` empty: off. Otherwise it must be one of `reported` (the task's
  // eval metrics), checked now rather than at the first evaluation
  // (ConfigError naming what `task` reports).
  BestMetric(std::string metric, int64_t patience, const Metrics& reported, const std::string& task);

  bool enabled() const { return !metric_.empty(); }
  const std::string& metric() const { return metric_; }
  // Where an earlier session of the run left off: its best and the
  // evaluations since, which early stopping counts on.
  void restore(double value, int64_t step, int64_t evals_since);
  // One evaluation at `step`: true when it is the new best (the caller
  // writes the checkpoint and marks it).
  bool improved(const EvalReport& r, int64_t step);
  double value() const { return value_.value_or(0.0); }
  // "early stop: loss did not improve for 3 evaluations (best 0.4321 at
  // step 40)" when patience ran out; "" otherwise.
  std::string patience_ran_out() const;

 private:
  std::string metric_;
  int64_t patience_ = 0;
  std::optional<double> value_;
  int64_t step_ = -1;
  int64_t evals_since_ = 0;
};

}  // namespace cohort
