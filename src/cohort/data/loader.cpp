#include "cohort/data/loader.hpp"

#include <algorithm>
#include <numeric>

#include "cohort/core/error.hpp"
#include "cohort/data/balance.hpp"

namespace cohort {

Loader::Loader(const Dataset& data, const GlobalOrder& order, LoaderOptions opts, Cursor start)
    : data_(data), order_(order), opts_(std::move(opts)), start_(start) {
  COHORT_CHECK(opts_.world_size >= 1 && opts_.rank >= 0 && opts_.rank < opts_.world_size, Error,
               "loader: rank ", opts_.rank, " is outside world size ", opts_.world_size);
  shares_ = opts_.shares.empty() ? std::vector<int64_t>(static_cast<size_t>(opts_.world_size), 1) : opts_.shares;
  COHORT_CHECK(static_cast<int>(shares_.size()) == opts_.world_size, Error, "loader: ", shares_.size(),
               " shares for ", opts_.world_size, " ranks");
  COHORT_CHECK(opts_.micro_batch >= 0, Error, "loader: micro-batch of ", opts_.micro_batch, " samples");
  COHORT_CHECK(start_.consumed >= 0 && start_.consumed < order_.usable(), Error,
               "loader: start cursor ", start_.consumed, " is outside the epoch's ", order_.usable(),
               " samples");
  for (int i = 0; i < opts_.workers; ++i) threads_.emplace_back([this] { work(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

StepBatch Loader::build(int64_t k, const std::vector<int64_t>& shares) const {
  StepBatch out;
  out.cursor = order_.cursor_after(start_, k);
  out.next = order_.advance(out.cursor);
  out.global_samples = order_.batch_size_at(out.cursor);
  auto perm = order_.permutation(out.cursor.epoch);
  const MicroBatches cut{opts_.micro_batch};
  // This rank's run of whole micro-batches; a short last batch of an epoch
  // has fewer, dealt by the same weights.
  const Slice mine = weighted_slice(cut.count(out.global_samples), shares, opts_.rank);
  // An empty share still runs one (empty) micro-batch: the step's
  // collectives are every rank's.
  for (int64_t j = 0; j < std::max<int64_t>(mine.size(), 1); ++j) {
    const Slice micro = mine.size() == 0 ? Slice{} : cut.at(out.global_samples, mine.begin + j);
    out.micro_rows.push_back({static_cast<int64_t>(out.indices.size()),
                              static_cast<int64_t>(out.indices.size()) + micro.size()});
    std::vector<int64_t> ids;
    ids.reserve(static_cast<size_t>(micro.size()));
    for (int64_t i = micro.begin; i < micro.end; ++i) {
      ids.push_back((*perm)[static_cast<size_t>(out.cursor.consumed + i)]);
    }
    Example micro_batch = ids.empty() ? Example{} : data_.draw_batch(ids, out.cursor.epoch);
    if (opts_.pin_memory) {
      for (auto& [name, t] : micro_batch) t = t.pin_memory();
    }
    out.micro.push_back(std::move(micro_batch));
    out.indices.insert(out.indices.end(), ids.begin(), ids.end());
  }
  return out;
}

void Loader::reshare(std::vector<int64_t> shares) {
  int64_t total = 0;
  for (int64_t s : shares) {
    COHORT_CHECK(s >= 0, Error, "loader: negative share ", s);
    total += s;
  }
  const int64_t micro_batches = MicroBatches{opts_.micro_batch}.count(order_.global_batch());
  COHORT_CHECK(static_cast<int>(shares.size()) == opts_.world_size && total == micro_batches, Error, "loader: ",
               shares.size(), " shares summing to ", total, " for ", opts_.world_size, " ranks and a global batch of ",
               micro_batches, " micro-batches");
  {
    std::lock_guard<std::mutex> lock(mu_);
    shares_ = std::move(shares);
    ++version_;
    ready_.clear();
    failed_.clear();
    next_to_claim_ = next_to_return_;
  }
  cv_.notify_all();
}

void Loader::work() {
  for (;;) {
    int64_t k, version;
    std::vector<int64_t> shares;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || next_to_claim_ < next_to_return_ + opts_.prefetch; });
      if (stop_) return;
      k = next_to_claim_++;
      shares = shares_;
      version = version_;
    }
    StepBatch batch;
    std::exception_ptr error;
    try {
      batch = build(k, shares);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (version != version_) continue;  // dealt with old shares: reshare() reclaimed it
      if (error) failed_[k] = error;
      else ready_[k] = std::move(batch);
    }
    cv_.notify_all();
  }
}

StepBatch Loader::next() {
  if (threads_.empty()) return build(next_to_return_++, shares_);
  std::unique_lock<std::mutex> lock(mu_);
  int64_t k = next_to_return_;
  cv_.wait(lock, [&] { return ready_.count(k) || failed_.count(k); });
  if (auto it = failed_.find(k); it != failed_.end()) std::rethrow_exception(it->second);
  StepBatch out = std::move(ready_[k]);
  ready_.erase(k);
  ++next_to_return_;
  lock.unlock();
  cv_.notify_all();
  return out;
}

Slice eval_shard(int64_t n, int rank, int world_size) { return split_evenly(n, rank, world_size); }

}  // namespace cohort

