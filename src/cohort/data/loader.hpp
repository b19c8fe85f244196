// defines: StepBatch, LoaderOptions, Loader, eval_shard
//
// The loader turns the global order into this rank's micro-batches, step by
// step, and prepares them on background threads so compute never waits on
// data. Step k's batch is a pure function of (start cursor, k, rank, the
// shares in effect at k), so workers can build steps out of order; the
// consumer still receives them in order. Each global batch is cut into
// micro-batches the same way at any world size (MicroBatches), and a rank
// computes its share of them, whole.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "cohort/data/dataset.hpp"
#include "cohort/data/order.hpp"

namespace cohort {

// What one rank runs for one optimizer step.
struct StepBatch {
  Cursor cursor;               // where this global batch starts
  Cursor next;                 // where the next one starts
  int64_t global_samples = 0;  // samples in the whole global batch, all ranks
  std::vector<Example> micro;  // this rank's micro-batches; one empty Example
                               // when this rank's share is empty
  std::vector<int64_t> indices;  // this rank's sample ids, in order
  std::vector<Slice> micro_rows; // per micro-batch, its ids in `indices`
  // `micro` on the device, staged ahead of the step (DeviceFeed); empty:
  // the step copies each micro-batch when it runs it.
  std::vector<Example> staged;
};

struct LoaderOptions {
  int rank = 0;
  int world_size = 1;
  int64_t micro_batch = 0;          // data.micro-batch (MicroBatches::most)
  std::vector<int64_t> shares;      // per rank, its micro-batches of a full
                                    // global batch (data/balance.hpp); empty: equal
  int workers = 1;   // 0: build batches on the caller's thread
  int prefetch = 4;  // steps built ahead of the consumer
  bool pin_memory = false;  // page-locked batches, for non-blocking copies to a GPU
};

class Loader {
 public:
  Loader(const Dataset& data, const GlobalOrder& order, LoaderOptions opts, Cursor start);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next step's batch. Rethrows a worker's exception (a bad sample).
  StepBatch next();

  // Deals every step not yet returned by next() with these shares (one
  // per rank, summing to a full global batch's micro-batches). Batches already prepared are
  // rebuilt. Every rank calls it at the same step.
  void reshare(std::vector<int64_t> shares);

  // Builds step `k` after the start cursor with `shares`. Pure.
  StepBatch build(int64_t k, const std::vector<int64_t>& shares) const;

 private:
  void work();

  const Dataset& data_;
  const GlobalOrder& order_;
  LoaderOptions opts_;
  Cursor start_;

  std::mutex mu_;
  std::condition_variable cv_;
  int64_t next_to_claim_ = 0;   // next step a worker builds
  int64_t next_to_return_ = 0;  // next step next() returns
  std::map<int64_t, StepBatch> ready_;
  std::map<int64_t, std::exception_ptr> failed_;
  std::vector<int64_t> shares_;  // in effect from next_to_return_ on
  int64_t version_ = 0;          // bumped by reshare: older builds are dropped
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// This rank's contiguous, non-overlapping share of an n-sample evaluation set.
// Shares over all ranks cover [0, n) exactly once.
Slice eval_shard(int64_t n, int rank, int world_size);

}  // namespace cohort
