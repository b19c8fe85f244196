#include "cohort/data/balance.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cohort/core/error.hpp"
#include "cohort/core/format.hpp"
#include "cohort/data/loader.hpp"

namespace cohort {

namespace {

// Floors plus one for the `left` largest remainders; `remainder(i)` orders
// ranks (larger first, ties to the lower rank).
template <class Rem>
void hand_out(std::vector<int64_t>& shares, int64_t left, Rem remainder) {
  std::vector<size_t> order(shares.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return remainder(a) > remainder(b); });
  for (int64_t i = 0; i < left; ++i) ++shares[order[static_cast<size_t>(i) % order.size()]];
}

}  // namespace

std::vector<int64_t> split_by_weights(int64_t n, const std::vector<int64_t>& weights) {
  __int128 total = 0;
  for (int64_t w : weights) {
    COHORT_CHECK(w >= 0, Error, "split_by_weights: negative weight ", w);
    total += w;
  }
  COHORT_CHECK(!weights.empty() && total > 0 && n >= 0, Error, "split_by_weights: no positive weight");
  std::vector<int64_t> shares(weights.size());
  std::vector<__int128> rem(weights.size());
  int64_t dealt = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    __int128 q = static_cast<__int128>(n) * weights[i];
    shares[i] = static_cast<int64_t>(q / total);
    rem[i] = q % total;
    dealt += shares[i];
  }
  hand_out(shares, n - dealt, [&](size_t i) { return rem[i]; });
  return shares;
}

Slice weighted_slice(int64_t n, const std::vector<int64_t>& weights, int rank) {
  auto shares = split_by_weights(n, weights);
  int64_t begin = std::accumulate(shares.begin(), shares.begin() + rank, int64_t{0});
  return {begin, begin + shares[static_cast<size_t>(rank)]};
}

std::vector<int64_t> shares_for_speeds(int64_t n, const std::vector<double>& speeds, int64_t min_share) {
  const auto ranks = static_cast<int64_t>(speeds.size());
  double top = 0;
  for (double s : speeds) {
    COHORT_CHECK(std::isfinite(s) && s > 0, Error, "shares_for_speeds: speed ", s, " is not positive");
    top = std::max(top, s);
  }
  double total = 0;  // of speeds / top, so that huge weights cannot overflow
  for (double s : speeds) total += s / top;
  COHORT_CHECK(ranks > 0, Error, "shares_for_speeds: no ranks");
  int64_t floor_each = n >= min_share * ranks ? min_share : 0;
  int64_t rest = n - floor_each * ranks;
  std::vector<int64_t> shares(speeds.size());
  std::vector<double> rem(speeds.size());
  int64_t dealt = 0;
  for (size_t i = 0; i < speeds.size(); ++i) {
    double q = static_cast<double>(rest) * (speeds[i] / top) / total;
    shares[i] = std::min(rest, static_cast<int64_t>(std::floor(q)));
    rem[i] = q - static_cast<double>(shares[i]);
    dealt += shares[i];
  }
  hand_out(shares, rest - dealt, [&](size_t i) { return rem[i]; });
  for (auto& s : shares) s += floor_each;
  return shares;
}

double predicted_seconds(const std::vector<int64_t>& shares, const std::vector<double>& speeds) {
  double worst = 0;
  for (size_t i = 0; i < shares.size(); ++i) worst = std::max(worst, static_cast<double>(shares[i]) / speeds[i]);
  return worst;
}

Balancer::Balancer(const BalancerOptions& o)
    : mode_(o.mode), micro_batches_(o.micro_batches), speeds_(static_cast<size_t>(o.world_size), 0.0) {
  shares_ = split_by_weights(o.micro_batches, std::vector<int64_t>(static_cast<size_t>(o.world_size), 1));
  if (o.mode == Balance::kWeights) {
    COHORT_CHECK(static_cast<int>(o.weights.size()) == o.world_size, ConfigError, "data.balance-weights has ",
                 o.weights.size(), " weight(s) but the world has ", o.world_size, " rank(s): give one per rank");
    shares_ = shares_for_speeds(o.micro_batches, o.weights, 0);
  } else if (o.mode == Balance::kAuto && static_cast<int>(o.resumed.size()) == o.world_size &&
             std::accumulate(o.resumed.begin(), o.resumed.end(), int64_t{0}) == o.micro_batches) {
    shares_ = o.resumed;
  }
}

bool Balancer::update(const std::vector<double>& samples, const std::vector<double>& seconds) {
  if (mode_ != Balance::kAuto || shares_.size() < 2) return false;
  // A rank that computed nothing this window keeps its last speed; one
  // never measured takes the mean of the measured ones.
  double measured_sum = 0;
  int measured = 0;
  for (size_t i = 0; i < speeds_.size(); ++i) {
    if (samples[i] > 0 && seconds[i] > 0) speeds_[i] = samples[i] / seconds[i];
    if (speeds_[i] > 0) measured_sum += speeds_[i], ++measured;
  }
  if (measured == 0) return false;
  std::vector<double> speeds = speeds_;
  for (auto& s : speeds) {
    if (s <= 0) s = measured_sum / measured;
  }
  // Every rank keeps at least one micro-batch, when there are enough, so
  // every rank stays measured.
  auto proposal = shares_for_speeds(micro_batches_, speeds, 1);
  if (proposal == shares_) return false;
  if (predicted_seconds(proposal, speeds) > (1.0 - kHysteresis) * predicted_seconds(shares_, speeds)) return false;
  shares_ = std::move(proposal);
  return true;
}

std::string describe_split(const std::vector<int64_t>& shares) {
  std::string out;
  for (size_t r = 0; r < shares.size(); ++r) {
    out += strf("%srank %zu %lld%s", r ? ", " : "", r, static_cast<long long>(shares[r]), r ? "" : " micro-batch(es)");
  }
  return out;
}

SpeedBalance::SpeedBalance(Balancer& balancer, Loader& loader, int rank, int world_size, int64_t every,
                           int64_t first_step)
    : balancer_(balancer), loader_(loader), rank_(rank), world_size_(world_size), every_(every),
      first_step_(first_step) {}

std::string SpeedBalance::after_step(int64_t step, int64_t total, int64_t samples, ComputeClock& clock, const Sum& sum) {
  if (balancer_.mode() != Balance::kAuto || world_size_ < 2) return "";
  if (step > first_step_ + 1) window_samples_ += static_cast<double>(samples);
  else clock.discard();  // the warm-up step
  if ((step - first_step_) % every_ != 0 || step == total) return "";
  std::vector<double> mine(2 * static_cast<size_t>(world_size_), 0.0);
  mine[static_cast<size_t>(rank_)] = window_samples_;
  mine[static_cast<size_t>(world_size_ + rank_)] = clock.take();
  auto all = sum(mine);
  window_samples_ = 0;
  std::vector<double> per_rank(all.begin(), all.begin() + world_size_), seconds(all.begin() + world_size_, all.end());
  if (!balancer_.update(per_rank, seconds)) return "";
  loader_.reshare(balancer_.shares());
  std::string speeds;
  for (double s : balancer_.speeds()) speeds += strf("%s%.0f", speeds.empty() ? "" : ", ", s);
  return strf("balance: step %lld: %s (measured %s samples/s)", static_cast<long long>(step),
              describe_split(balancer_.shares()).c_str(), speeds.c_str());
}

}  // namespace cohort
