// defines: train_elastic
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
// This file is the driver, above the Trainer: it runs a Trainer per world
// and chooses what each new world goes on from. Steps 2 and 4, below the
// Trainer, are the hand-over (handover.hpp).
//
// When no member of the previous world survived with its state, the world
// goes on from the run's latest checkpoint instead (the log says why); when
// fewer than --min-nodes remain, BelowMinNodes ends the process (exit 3) and
// the launcher restarts the job from its checkpoint.
#pragma once

#include <functional>

#include "cohort/config/config.hpp"
#include "cohort/train/lifecycle/run.hpp"

namespace cohort {

class Membership;
struct World;

// `per_world` adjusts this process's options for each world it is in (the
// testing aids that target a rank).
RunSummary train_elastic(const Config& cfg, Membership& membership, const RunOptions& run,
                         const std::function<void(const World&, RunOptions&)>& per_world);

}  // namespace cohort
