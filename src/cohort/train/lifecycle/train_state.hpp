// defines: TrainState, Handover, encode_handover, decode_handover, cpu_rng_state, set_cpu_rng_state
//
// What a checkpoint must hold beyond weights and optimizer for a resumed run
// to go on as if never stopped: the step, the data cursor, the sample count,
// the fp16 loss scale and every rank's RNG stream (dropout masks).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <optional>
#include <vector>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/ckpt/state_part.hpp"
#include "cohort/data/order.hpp"
#include "cohort/device/device_tally.hpp"
#include "cohort/eval/tally.hpp"
#include "cohort/obs/reporter.hpp"
#include "cohort/train/optimization/precision.hpp"

namespace cohort {

class Comm;
struct World;

struct TrainState {
  int64_t step = 0;          // optimizer steps taken
  Cursor cursor;             // where the next global batch starts
  int64_t samples_seen = 0;  // all ranks
  LossScaler scaler{false};
  std::vector<int64_t> balance_shares;  // the split of a full global batch

  // The checkpoint's record and its rng.safetensors tensors: every rank's
  // generator ("rank.R"), and each state part's tensors as StatePart names
  // them (each rank's own flattened). Collective: every rank calls it; the
  // tensors are complete on rank 0.
  struct Snapshot {
    CheckpointState state;
    NamedTensors rng;
  };
  Snapshot capture(Comm& comm, int64_t train_samples, const std::vector<const StatePart*>& parts) const;

  // From a verified checkpoint: step, cursor and samples, this rank's RNG
  // stream when the world size is unchanged (at another world size ranks
  // keep their seed-derived streams), and every state part's tensors.
  // Returns the parts' notes for the log.
  std::vector<std::string> restore(const ResolvedCheckpoint& from, const World& world,
                                   const std::vector<StatePart*>& parts);
};

// An elastic world's state handed from one world to the next in memory
// (train/elastic/elastic.hpp): what a checkpoint would hold, taken from the live
// trainer of one process at the last completed step, without collectives.
struct Handover {
  CheckpointState state;
  NamedTensors model;     // parameters and buffers, cloned
  std::string optimizer;  // the optimizer's libtorch archive
  // Every state part's (StatePart::capture), by its state_name(), cloned.
  // dist.sync = local: the state above is that of the last sync (the model
  // its parameters): the new world trains the steps since again.
  std::map<std::string, PartState> parts;
  // dist.shard: this process's range of the optimizer moments at the step
  // held (ShardedOptimizer::range_state); empty when it holds none, or when
  // the world ended while a step's update was half shared.
  NamedTensors shard;
  std::string note;  // what the next world logs about this handover; "" when nothing
  torch::Tensor rng;      // this process's CPU generator at the last step boundary
  // The record of the last step, so that the next world logs it when the
  // world that took it could not (a member lost after its update).
  Cursor step_cursor;                    // where the last step's global batch started; consumed -1: unknown
  std::optional<TrainReport> train_line;  // the last step's train line, when one was due
  DeviceTally interval;                  // the open log interval's metrics, summed over ranks
  // Where this process's first world began: the run's summary counts every world.
  int64_t first_step = 0;
  std::chrono::steady_clock::time_point started;
};

// What a new world's rank 0 sends the others of a Handover, as one blob:
// the step, cursor, samples and world size, the optimizer's archive and the
// state parts' shared tensors (the weights go by a module broadcast; each
// part's own tensors stay with their process). decode_handover fills those
// fields of a Handover and leaves the rest empty.
std::string encode_handover(const Handover& h);
Handover decode_handover(const std::string& blob);

// The default CPU generator's state, and setting it.
torch::Tensor cpu_rng_state();
void set_cpu_rng_state(const torch::Tensor& state);

}  // namespace cohort
