// defines: capture_handover, adopt_handover, SyncMark, rewind_to_sync, complete_sample_ids,
//          write_held_train_line, report_world_change
//
// The elastic hand-over, below the Trainer (elastic.hpp drives the worlds):
// what a process keeps of its trainer's state when a world ends (step 2 of
// elastic.hpp's list) and how a new world's ranks take it (step 4), with
// the records of the last step that the new world logs for the old one.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "cohort/device/device_tally.hpp"
#include "cohort/obs/reporter.hpp"
#include "cohort/train/lifecycle/train_state.hpp"
#include "cohort/train/optimization/step_optimizer.hpp"

namespace cohort {

class Comm;
class GlobalOrder;
class RunDir;

// Step 2: this process's model, optimizer, state and state parts at the
// last completed step, cloned, without collectives. The trainer adds the
// step's records (RNG, cursor, train line, open interval).
std::shared_ptr<Handover> capture_handover(torch::nn::Module& module, StepOptimizer& optimizer,
                                           const TrainState& state, const std::vector<const StatePart*>& parts,
                                           int world_size, int64_t train_samples);

// Step 4, collective: when the new world's rank 0 holds a Handover, every
// rank takes its parameters, optimizer, step, cursor and samples by
// broadcast, and each state part adopts rank 0's shared tensors (and this
// process's own, when it held the same step); returns false (nothing
// changed) when rank 0 holds none. Every survivor keeps its own RNG stream,
// newcomers their seed-derived ones, and data.balance = auto measures the
// new world afresh (the old split was per rank of the old world: the shares
// are cleared). What the log should say is appended to `notes`. dist.shard:
// every rank takes its new range of the moments from the survivors that
// hold them; ShardsLost when a range has no holder left.
bool adopt_handover(Comm& comm, const Handover* held, torch::nn::Module& module, StepOptimizer& optimizer,
                    const std::vector<StatePart*>& parts, TrainState& state, std::vector<std::string>& notes);

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
// handover of `mark`; `reached` is the step the world had reached (the
// note says which steps are trained again).
void rewind_to_sync(Handover& h, const SyncMark& mark, int64_t reached);

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
