// defines: train_elastic, capture_handover, adopt_handover, complete_sample_ids,
//          write_held_train_line, report_world_change
//
// Training in an elastic world (the launcher's --min-nodes). Each world is
// one generation of members agreed by Membership; a Trainer runs in it until
// it ends, and the next world goes on from the state in memory:
//
//   1. a member leaves, stalls or a node asks to join: the collective in
//      flight is abandoned (MembershipChanged) or the trainer stops at the
//      step boundary (newcomers);
//   2. every process keeps its trainer's state at the last completed step
//      (Trainer::handover);
//   3. the members form the next world, its rank 0 being the survivor with
//      the state at the last step every survivor completed;
//   4. a new Trainer in that world takes rank 0's state by broadcast and
//      re-deals the rest of the epoch from the cursor to the new ranks; the
//      global batch and its micro-batches are unchanged (only how many each
//      rank computes changes).
//
// When no member of the previous world survived with its state, the world
// goes on from the run's latest checkpoint instead (the log says why); when
// fewer than --min-nodes remain, BelowMinNodes ends the process (exit 3) and
// the launcher restarts the job from its checkpoint.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "cohort/config/config.hpp"
#include "cohort/device/device_tally.hpp"
#include "cohort/train/replica_sync.hpp"
#include "cohort/train/run.hpp"
#include "cohort/train/step_optimizer.hpp"
#include "cohort/train/train_state.hpp"

namespace cohort {

class Comm;
class GlobalOrder;
class Membership;
class Reporter;
class RunDir;
struct World;

// `per_world` adjusts this process's options for each world it is in (the
// testing aids that target a rank).
RunSummary train_elastic(const Config& cfg, Membership& membership, const RunOptions& run,
                         const std::function<void(const World&, RunOptions&)>& per_world);

// Step 2: this process's model, optimizer and state at the last completed
// step, cloned, without collectives. The trainer adds the step's records
// (RNG, cursor, train line, open interval).
std::shared_ptr<Handover> capture_handover(torch::nn::Module& module, StepOptimizer& optimizer,
                                           const TrainState& state, int world_size, int64_t train_samples);

// Step 4, collective: when the new world's rank 0 holds a Handover, every
// rank takes its parameters, optimizer, step, cursor, samples and loss scale
// by broadcast; returns false (nothing changed) when it holds none. Every
// survivor keeps its own RNG stream, newcomers their seed-derived ones, and
// data.balance = auto measures the new world afresh (the old split was per
// rank of the old world: the shares are cleared). `replicas` starts the new
// world (PowerSGD afresh; local sync from the handed-over outer momentum);
// what the log should say is appended to `notes`. dist.shard: every rank
// takes its new range of the moments from the survivors that hold them;
// ShardsLost when a range has no holder left.
bool adopt_handover(Comm& comm, const Handover* held, torch::nn::Module& module, StepOptimizer& optimizer,
                    ReplicaSync& replicas, TrainState& state, std::vector<std::string>& notes);

// dist.sync = local: the state at the last sync, the same on every rank,
// which a new world goes on from (the ranks' open windows are lost with a
// member: the steps since are trained again).
struct SyncMark {
  int64_t step = 0;
  Cursor cursor;       // where the step after it starts
  Cursor step_cursor;  // where its global batch started; consumed -1: unknown
  int64_t samples_seen = 0;
  torch::Tensor rng;   // this process's generator after it
  DeviceTally interval;  // the open log interval's metrics after it
  std::optional<TrainReport> line;  // its train line, when one was written
};

// Turns `h`, captured with the last sync's model in the module, into the
// handover of `mark`, with the outer momentum; `reached` is the step the
// world had reached (the note says which steps are trained again).
void rewind_to_sync(Handover& h, const SyncMark& mark, int64_t reached, const torch::Tensor& outer_momentum);

// Rank 0 of a world that goes on from memory (log.sample-ids): the step
// held was applied by every member of the last world, but a member lost
// right after it may not have logged its share of the step's sample ids.
// Logs the missing ones for it when the run goes on at the step held
// (`step`); returns the log's note, "" when none were missing.
std::string complete_sample_ids(const std::string& run_dir, const Handover& held, int64_t step,
                                const GlobalOrder& order, int rank);

// Rank 0 of a world that goes on from memory: the step held's train line,
// built by the last world (its collectives may have failed, or its rank 0
// died before writing it), when RUN_DIR has none. Returns the log's note.
std::string write_held_train_line(const Handover& held, const RunDir& dir, Reporter& reporter);

// The change that formed this world, once (after its first step), with the
// seconds from noticing it until then.
void report_world_change(std::optional<MembershipReport>& change, Reporter& reporter);

}  // namespace cohort
