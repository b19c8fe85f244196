// defines: PartState, SavedPart, StatePart, part_tensor_name, read_saved_part
//
// State that outlives a step, as the part of the trainer that owns it
// holds it (the outer stage and its gradient reduction, the fp16 loss
// scaler), in one interface: the checkpoint writes and reads every part's
// tensors, and the elastic hand-over carries them, without naming what
// any part holds. A new part (an outer state between islands, say) is one
// more entry in the trainer's list of parts.
#pragma once

#include <torch/types.h>

#include <map>
#include <string>
#include <vector>

#include "cohort/ckpt/safetensors.hpp"

namespace cohort {

// Tensors the same on every rank (`shared`), and this rank's own (`own`).
struct PartState {
  NamedTensors shared;
  NamedTensors own;
};

// A checkpoint's tensors of one part: the shared ones, and every writing
// rank's own, by rank (as many lists as the writer's world had ranks).
struct SavedPart {
  NamedTensors shared;
  std::vector<NamedTensors> by_rank;
};

class StatePart {
 public:
  virtual ~StatePart() = default;
  // Its name: in a checkpoint's rng.safetensors, a shared tensor X is
  // "NAME.X" and rank R's own "rank.R.NAME.X" (X empty: "NAME", "rank.R.NAME").
  virtual std::string state_name() const = 0;
  virtual PartState capture() const = 0;
  // From a checkpoint (at its world size or another). Returns the log's notes.
  virtual std::vector<std::string> restore(const SavedPart& saved) = 0;
  // A new elastic world: the shared tensors of the state the world goes on
  // from (its rank 0's), and this process's own when it held that state
  // (empty for a newcomer). Returns a note for the log, or "".
  virtual std::string adopt(const PartState& handed) = 0;
  // The start-up line about it, or "".
  virtual std::string describe() const { return ""; }
};

// "NAME.X", or "NAME" for X empty.
std::string part_tensor_name(const std::string& part, const std::string& tensor);

// `part`'s tensors among a checkpoint's rng.safetensors (`file`, written by
// `world_size` ranks). DataError when one names a rank outside it.
SavedPart read_saved_part(const std::map<std::string, torch::Tensor>& tensors, const std::string& part,
                          int world_size, const std::string& file);

}  // namespace cohort
