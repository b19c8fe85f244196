// defines: LocalSyncOptions, LocalSync
//
// dist.sync = local, DiLoCo-style (Douillard et al. 2023): each rank takes
// `every` optimizer steps of its own on its share of the data, with no
// gradient all-reduce, and then the ranks average the parameter change since
// the last sync (the "outer gradient", weighted by the samples each rank
// trained on) in one all-reduce and apply it with an outer Nesterov step to
// the parameters of the last sync. Every rank then starts the next window
// from the same parameters; each keeps its own inner optimizer state.
//
// With every = 1, outer lr 1 and momentum 0 and plain SGD this is exact
// data-parallel training: the average of the ranks' one-step parameters is
// one step on the average gradient.
//
// Islands (dist.islands): the ranks of an island train one model exactly
// together (their gradients summed every step), so the island is the unit
// that meets the others. Its change is weighted by the samples the island
// trained, and each of its k ranks sums one k-th of the change with the
// ranks of the same island rank elsewhere (`across`), so that the traffic
// between islands is one model's change per island, not k; the island then
// gathers the pieces over its own fast links (`inside`). Flat local steps
// are islands of one rank: `inside` is a group of one, `across` the world.
//
// Cross-rank contract: every rank calls after_step() at every step with the
// same step and force; the sums over `inside` and `across` are the only
// collectives.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cohort/config/choice.hpp"

namespace cohort {

class Comm;
// Named tensors, as ckpt/safetensors.hpp declares them (a layer above).
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

struct LocalSyncOptions {
  int64_t every = 8;          // dist.local-steps
  double outer_lr = 1.0;        // optim.outer-lr
  double outer_momentum = 0.0;  // optim.outer-momentum
  Compression wire = Compression::kNone;  // the parameter change's dtype on the wire
  std::vector<int> island_of;  // each global rank's island; empty: every rank its own
};

class LocalSync {
 public:
  // `inside`: this rank's island; `across`: this island rank in every island.
  LocalSync(Comm& inside, Comm& across, torch::nn::Module& module, LocalSyncOptions opts);

  // After inner step `step` (1-based), on which this rank trained `samples`.
  // At a multiple of `every`, or when `force` (the run's last step), syncs.
  // Returns true when it synced.
  bool after_step(int64_t step, int64_t samples, bool force);

  // Runs `fn` with the parameters of the last sync in the module, then puts
  // this rank's back: evaluation and the checkpoint's model see the synced
  // model, the same on every rank.
  void with_synced(const std::function<void()>& fn);

  // Checkpoint state. Shared (the same on every rank): the synced
  // parameters' outer momentum. Own: this rank's parameters and the samples
  // it trained on since the last sync. The synced parameters themselves are
  // the checkpoint's model.
  NamedTensors shared_state() const;
  NamedTensors own_state() const;
  // From a checkpoint whose model (the synced parameters) is in the module.
  // `by_rank`: every rank's own state, by the rank that wrote it. With the
  // same islands each rank takes its own back; with others (another world
  // size, or ranks grouped otherwise), the open window's changes are merged
  // by one outer step, as a sync would have, and the returned note says so.
  std::string load_state(const NamedTensors& shared, const std::vector<NamedTensors>& by_rank, int rank);

  // A new elastic world whose parameters (the last sync's) are in the
  // module: they become the synced ones, with the outer momentum among
  // `shared` (as shared_state() names it; zeros when absent), and an empty
  // window.
  void restart(const NamedTensors& shared);
  // This rank trained samples since the last sync.
  bool window_open() const { return window_samples_ > 0; }

  int64_t syncs() const { return syncs_; }
  // Values this rank puts on the wire between islands per sync: its slice.
  int64_t wire_floats() const;

 private:
  torch::Tensor flat_params() const;
  void set_params(const torch::Tensor& flat);
  void outer_step(const torch::Tensor& mean_change);
  // This rank's slice [lo, hi) of the flat parameters: the part it sums
  // between islands.
  std::pair<int64_t, int64_t> slice() const;
  // The islands' weighted changes summed: this rank's slice across the
  // islands, then the island's slices gathered.
  torch::Tensor sum_islands(const torch::Tensor& change);

  Comm& inside_;
  Comm& across_;
  LocalSyncOptions opts_;
  std::vector<torch::Tensor> params_;  // trainable parameters and floating buffers, in module order
  torch::Tensor anchor_;    // the parameters at the last sync, flat
  torch::Tensor momentum_;  // the outer Nesterov buffer, flat
  double window_samples_ = 0;
  torch::Tensor stash_;     // with_synced: this rank's parameters while the synced ones are in
  int64_t syncs_ = 0;
};

}  // namespace cohort
