// defines: LrSchedule, make_optimizer, set_lr
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <string>

namespace cohort {

struct OptimOptions;

// Learning rate per optimizer step: linear warmup from 0 over `warmup` steps
// (step k of the warmup uses peak*(k+1)/warmup), then constant, linear or
// cosine decay from peak to peak*min_ratio at step `total`.
struct LrSchedule {
  std::string kind = "linear";
  double peak = 1e-3;
  int64_t warmup = 0;
  int64_t total = 1;
  double min_ratio = 0.0;

  static LrSchedule from(const OptimOptions& opts, int64_t total_steps);
  double at(int64_t step) const;  // step: 0-based index of the step to take
};

// AdamW (decoupled weight decay) or SGD with momentum, per optim.name. Weight
// decay applies to matrices and kernels only: 1-D parameters (biases, norm
// scales) form a second group without it.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimOptions& opts,
                                                        torch::nn::Module& module);

void set_lr(torch::optim::Optimizer& opt, double lr);

}  // namespace cohort
