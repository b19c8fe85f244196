#include "cohort/device/host_read.hpp"

#ifdef USE_C10D_NCCL
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace cohort {

namespace {

thread_local int64_t reads = 0;

}  // namespace

double host_value(const torch::Tensor& t) {
  ++reads;
  return t.item<double>();
}

std::vector<double> host_values(const torch::Tensor& t) {
  ++reads;
  auto flat = t.detach().reshape({-1}).to(torch::kCPU, torch::kFloat64).contiguous();
  const double* p = flat.data_ptr<double>();
  return std::vector<double>(p, p + flat.numel());
}

void count_host_wait() { ++reads; }

int64_t host_reads() { return reads; }

#ifdef USE_C10D_NCCL
SyncCheck::SyncCheck(Mode mode) {
  auto& state = c10::cuda::warning_state();
  was_ = static_cast<int>(state.get_sync_debug_mode());
  state.set_sync_debug_mode(mode == Mode::kError ? c10::cuda::SyncDebugMode::L_ERROR
                                                 : c10::cuda::SyncDebugMode::L_WARN);
}

SyncCheck::~SyncCheck() {
  c10::cuda::warning_state().set_sync_debug_mode(static_cast<c10::cuda::SyncDebugMode>(was_));
}
#else
SyncCheck::SyncCheck(Mode) {}
SyncCheck::~SyncCheck() = default;
#endif

}  // namespace cohort
