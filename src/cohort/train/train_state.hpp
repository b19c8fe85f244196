// defines: TrainState
//
// What a checkpoint must hold beyond weights and optimizer for a resumed run
// to go on as if never stopped: the step, the data cursor, the sample count,
// the fp16 loss scale and every rank's RNG stream (dropout masks).
#pragma once

#include <cstdint>
#include <vector>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/data/order.hpp"
#include "cohort/train/precision.hpp"

namespace cohort {

class Comm;
struct World;

struct TrainState {
  int64_t step = 0;          // optimizer steps taken
  Cursor cursor;             // where the next global batch starts
  int64_t samples_seen = 0;  // all ranks
  LossScaler scaler{false};
  std::vector<int64_t> balance_shares;  // the split of a full global batch

  // The checkpoint's record and its rng.safetensors tensors (every rank's
  // generator, the loss scale). Collective: every rank calls it; the
  // tensors are complete on rank 0.
  struct Snapshot {
    CheckpointState state;
    NamedTensors rng;
  };
  Snapshot capture(Comm& comm, int64_t train_samples) const;

  // From a verified checkpoint: step, cursor, samples and loss scale, and
  // this rank's RNG stream when the world size is unchanged (at another
  // world size ranks keep their seed-derived streams).
  void restore(const ResolvedCheckpoint& from, const World& world);
};

}  // namespace cohort
