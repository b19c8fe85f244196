#include "cohort/train/optimization/optim.hpp"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <map>

#include "cohort/config/config.hpp"
#include "cohort/core/error.hpp"
#include "cohort/train/optimization/precision.hpp"

namespace cohort {

LrSchedule LrSchedule::from(const OptimOptions& o, int64_t total_steps) {
  LrSchedule s;
  s.kind = o.schedule;
  s.peak = o.lr;
  s.total = std::max<int64_t>(1, total_steps);
  s.warmup = static_cast<int64_t>(std::llround(o.warmup_ratio * static_cast<double>(s.total)));
  s.min_ratio = o.min_lr_ratio;
  s.power = o.poly_power;
  return s;
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  double span = static_cast<double>(std::max<int64_t>(1, total - warmup));
  double p = std::clamp(static_cast<double>(step - warmup) / span, 0.0, 1.0);
  double shape = 1.0;
  switch (kind) {
    case Schedule::kConstant: return peak;
    case Schedule::kLinear: shape = 1.0 - p; break;
    case Schedule::kCosine: shape = 0.5 * (1.0 + std::cos(M_PI * p)); break;
    case Schedule::kPoly: shape = std::pow(1.0 - p, power); break;
  }
  return peak * (min_ratio + (1.0 - min_ratio) * shape);
}

namespace {

// Two parameter groups: with weight decay and (1-D parameters) without.
template <class Options>
std::vector<torch::optim::OptimizerParamGroup> decay_groups(torch::nn::Module& module, const Options& base,
                                                            double weight_decay) {
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : module.parameters()) {
    if (!p.requires_grad()) continue;
    (p.dim() >= 2 ? decay : no_decay).push_back(p);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<Options>(Options(base).weight_decay(weight_decay)));
  groups.emplace_back(no_decay, std::make_unique<Options>(Options(base).weight_decay(0.0)));
  return groups;
}

}  // namespace

torch::optim::AdamWOptions adamw_options(const OptimOptions& o) {
  return torch::optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps);
}

std::vector<torch::optim::OptimizerParamGroup> adamw_groups(const OptimOptions& o, torch::nn::Module& module) {
  return decay_groups(module, adamw_options(o), o.weight_decay);
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimOptions& o, torch::nn::Module& module) {
  if (o.name == OptimizerKind::kSgd) {
    auto base = torch::optim::SGDOptions(o.lr).momentum(o.momentum);
    return std::make_unique<torch::optim::SGD>(decay_groups(module, base, o.weight_decay), base);
  }
  auto base = adamw_options(o);
  auto groups = adamw_groups(o, module);
  if (o.name == OptimizerKind::kLamb) return std::make_unique<Lamb>(std::move(groups), base);
  return std::make_unique<FusedAdamW>(std::move(groups), base);
}

namespace {

// The AdamW state of `p`, zero moments the first time: what libtorch's AdamW
// keeps, so FusedAdamW, AdamW and Lamb checkpoints are alike.
template <class StateMap>
torch::optim::AdamWParamState& adamw_state(StateMap& state, const torch::Tensor& p) {
  void* key = p.unsafeGetTensorImpl();
  auto it = state.find(key);
  if (it == state.end()) {
    auto st = std::make_unique<torch::optim::AdamWParamState>();
    st->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    st->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    it = state.emplace(key, std::move(st)).first;
  }
  return static_cast<torch::optim::AdamWParamState&>(*it->second);
}

// The optimizers' closure, with autograd on (step() itself runs without).
torch::Tensor evaluate_closure(const torch::optim::Optimizer::LossClosure& closure) {
  if (!closure) return {};
  torch::AutoGradMode enable_grad(true);
  return closure();
}

}  // namespace

torch::Tensor FusedAdamW::step(LossClosure closure) {
  // The fused kernel walks each list as flat, dense arrays of one device and
  // dtype; anything else takes libtorch's AdamW (which refuses sparse grads).
  for (auto& group : param_groups_) {
    if (group.params().empty()) continue;
    const auto& first = group.params().front();
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (p.grad().is_sparse() || !p.is_contiguous() || !p.grad().is_contiguous() ||
          p.grad().strides() != p.strides() || p.device() != first.device() || p.dtype() != first.dtype()) {
        return torch::optim::AdamW::step(closure);
      }
    }
  }
  torch::NoGradGuard no_grad;
  torch::Tensor loss = evaluate_closure(closure);
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    COHORT_CHECK(!o.amsgrad(), ConfigError, "FusedAdamW does not implement amsgrad");
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
    std::vector<torch::optim::AdamWParamState*> states;
    std::map<int64_t, torch::Tensor> step_tensors;  // the kernel only reads them: one per count
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& st = adamw_state(state_, p);
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(st.exp_avg());
      exp_avg_sqs.push_back(st.exp_avg_sq());
      // The kernel reads the step about to be taken from a tensor.
      auto& step = step_tensors[st.step() + 1];
      if (!step.defined()) step = torch::full({}, static_cast<double>(st.step() + 1), torch::TensorOptions().device(p.device()));
      steps.push_back(step);
      states.push_back(&st);
    }
    if (params.empty()) continue;
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, o.lr(),
                      std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(), o.eps(),
                      /*amsgrad=*/false, /*maximize=*/false);
    for (auto* st : states) st->step(st->step() + 1);  // only once the update is done
  }
  return loss;
}

torch::Tensor trust_ratio(const torch::Tensor& w_norm, const torch::Tensor& u_norm) {
  auto ok = w_norm.gt(0).logical_and(u_norm.gt(0));
  return torch::where(ok, w_norm / u_norm.clamp_min(1e-30), torch::ones_like(w_norm));
}

torch::Tensor Lamb::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss = evaluate_closure(closure);
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const auto& grad = p.grad();
      auto& st = adamw_state(state_, p);
      st.step(st.step() + 1);
      double t = static_cast<double>(st.step());
      st.exp_avg().mul_(beta1).add_(grad, 1 - beta1);
      st.exp_avg_sq().mul_(beta2).addcmul_(grad, grad, 1 - beta2);
      auto m_hat = st.exp_avg() / (1 - std::pow(beta1, t));
      auto v_hat = st.exp_avg_sq() / (1 - std::pow(beta2, t));
      auto update = m_hat / (v_hat.sqrt() + o.eps());
      if (o.weight_decay() != 0) update.add_(p, o.weight_decay());
      // NVIDIA's FusedLAMB (use_nvlamb=False): parameters without weight
      // decay (biases, LayerNorm) take the plain Adam update, ratio 1.
      if (o.weight_decay() == 0) {
        p.add_(update, -o.lr());
        continue;
      }
      // The trust ratio stays on the device: ||w|| / ||u||, 1 when either is 0.
      p.sub_(update * (o.lr() * trust_ratio(p.norm().to(torch::kFloat64), update.norm().to(torch::kFloat64))));
    }
  }
  return loss;
}

torch::Tensor clip_gradients(torch::nn::Module& module, double max_norm) {
  return clip_gradients(module_gradients(module), max_norm);
}

torch::Tensor clip_gradients(const GradientSet& grads, double max_norm) {
  torch::Tensor norm = grad_norm(grads);
  if (max_norm > 0) {
    // The factor is decided on the device (1 when the norm is within bounds).
    torch::NoGradGuard no_grad;
    auto factor = (max_norm / (norm + 1e-6)).clamp_max(1.0);
    for (const auto& g : grads.tensors) g.mul_(factor.to(g.scalar_type()));
  }
  return norm;
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups()) group.options().set_lr(lr);
}

}  // namespace cohort
