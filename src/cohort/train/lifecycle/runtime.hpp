// defines: available_cores, seed_rngs
#pragma once

#include <cstdint>

namespace cohort {

// Cores this process may run on (its CPU affinity mask, not the machine).
int available_cores();

// Seeds torch's RNGs from train.seed, offset by rank: dropout masks differ
// per rank (weights are made equal across ranks by broadcast, not seeding).
// Distinct streams per (seed, rank): seed s rank 1 is not seed s+1 rank 0.
void seed_rngs(uint64_t seed, int rank);

}  // namespace cohort
