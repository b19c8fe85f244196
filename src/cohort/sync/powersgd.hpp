// defines: powersgd_compresses, PowerSgdBucket
//
// PowerSGD (Vogels et al., NeurIPS 2019), as PyTorch's DDP powerSGD_hook
// does it: each gradient matrix M (a tensor viewed as shape[0] x the rest) is
// summed over the ranks as a rank-r product P Q^T found by one step of power
// iteration, P = M Q, then Q = M^T orth(P), with one all-reduce for all the
// bucket's Ps and one for its Qs. Q is kept from step to step (warm start).
// What the approximation leaves out stays on each rank (error feedback) and
// is added to the next step's gradient, so nothing is lost, only delayed.
// One-dimensional tensors and those too small to gain (PyTorch's rule:
// (rows + cols) * r * 2 >= rows * cols) are summed exactly.
//
// Cross-rank contract: every rank builds the bucket from the same shapes,
// rank and seed, so the random first Q is the same everywhere; every rank
// then computes the same orth(P) from the same reduced bits.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>


namespace cohort {

class Comm;
// Named tensors, as ckpt/safetensors.hpp declares them (a layer above).
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Whether a tensor of this shape is sent as a rank-r product.
bool powersgd_compresses(c10::IntArrayRef shape, int64_t rank);

class PowerSgdBucket {
 public:
  // `grads`: the bucket's gradients (their shapes; names for the state).
  // `seed` draws the first Q of each matrix, the same on every rank.
  PowerSgdBucket(const std::vector<torch::Tensor>& grads, const std::vector<std::string>& names, int64_t rank,
                 uint64_t seed);

  // Sums `grads` over the ranks in place (collective; blocking): exactly for
  // the tensors not compressed, as the rank-r approximation for the others,
  // whose remainder each rank keeps for its next call.
  void reduce(Comm& comm, const std::vector<torch::Tensor>& grads);

  // Floats this bucket puts on the wire per call, and what an exact sum would.
  int64_t wire_floats() const;
  int64_t exact_floats() const { return exact_floats_; }
  size_t matrices() const { return matrices_.size(); }

  // Checkpoint state: the Qs (the same on every rank) and this rank's
  // error-feedback remainders, each named "<prefix><tensor name>".
  NamedTensors shared_state() const;
  NamedTensors own_state() const;
  // Restores what the names match; a missing remainder starts at zero.
  void load_shared_state(const NamedTensors& tensors);
  void load_own_state(const NamedTensors& tensors);
  // Back to the first step's state: fresh Qs, no remainders.
  void reset();

 private:
  struct Matrix {
    size_t index;  // into the bucket's grads
    std::string name;
    int64_t rows, cols;
    torch::Tensor q;      // cols x r, warm-started
    torch::Tensor error;  // rows x cols, this rank's remainder; undefined until the first call
  };
  std::vector<Matrix> matrices_;
  std::vector<size_t> exact_;  // indices sent uncompressed
  // fp32 on the gradients' device: every tensor of the bucket's state lives
  // there (a checkpoint's, read on the CPU, is moved on load).
  torch::TensorOptions options_ = torch::TensorOptions(torch::kFloat32);
  int64_t rank_;
  uint64_t seed_;
  int64_t exact_floats_ = 0;
};

}  // namespace cohort
