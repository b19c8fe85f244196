#include "cohort/train/optim.hpp"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>

#include "cohort/config/config.hpp"
#include "cohort/core/error.hpp"

namespace cohort {

LrSchedule LrSchedule::from(const OptimOptions& o, int64_t total_steps) {
  LrSchedule s;
  s.kind = o.schedule;
  s.peak = o.lr;
  s.total = std::max<int64_t>(1, total_steps);
  s.warmup = static_cast<int64_t>(std::llround(o.warmup_ratio * static_cast<double>(s.total)));
  s.min_ratio = o.min_lr_ratio;
  return s;
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (kind == "constant") return peak;
  double span = static_cast<double>(std::max<int64_t>(1, total - warmup));
  double p = std::clamp(static_cast<double>(step - warmup) / span, 0.0, 1.0);
  double shape = kind == "cosine" ? 0.5 * (1.0 + std::cos(M_PI * p)) : 1.0 - p;
  return peak * (min_ratio + (1.0 - min_ratio) * shape);
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimOptions& o, torch::nn::Module& module) {
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : module.parameters()) {
    if (!p.requires_grad()) continue;
    (p.dim() >= 2 ? decay : no_decay).push_back(p);
  }
  if (o.name == "adamw") {
    auto base = torch::optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                   torch::optim::AdamWOptions(base).weight_decay(o.weight_decay)));
    groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                      torch::optim::AdamWOptions(base).weight_decay(0.0)));
    return std::make_unique<torch::optim::AdamW>(std::move(groups), base);
  }
  if (o.name == "sgd") {
    auto base = torch::optim::SGDOptions(o.lr).momentum(o.momentum);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, std::make_unique<torch::optim::SGDOptions>(
                                   torch::optim::SGDOptions(base).weight_decay(o.weight_decay)));
    groups.emplace_back(no_decay, std::make_unique<torch::optim::SGDOptions>(
                                      torch::optim::SGDOptions(base).weight_decay(0.0)));
    return std::make_unique<torch::optim::SGD>(std::move(groups), base);
  }
  throw ConfigError(detail::cat("optim.name must be one of adamw | sgd (got '", o.name, "')"));
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups()) group.options().set_lr(lr);
}

}  // namespace cohort
