// defines: host_value, host_values, count_host_wait, host_reads, SyncCheck
//
// A GPU runs ahead of the host only while the host never waits for it: every
// read of a device value (`.item()`, a copy to the CPU, a data-dependent
// shape) stalls the host until the device drains. Cohort's training step
// reads nothing; the deliberate reads, at log points, evaluation's end and
// checkpoints, go through these functions, which count them, so a test on
// the CPU can prove that a steady-state step reads nothing (SyncCheck proves
// the rest on a GPU).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace cohort {

// t's one value as a double (t.item()): one counted host read.
double host_value(const torch::Tensor& t);
// t's values, flattened, as doubles: one counted host read.
std::vector<double> host_values(const torch::Tensor& t);
// A wait for the device that reads no value (an event's completion): counted
// as one host read.
void count_host_wait();
// The reads this thread has made through host_value and host_values (a
// rank's training thread: ranks that run as threads count apart).
int64_t host_reads();

// CUDA's sync debug mode (torch.cuda.set_sync_debug_mode) for the scope's
// lifetime: any operation that makes the host wait for the device throws
// (kError) or warns (kWarn). A no-op without CUDA.
class SyncCheck {
 public:
  enum class Mode { kWarn, kError };
  explicit SyncCheck(Mode mode);
  ~SyncCheck();
  SyncCheck(const SyncCheck&) = delete;
  SyncCheck& operator=(const SyncCheck&) = delete;

 private:
  int was_ = 0;
};

}  // namespace cohort
