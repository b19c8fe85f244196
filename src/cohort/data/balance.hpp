// defines: split_by_weights, weighted_slice, shares_for_speeds, predicted_seconds, describe_split,
//          BalancerOptions, Balancer, SpeedBalance
//
// Ranks of different speeds (data.balance). Each global batch is dealt to
// ranks as contiguous shares whose sizes follow integer weights, the
// shares of the full global batch. `equal` weighs every rank 1 (the even
// split), `weights` takes data.balance-weights, and `auto` re-weighs from
// each rank's measured compute speed. Only the dealing changes: the samples
// of every optimizer step, the loss normalisation and exactly-once do not.
//
// Determinism: every rank feeds the Balancer the same all-gathered figures
// at the same steps, so every rank computes the same shares.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cohort/config/choice.hpp"
#include "cohort/data/order.hpp"
#include "cohort/device/device_feed.hpp"

namespace cohort {

// n samples dealt by integer weights, largest remainder first: share i is
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

// "rank 0 41 samples, rank 1 23"
std::string describe_split(const std::vector<int64_t>& shares);

struct BalancerOptions {
  Balance mode = Balance::kEqual;
  int64_t global_batch = 1;
  int world_size = 1;
  std::vector<double> weights;  // data.balance-weights (mode weights), one per rank
  // A checkpoint's shares: used by auto at the same world size and global
  // batch; otherwise auto starts equal.
  std::vector<int64_t> resumed;
};

class Balancer {
 public:
  // A new split must predict a step at least this much faster to replace
  // the current one: measurement noise then cannot make it oscillate.
  static constexpr double kHysteresis = 0.05;

  explicit Balancer(const BalancerOptions& o);

  Balance mode() const { return mode_; }
  // The shares of a full global batch, one per rank; they sum to it.
  const std::vector<int64_t>& shares() const { return shares_; }
  // Samples per second of compute per rank, as last measured (auto).
  const std::vector<double>& speeds() const { return speeds_; }

  // One measurement window (auto): each rank's samples and seconds of
  // forward + backward since the last update, identical on every rank.
  // Returns true when the shares changed. Other modes never change.
  bool update(const std::vector<double>& samples, const std::vector<double>& seconds);

 private:
  Balance mode_;
  int64_t global_batch_;
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
  // After step `step` of `total`, with this rank's share of it. Returns
  // "balance: step 40: rank 0 41 samples, rank 1 23 (measured 410, 230
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
