// defines: MicroBatches, split_by_weights, weighted_slice, shares_for_speeds, predicted_seconds,
//          describe_split, BalancerOptions, Balancer, SpeedBalance
//
// How a global batch is computed. It is cut into micro-batches in its
// sample order (MicroBatches, data.micro-batch), the same cut at any world
// size, and ranks are dealt contiguous runs of whole micro-batches. So a
// step computes the same micro-batches, each with the same shapes and the
// same per-sample results, whatever the world size and split; with
// dist.grad-compression none and dist.sync step GradSync sums their
// gradients exactly, so the sum's order does not matter either
// (docs/design.md, World-size independence).
//
// Ranks of different speeds (data.balance): the shares, counted in
// micro-batches of a full global batch, follow integer weights. `equal`
// weighs every rank 1 (the even split), `weights` takes data.balance-
// weights, and `auto` re-weighs from each rank's measured compute speed.
// Only the dealing changes: the micro-batches of every optimizer step, the
// loss normalisation and exactly-once do not.
//
// Determinism: every rank feeds the Balancer the same all-gathered figures
// at the same steps, so every rank computes the same shares.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cohort/config/choice.hpp"
#include "cohort/data/order.hpp"
#include "cohort/device/device_feed.hpp"

namespace cohort {

// The cut of a global batch into micro-batches (data.micro-batch): n
// samples make count(n) micro-batches of near-equal size (split_evenly), in
// the batch's sample order. `most` > 0: ceil(n / most) of at most `most`
// samples. 0 (auto): a multiple of 12 micro-batches of at most 32 samples
// (n of one sample when n is smaller), so 1, 2, 3, 4, 6 or 12 ranks get
// equal shares. A pure function of n: the world size never enters.
struct MicroBatches {
  static constexpr int64_t kAutoMost = 32, kAutoMultiple = 12;
  int64_t most = 0;
  int64_t count(int64_t n) const {
    if (n <= 0) return 0;
    if (most > 0) return (n - 1) / most + 1;
    const int64_t at_most = (n - 1) / kAutoMost + 1;
    return std::min(n, ((at_most - 1) / kAutoMultiple + 1) * kAutoMultiple);
  }
  // Micro-batch i's samples, as positions in the n-sample batch.
  Slice at(int64_t n, int64_t i) const { return split_evenly(n, i, count(n)); }
};

// n items dealt by integer weights, largest remainder first: share i is
// floor(n * w_i / W), plus one for each of the n - sum(floors) ranks with
// the largest remainders (n * w_i mod W), ties to the lower rank. The shares
// sum to n; with equal weights they are split_evenly's, and with weights
// that sum to n they are the weights. Weights >= 0 with a positive sum.
std::vector<int64_t> split_by_weights(int64_t n, const std::vector<int64_t>& weights);

// Rank `rank`'s contiguous slice of [0, n) under `weights`.
Slice weighted_slice(int64_t n, const std::vector<int64_t>& weights, int rank);

// Integer shares of n proportional to positive `speeds`, each at least
// `min_share` when n allows it (min_share per rank first, the rest
// proportionally). Ties go to the lower rank.
std::vector<int64_t> shares_for_speeds(int64_t n, const std::vector<double>& speeds, int64_t min_share);

// The step time a split predicts: the slowest rank's share / speed.
double predicted_seconds(const std::vector<int64_t>& shares, const std::vector<double>& speeds);

// "rank 0 5 micro-batch(es), rank 1 3"
std::string describe_split(const std::vector<int64_t>& shares);

struct BalancerOptions {
  Balance mode = Balance::kEqual;
  int64_t micro_batches = 1;  // of a full global batch: what the shares deal
  int world_size = 1;
  std::vector<double> weights;  // data.balance-weights (mode weights), one per rank
  // A checkpoint's shares: used by auto at the same world size and count
  // of micro-batches; otherwise auto starts equal.
  std::vector<int64_t> resumed;
};

class Balancer {
 public:
  // A new split must predict a step at least this much faster to replace
  // the current one: measurement noise then cannot make it oscillate.
  static constexpr double kHysteresis = 0.05;

  explicit Balancer(const BalancerOptions& o);

  Balance mode() const { return mode_; }
  // Each rank's micro-batches of a full global batch; they sum to its count.
  const std::vector<int64_t>& shares() const { return shares_; }
  // Samples per second of compute per rank, as last measured (auto).
  const std::vector<double>& speeds() const { return speeds_; }

  // One measurement window (auto): each rank's samples and seconds of
  // forward + backward since the last update, identical on every rank.
  // Returns true when the shares changed. Other modes never change.
  bool update(const std::vector<double>& samples, const std::vector<double>& seconds);

 private:
  Balance mode_;
  int64_t micro_batches_;
  std::vector<int64_t> shares_;
  std::vector<double> speeds_;  // 0: not measured yet
};

class Loader;

// data.balance = auto over a world's steps: each rank's samples and compute
// seconds are pooled every `every` steps (one collective, through `sum`),
// and when the Balancer picks a new split the loader deals the coming steps
// by it. The world's first step (warm-up) is not measured. Collective
// contract: every rank calls after_step at every step with the same `step`.
class SpeedBalance {
 public:
  // An all-reduce (sum) over the ranks.
  using Sum = std::function<std::vector<double>(const std::vector<double>&)>;

  SpeedBalance(Balancer& balancer, Loader& loader, int rank, int world_size, int64_t every, int64_t first_step);
  // After step `step` of `total`, with this rank's samples of it. Returns
  // "balance: step 40: rank 0 5 micro-batch(es), rank 1 3 (measured 410, 230
  // samples/s)" when the split changed, "" otherwise.
  // `clock` timed this rank's forward and backward; it is read (on a GPU,
  // one wait for the device) only at the measurement.
  std::string after_step(int64_t step, int64_t total, int64_t samples, ComputeClock& clock, const Sum& sum);

 private:
  Balancer& balancer_;
  Loader& loader_;
  int rank_, world_size_;
  int64_t every_, first_step_;
  double window_samples_ = 0;  // this rank's, since the last measurement
};

}  // namespace cohort
