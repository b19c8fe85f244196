// defines: World
//
// Who this process is in the job. Passed explicitly to everything that needs
// it; there is no global. A single-process run is World{} (rank 0 of 1).
#pragma once

#include <c10/core/Device.h>

#include <string>

#include "cohort/config/choice.hpp"

namespace cohort {

struct World {
  int rank = 0;              // global rank
  int world_size = 1;
  int local_rank = 0;        // rank on this node
  int local_world_size = 1;  // ranks on this node (may differ between nodes)
  int node_rank = 0;
  c10::Device device{c10::kCPU};

  bool is_main() const { return rank == 0; }
};

// train.device -> the device for this local rank: with one visible GPU,
// that GPU for every local rank; with several,
// GPU `local_rank` when CUDA is present (auto) or asked for, else the CPU.
c10::Device resolve_device(DeviceKind kind, int local_rank);

}  // namespace cohort
