#include "cohort/data/order.hpp"

#include <algorithm>

#include "cohort/core/error.hpp"
#include "cohort/core/random.hpp"

namespace cohort {

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  Rng rng(splitmix64(seed ^ splitmix64(static_cast<uint64_t>(epoch) + 0x51ED)));
  rng.shuffle(perm);
  return perm;
}

Slice split_evenly(int64_t n, int64_t part, int64_t parts) {
  int64_t base = n / parts, extra = n % parts;
  int64_t begin = part * base + std::min(part, extra);
  return {begin, begin + base + (part < extra ? 1 : 0)};
}

GlobalOrder::GlobalOrder(int64_t dataset_size, int64_t global_batch, uint64_t seed, bool drop_last,
                         Bucketing bucketing)
    : size_(dataset_size), batch_(global_batch), seed_(seed), bucketing_(std::move(bucketing)) {
  COHORT_CHECK(size_ > 0, DataError, "the training set is empty");
  COHORT_CHECK(batch_ > 0, ConfigError, "data.global-batch must be >= 1 (got ", batch_, ")");
  usable_ = drop_last ? (size_ / batch_) * batch_ : size_;
  COHORT_CHECK(usable_ > 0, ConfigError, "data.drop-last with data.global-batch ", batch_,
               " leaves no batch of a ", size_, "-sample dataset");
}

// Ceiling divisions are written (n - 1) / b + 1: n + b - 1 overflows for a
// global batch near INT64_MAX.
int64_t GlobalOrder::steps_per_epoch() const { return (usable_ - 1) / batch_ + 1; }

int64_t GlobalOrder::batch_size_at(const Cursor& c) const {
  return std::min(batch_, usable_ - c.consumed);
}

Cursor GlobalOrder::advance(const Cursor& c) const {
  Cursor next{c.epoch, c.consumed + batch_size_at(c)};
  if (next.consumed >= usable_) next = {c.epoch + 1, 0};
  return next;
}

Cursor GlobalOrder::cursor_after(const Cursor& start, int64_t steps) const {
  int64_t left_in_first = (usable_ - start.consumed - 1) / batch_ + 1;
  if (steps < left_in_first) return {start.epoch, start.consumed + steps * batch_};
  steps -= left_in_first;
  int64_t spe = steps_per_epoch();
  return {start.epoch + 1 + steps / spe, (steps % spe) * batch_};
}

std::shared_ptr<const std::vector<int64_t>> GlobalOrder::permutation(int64_t epoch) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [e, p] : cache_) {
    if (e == epoch) return p;
  }
  auto perm = std::make_shared<const std::vector<int64_t>>(bucketed(epoch_permutation(size_, seed_, epoch), epoch));
  if (cache_.size() >= 2) cache_.erase(cache_.begin());
  cache_.emplace_back(epoch, perm);
  return perm;
}

std::vector<int64_t> GlobalOrder::bucketed(std::vector<int64_t> perm, int64_t epoch) const {
  if (bucketing_.window_batches <= 0) return perm;
  const int64_t window = bucketing_.window_batches * batch_;
  std::vector<int64_t> lengths(perm.size());
  for (int64_t begin = 0, w = 0; begin < usable_; begin += window, ++w) {
    int64_t end = std::min(begin + window, usable_);
    auto first = perm.begin() + begin, last = perm.begin() + end;
    for (auto it = first; it != last; ++it) lengths[static_cast<size_t>(it - perm.begin())] = bucketing_.length(*it);
    // Longest first; ties keep the permutation's order.
    std::vector<int64_t> pos(static_cast<size_t>(end - begin));
    for (int64_t i = 0; i < end - begin; ++i) pos[i] = begin + i;
    std::stable_sort(pos.begin(), pos.end(), [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
    std::vector<int64_t> sorted(pos.size());
    for (size_t i = 0; i < pos.size(); ++i) sorted[i] = perm[static_cast<size_t>(pos[i])];
    // Shuffle the window's full batches; a short last batch (the epoch's
    // end) stays last.
    int64_t full = (end - begin) / batch_;
    auto order = epoch_permutation(full, splitmix64(seed_ ^ 0xB0C4E7ull) + static_cast<uint64_t>(w),
                                   epoch);
    for (int64_t b = 0; b < full; ++b) {
      std::copy_n(sorted.begin() + order[b] * batch_, batch_, first + b * batch_);
    }
    std::copy(sorted.begin() + full * batch_, sorted.end(), first + full * batch_);
  }
  return perm;
}

}  // namespace cohort
