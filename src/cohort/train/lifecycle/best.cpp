#include "cohort/train/lifecycle/best.hpp"

#include <algorithm>

#include "cohort/core/error.hpp"
#include "cohort/core/format.hpp"

namespace cohort {

BestMetric::BestMetric(std::string metric, int64_t patience, const Metrics& reported, const std::string& task)
    : metric_(std::move(metric)), patience_(patience) {
  if (metric_.empty()) return;
  std::string have;
  for (const auto& m : reported) {
    if (m.first == metric_) return;
    if (m.first.find('/') == std::string::npos) have += (have.empty() ? "" : ", ") + m.first;
  }
  throw ConfigError(detail::cat("ckpt.best-metric '", metric_, "' is not an eval metric of ", task,
                                " (it reports: ", have, ")"));
}

void BestMetric::restore(double value, int64_t step, int64_t evals_since) {
  value_ = value;
  step_ = step;
  evals_since_ = evals_since;
}

bool BestMetric::improved(const EvalReport& r, int64_t step) {
  if (metric_.empty()) return false;
  auto it = std::find_if(r.metrics.begin(), r.metrics.end(), [&](const auto& m) { return m.first == metric_; });
  if (it == r.metrics.end()) return false;  // checked at construction
  const bool lower = metric_.find("loss") != std::string::npos;
  const double v = it->second;
  if (value_ && (lower ? v >= *value_ : v <= *value_)) {
    ++evals_since_;
    return false;
  }
  value_ = v;
  step_ = step;
  evals_since_ = 0;
  return true;
}

std::string BestMetric::patience_ran_out() const {
  if (patience_ == 0 || evals_since_ < patience_) return "";
  return strf("early stop: %s did not improve for %lld evaluations (best %.4f at step %lld)", metric_.c_str(),
              static_cast<long long>(patience_), value(), static_cast<long long>(step_));
}

}  // namespace cohort
