// defines: LrSchedule, make_optimizer, adamw_options, adamw_groups, set_lr, trust_ratio, clip_gradients, FusedAdamW,
//          Lamb
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <string>

#include "cohort/config/choice.hpp"
#include "cohort/train/optimization/precision.hpp"

namespace cohort {

struct OptimOptions;

// Learning rate per optimizer step: linear warmup from 0 over `warmup` steps
// (step k of the warmup uses peak*(k+1)/warmup), then constant, linear,
// cosine or polynomial decay from peak to peak*min_ratio at step `total`.
// With p the decay progress in [0,1]:
//   linear  min + (peak-min) * (1-p)
//   cosine  min + (peak-min) * (1+cos(pi p))/2
//   poly    min + (peak-min) * (1-p)^power      (fairseq's polynomial_decay)
struct LrSchedule {
  Schedule kind = Schedule::kLinear;
  double peak = 1e-3;
  int64_t warmup = 0;
  int64_t total = 1;
  double min_ratio = 0.0;
  double power = 1.0;

  static LrSchedule from(const OptimOptions& opts, int64_t total_steps);
  double at(int64_t step) const;  // step: 0-based index of the step to take
};

// AdamW (decoupled weight decay), LAMB or SGD with momentum, per optim.name.
// Weight decay applies to matrices, kernels and embeddings only: 1-D
// parameters (biases, LayerNorm scales) form a second group without it.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimOptions& opts,
                                                        torch::nn::Module& module);

// AdamW's and LAMB's options and their two groups (with weight decay, then
// the 1-D parameters without), as make_optimizer builds them.
torch::optim::AdamWOptions adamw_options(const OptimOptions& opts);
std::vector<torch::optim::OptimizerParamGroup> adamw_groups(const OptimOptions& opts, torch::nn::Module& module);

void set_lr(torch::optim::Optimizer& opt, double lr);

// LAMB's trust ratio ||w|| / ||u|| from the two norms, 1 where either is 0,
// computed where they are (on a GPU: no wait for the device).
torch::Tensor trust_ratio(const torch::Tensor& w_norm, const torch::Tensor& u_norm);

// Scales every gradient of `module` by max_norm / (norm + 1e-6) when their
// global L2 norm exceeds max_norm (as torch.nn.utils.clip_grad_norm_); 0
// disables. Returns the norm before clipping (inf or NaN when a gradient is),
// on the gradients' device: it reads nothing back.
torch::Tensor clip_gradients(torch::nn::Module& module, double max_norm);
torch::Tensor clip_gradients(const GradientSet& grads, double max_norm);

// torch::optim::AdamW's update in one fused kernel per parameter group
// (ATen's _fused_adamw_, what torch.optim.AdamW(fused=True) calls): one pass
// over each tensor instead of about ten. Same options and per-parameter state
// (AdamWParamState), so checkpoints are interchangeable with AdamW's.
// Sparse, strided or mixed-device groups fall back to AdamW::step.
// bench/optimizer_bench measures it against AdamW.
class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

// LAMB (You et al. 2019, as in NVIDIA's BERT recipe): Adam moments with bias
// correction, the update u = m^/(sqrt(v^)+eps) + wd*w, then a per-tensor
// trust ratio ||w||/||u|| (1 when either norm is 0, and, as in NVIDIA's
// FusedLAMB, for parameters without weight decay): w -= lr * ratio * u.
// It reuses AdamW's options and per-parameter state, so checkpoints save and
// load it the same way.
class Lamb : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace cohort
