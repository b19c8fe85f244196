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
// On a narrow wire (bf16, fp16, int8, int4) with error feedback each rank adds
// to its slice of the change what rounding left out of its last one, and
// keeps what this rounding leaves out: over the syncs the islands' sum
// misses nothing for good (Seide et al. 2014; Karimireddy et al. 2019).
//
// Streamed (Streaming DiLoCo, Douillard et al. 2025): the flat parameters
// are cut into `fragments` contiguous pieces, and fragment f meets the
// others every `every` steps, offset by (f + 1) * every / fragments, so a
// different, smaller sum travels every every / fragments steps. With a
// `delay` of d steps a fragment's sum is started after step s and applied
// after step s + d while training goes on: the landed fragment is the outer
// step's result mixed with the local progress of those d steps, mix * local
// + (1 - mix) * synced. With delay 0 every sum blocks, as above. An
// evaluation in the meantime applies the sum's outer step to the synced
// parameters early (with_newest_synced); the fragment still lands at s + d.
//
// Islands (dist.islands): the ranks of an island train one model exactly
// together (their gradients summed every step), so the island is the unit
// that meets the others. Its change is weighted by the samples the island
// trained, and each of its k ranks sums one k-th of the change with the
// ranks of the same island rank elsewhere (`across`), so that the traffic
// between islands is one model's change per island, not k; the island then
// gathers the pieces over its own fast links (`inside`). Islands of unequal
// sizes cut the change into as many slices as the smallest has ranks; an
// island's ranks beyond those send nothing and gather the pieces. Flat local
// steps are islands of one rank: `inside` is a group of one, `across` the
// world.
//
// Cross-rank contract: every rank calls after_step() at every step with the
// same step and force; the sums over `inside` and `across` are the only
// collectives.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
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
  Compression wire = Compression::kNone;  // the parameter change on the wire: fp32, bf16, fp16, int8 or int4
  int64_t fragments = 1;      // dist.outer-fragments
  int64_t delay = 0;          // dist.outer-delay: steps a fragment's sum travels while training goes on
  double mix = 0.5;           // optim.outer-mix: the local parameters' weight when a delayed fragment lands
  bool error_feedback = false;  // dist.outer-error-feedback: rounding's remainder goes with the next sync
  std::vector<int> island_of;  // each global rank's island; empty: every rank its own
};

// Islands' sizes from LocalSyncOptions::island_of: the smallest one's ranks.
int island_width(const std::vector<int>& island_of);

class LocalSync {
 public:
  // `inside`: this rank's island; `across`: this island rank in every island.
  // A sum still travelling when it is destroyed (the run failed) is left to
  // its process group, whose work holds its tensors.
  LocalSync(Comm& inside, Comm& across, torch::nn::Module& module, LocalSyncOptions opts);

  // After inner step `step` (1-based), on which this rank trained `samples`:
  // starts the sums of the fragments due, and lands the one whose delay is
  // over. When `force` (the run's last step), every fragment meets, blocking.
  // Returns true when every fragment met at this step (the replicas hold the
  // same parameters).
  bool after_step(int64_t step, int64_t samples, bool force);

  // Runs `fn` with the parameters of the last sync in the module, then puts
  // this rank's back: evaluation and the checkpoint's model see the synced
  // model, the same on every rank.
  void with_synced(const std::function<void()>& fn);
  // Collective (every rank, at one step): as with_synced, with the newest
  // sync in: a fragment still travelling is waited for and its outer step
  // applied to the synced parameters now, not at its step; it still lands
  // in this rank's parameters at its step, so training does not change.
  // Evaluation then sees the newest model the islands agree on, not one
  // whose last-sent fragment is a window old, and a checkpoint written at
  // the same step holds that model (and the landing still due).
  void with_newest_synced(const std::function<void()>& fn);

  // Checkpoint state. Shared (the same on every rank): the synced
  // parameters' outer momentum, and which fragment is in flight until when
  // (and whether its outer step is applied already: then it only lands).
  // Own: this rank's parameters, the samples it trained on since each
  // fragment last met, its island, what it sent of the fragment in flight,
  // and its error-feedback remainder. The synced parameters themselves are
  // the checkpoint's model.
  NamedTensors shared_state() const;
  NamedTensors own_state() const;
  // From a checkpoint whose model (the synced parameters) is in the module.
  // `by_rank`: every rank's own state, by the rank that wrote it. With the
  // same islands and fragments each rank takes its own back and the fragment
  // in flight is sent again; with others (another world size, ranks grouped
  // otherwise), the open windows' changes are merged by one outer step per
  // fragment, as a sync would have, and the returned note says so.
  std::string load_state(const NamedTensors& shared, const std::vector<NamedTensors>& by_rank, int rank);

  // The island whose state writer `rank`'s own state is (checkpoints from
  // before islands: its rank).
  static int writer_island(const NamedTensors& own, int rank);

  // A new elastic world whose parameters (the last sync's) are in the
  // module: they become the synced ones, with the outer momentum among
  // `shared` (as shared_state() names it; zeros when absent), and an empty
  // window.
  void restart(const NamedTensors& shared);
  // This rank trained samples since a fragment last met, or a sum travels.
  bool window_open() const;

  int64_t syncs() const { return syncs_; }
  // Bytes this rank puts on the wire between islands per outer step (every
  // fragment once): its slice of each, in the wire's form.
  int64_t wire_bytes() const;

 private:
  struct Range {
    int64_t lo = 0, hi = 0;
    int64_t size() const { return hi - lo; }
  };
  // A fragment's sum on its way.
  struct InFlight {
    int64_t fragment = 0;
    int64_t due = 0;         // the step after which it lands
    bool delayed = false;    // lands mixed with the local progress
    double rank_samples = 0;  // this rank's samples in the window it closed
    double island_samples = 0;  // its island's (sent; `count` is summed in place)
    torch::Tensor sent;      // this rank's weighted slice as sent, in the wire's form (a checkpoint sends it again)
    torch::Tensor count;     // the islands' samples being summed
    std::function<void()> wait_count;
    std::function<torch::Tensor()> sum;  // waits; the islands' weighted slices summed, fp32
    bool applied = false;    // its outer step is in the synced parameters (received early); it lands at `due`
  };

  torch::Tensor flat_params() const;
  void set_params(const torch::Tensor& flat);
  Range fragment(int64_t f) const;
  // This island rank's piece of `r`: the part it sums between islands.
  Range slice(const Range& r) const;
  // When fragment f's window closes (steps ≡ this mod every).
  int64_t offset(int64_t f) const { return (f + 1) * opts_.every / opts_.fragments % opts_.every; }
  // Closes fragment f's window: its weighted change starts across the islands.
  void start(int64_t f, int64_t due, bool delayed);
  // Sends `flight`'s slice: the islands' sample count, then the change.
  void launch(InFlight& flight);
  // Waits for `flight`'s sum, gathers the island's slices and applies the
  // outer step to its fragment of the synced parameters (once).
  void apply(InFlight& flight);
  // Applies the sum in flight and lands the fragment in the module.
  void finish();
  // Lands fragment `r` of the synced parameters in `flat` (a rank's): after
  // a delay, mixed with the local progress made while the sum travelled.
  void land(const Range& r, bool delayed, torch::Tensor& flat) const;
  void outer_step(const Range& r, const torch::Tensor& mean_change);

  // The world's ranks and islands, this rank's island, and the slices the
  // change is summed in (the smallest island's ranks).
  int world_size() const;
  int islands() const;

  Comm& inside_;
  Comm& across_;
  LocalSyncOptions opts_;
  int island_ = 0;
  int width_ = 1;
  std::vector<torch::Tensor> params_;  // trainable parameters and floating buffers, in module order
  torch::Tensor anchor_;    // the parameters at each fragment's last sync, flat
  torch::Tensor momentum_;  // the outer Nesterov buffer, flat
  // Error feedback: per value of this rank's slices (fragment f's from
  // kept_at_[f]), what the wire's rounding left out of its last change (per
  // sample, as the change).
  torch::Tensor remainder_;
  std::vector<int64_t> kept_at_;
  torch::Tensor kept(int64_t f) const;  // fragment f's slice of remainder_
  std::vector<double> samples_;  // per fragment: this rank's samples since its window opened
  std::unique_ptr<InFlight> in_flight_;
  torch::Tensor stash_;     // with_synced: this rank's parameters while the synced ones are in
  int64_t syncs_ = 0;
};

}  // namespace cohort
