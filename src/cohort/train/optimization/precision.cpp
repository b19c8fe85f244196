#include "cohort/train/optimization/precision.hpp"

#include <ATen/autocast_mode.h>

#include <cmath>
#include <fstream>
#include <string>

#include "cohort/core/error.hpp"
#include "cohort/device/host_read.hpp"

namespace cohort {

bool cpu_has_amx_bf16() {
  static const bool has = [] {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("flags", 0) != 0) continue;
      return line.find(" amx_bf16") != std::string::npos;
    }
    return false;
  }();
  return has;
}

Precision resolve_precision(Precision requested, const c10::Device& device) {
  if (requested == Precision::kAuto) {
    if (device.is_cuda()) return Precision::kFp16;
    return cpu_has_amx_bf16() ? Precision::kBf16 : Precision::kFp32;
  }
  return requested;  // fp16 on a CPU runs (libtorch 2.4 and later), with loss scaling, but slower than bf16
}

AutocastScope::AutocastScope(Precision precision, const c10::Device& device) {
  if (precision == Precision::kFp32) return;
  device_ = device.is_cuda() ? at::kCUDA : at::kCPU;
  was_enabled_ = at::autocast::is_autocast_enabled(device_);
  was_dtype_ = at::autocast::get_autocast_dtype(device_);
  at::autocast::set_autocast_enabled(device_, true);
  at::autocast::set_autocast_dtype(device_, precision == Precision::kFp16 ? at::kHalf : at::kBFloat16);
  active_ = true;
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  at::autocast::set_autocast_enabled(device_, was_enabled_);
  at::autocast::set_autocast_dtype(device_, was_dtype_);
  if (!was_enabled_) at::autocast::clear_cache();
}

LossScaler::LossScaler(bool enabled, double init_scale, double growth, double backoff, int64_t growth_interval)
    : enabled_(enabled),
      scale_(enabled ? init_scale : 1.0),
      growth_(growth),
      backoff_(backoff),
      growth_interval_(growth_interval) {}

GradientSet module_gradients(torch::nn::Module& module) {
  GradientSet g;
  for (auto& p : module.parameters()) {
    g.device = p.device();
    if (p.grad().defined()) g.tensors.push_back(p.grad());
  }
  return g;
}

torch::Tensor grad_norm(const GradientSet& grads) {
  torch::NoGradGuard no_grad;
  // Each tensor's sum of squares in float64, summed in float64: the same
  // norm to ~1e-16 however the gradients are cut (whole tensors, a shard's
  // pieces of them), so clipping does not depend on the world size.
  std::vector<torch::Tensor> squares;
  for (const auto& t : grads.tensors) {
    squares.push_back(torch::linalg_vector_norm(t, 2, c10::nullopt, false, torch::kFloat64).square());
  }
  auto options = torch::TensorOptions(torch::kFloat64).device(grads.device);
  auto sq = squares.empty() ? torch::zeros({1}, options) : torch::stack(squares).sum().reshape({1});
  if (grads.pool) grads.pool(sq);
  return sq.sqrt().reshape({});
}

torch::Tensor LossScaler::scale(const torch::Tensor& loss) const { return enabled_ ? loss * scale_ : loss; }

bool LossScaler::unscale_and_update(const GradientSet& grads) {
  if (!enabled_) return true;
  torch::NoGradGuard no_grad;
  for (const auto& g : grads.tensors) g.mul_(1.0 / scale_);
  bool finite = std::isfinite(host_value(grad_norm(grads)));
  if (!finite) {
    scale_ *= backoff_;
    clean_steps_ = 0;
    ++skipped_;
    return false;
  }
  if (++clean_steps_ >= growth_interval_) {
    scale_ *= growth_;
    clean_steps_ = 0;
  }
  return true;
}

torch::Tensor LossScaler::state() const {
  return torch::tensor({scale_, static_cast<double>(clean_steps_), static_cast<double>(skipped_)}, torch::kFloat64);
}

void LossScaler::restore(const torch::Tensor& state) {
  COHORT_CHECK(state.numel() == 3, DataError, "a checkpoint's loss_scaler state has ", state.numel(),
               " values, not 3");
  auto s = state.to(torch::kFloat64);
  auto v = host_values(s);
  scale_ = v[0];
  clean_steps_ = static_cast<int64_t>(v[1]);
  skipped_ = static_cast<int64_t>(v[2]);
}

PartState LossScaler::capture() const {
  PartState s;
  if (enabled_) s.shared.emplace_back("", state());
  return s;
}

std::vector<std::string> LossScaler::restore(const SavedPart& saved) {
  adopt({saved.shared, {}});
  return {};
}

std::string LossScaler::adopt(const PartState& handed) {
  for (const auto& [name, t] : handed.shared) {
    if (name.empty()) restore(t);
  }
  return "";
}

}  // namespace cohort
