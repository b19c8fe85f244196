// defines: resolve_precision, cpu_has_amx_bf16, GradientSet, module_gradients, AutocastScope, LossScaler
//
// Mixed precision. Master weights and gradients stay fp32; autocast runs the
// forward's matrix products in bf16 (CPU) or fp16 (CUDA). fp16's narrow range
// needs dynamic loss scaling, which libtorch's C++ API does not provide.
#pragma once

#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <string>
#include <vector>

#include "cohort/ckpt/state_part.hpp"
#include "cohort/config/choice.hpp"

namespace cohort {

// train.precision -> fp32, bf16 or fp16 (never auto). auto is fp16 on CUDA, bf16 on
// a CPU with AMX, fp32 otherwise: with libtorch 2.x's MKL, fp32 matrix
// products outrun AVX512-BF16's (on a 2-core AVX512-BF16 Xeon, 360 against
// 165 GFLOP/s at 2048², and a bert-tiny step 35% faster in fp32). fp16 on a
// CPU runs, with loss scaling, but most CPUs emulate it: bf16 is faster there.
Precision resolve_precision(Precision requested, const c10::Device& device);

// True when /proc/cpuinfo lists amx_bf16 (Sapphire Rapids and later).
bool cpu_has_amx_bf16();

// The gradients a step applies, as this rank holds them: every parameter's,
// or (dist.shard = gradients) only its range's, whose squared norms `pool`
// sums over the ranks (a float64 tensor of one value, in place). Clipping and
// the loss scaler work on these.
struct GradientSet {
  std::vector<torch::Tensor> tensors;
  std::function<void(torch::Tensor&)> pool;  // null: the tensors are every gradient
  torch::Device device = torch::kCPU;         // the parameters': where a norm of no tensors is made
};
GradientSet module_gradients(torch::nn::Module& module);
// The L2 norm of all the gradients together, a float64 scalar on their
// device (read nothing): inf or NaN when any gradient is. One reduction per
// tensor, no copies.
torch::Tensor grad_norm(const GradientSet& grads);

// Autocast on for the scope's lifetime when precision is bf16 or fp16.
class AutocastScope {
 public:
  AutocastScope(Precision precision, const c10::Device& device);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType device_ = c10::kCPU;
  bool was_enabled_ = false;
  c10::ScalarType was_dtype_ = c10::kBFloat16;
};

// Dynamic loss scaling (as torch.cuda.amp.GradScaler): the loss is multiplied
// by `scale` before backward; after the gradients are final (all-reduced, so
// identical on every rank) they are divided back. A non-finite gradient skips
// the step and halves the scale; `growth_interval` clean steps double it.
// Disabled, it is the identity and every step is taken.
class LossScaler : public StatePart {
 public:
  explicit LossScaler(bool enabled, double init_scale = 65536.0, double growth = 2.0, double backoff = 0.5,
                      int64_t growth_interval = 2000);

  bool enabled() const { return enabled_; }
  double scale() const { return scale_; }
  torch::Tensor scale(const torch::Tensor& loss) const;
  // Unscales every gradient of `module` in place and reports whether all are
  // finite; updates the scale. The caller skips the optimizer step on false.
  // Enabled, it reads one value from the device (the norm's finiteness), as
  // torch.amp.GradScaler.step does: whether to step is the host's decision.
  // Disabled, it reads nothing.
  bool unscale_and_update(torch::nn::Module& module) { return unscale_and_update(module_gradients(module)); }
  bool unscale_and_update(const GradientSet& grads);
  int64_t skipped() const { return skipped_; }
  // [scale, clean steps, skipped], and back.
  torch::Tensor state() const;
  void restore(const torch::Tensor& state);

  // Its state part, "loss_scaler": the one tensor above (shared), when on.
  std::string state_name() const override { return "loss_scaler"; }
  PartState capture() const override;
  std::vector<std::string> restore(const SavedPart& saved) override;
  std::string adopt(const PartState& handed) override;

 private:
  bool enabled_;
  double scale_;
  double growth_, backoff_;
  int64_t growth_interval_;
  int64_t clean_steps_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace cohort
