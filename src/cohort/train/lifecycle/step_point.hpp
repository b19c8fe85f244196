// defines: StepPoint, StepHook
#pragma once

#include <cstdint>
#include <functional>

namespace cohort {

// Named moments of a training step, where a StepHook is called with the
// step's number N.
enum class StepPoint {
  kBegin,         // step N is about to take its batch
  kForwardBegin,  // a micro-batch's forward begins
  kForwardDone,   // its forward is done
  kBackwardDone,  // its backward is done (on a GPU, queued)
  kApplied,       // step N's update is applied; nothing of it is logged yet
  kLine,          // step N's train line is agreed on every rank; rank 0 writes it next
};

// Testing aid (null: never called): the app installs one from its
// COHORT_DEBUG_* variables, so that a test holds a job at a step, kills a
// rank at a chosen moment or slows one rank's compute, instead of guessing
// how fast the machine is.
using StepHook = std::function<void(StepPoint, int64_t)>;

}  // namespace cohort
