// defines: available_cores, setup_runtime
//
// Process-wide set-up, done once at start, before any tensor work:
// intra-op threads, malloc tuning and RNG seeds.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace cohort {

struct TrainOptions;
struct World;

// Cores this process may run on (its CPU affinity mask, not the machine).
int available_cores();

struct Runtime {
  int threads = 1;
  int cores = 1;
};

// Sets intra-op threads (train.threads, or free cores / local ranks), tunes
// glibc malloc against page-fault churn on large tensors, and seeds torch's
// RNGs from train.seed (offset by rank for dropout; weights are made equal
// across ranks by broadcast, not by seeding).
Runtime setup_runtime(const TrainOptions& opts, const World& world);

}  // namespace cohort
