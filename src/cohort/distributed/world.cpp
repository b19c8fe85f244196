#include "cohort/distributed/world.hpp"

#include <torch/cuda.h>

#include "cohort/core/error.hpp"

namespace cohort {

c10::Device resolve_device(DeviceKind kind, int local_rank) {
  bool cuda = torch::cuda::is_available();
  if (kind == DeviceKind::kCpu || (kind == DeviceKind::kAuto && !cuda)) return c10::Device(c10::kCPU);
  COHORT_CHECK(cuda, ConfigError, "train.device is 'cuda' but this libtorch has no CUDA or no GPU is visible");
  int count = static_cast<int>(torch::cuda::device_count());
  // One visible GPU: every local rank uses it (SLURM's --gpus-per-task=1
  // gives each task its own as cuda:0; or several ranks share one GPU).
  if (count == 1) return c10::Device(c10::kCUDA, 0);
  COHORT_CHECK(local_rank < count, ConfigError, "local rank ", local_rank, " needs GPU ", local_rank,
               " but this process sees ", count, " GPU(s) (CUDA_VISIBLE_DEVICES); start fewer ranks on this node");
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

}  // namespace cohort
