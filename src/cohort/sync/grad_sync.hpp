// defines: broadcast_module, all_reduce_gradients, GradSyncOptions, GradSync
//
// Keeps replicas equal: parameters and buffers start as rank 0's, and after
// every optimizer step's backward the gradients are summed over ranks (each
// rank's loss is already divided by the global unit count, so the sum is the
// global mean).
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "cohort/config/choice.hpp"
#include "cohort/config/config.hpp"
#include "cohort/sync/bucket_reducer.hpp"
#include "cohort/sync/grad_buckets.hpp"
#include "cohort/sync/grad_reduction.hpp"

namespace cohort {

class Comm;

// Copies rank 0's parameters and buffers to every rank.
void broadcast_module(Comm& comm, torch::nn::Module& module);

// Sums gradients over ranks with one flat all-reduce after backward. The
// reference GradSync is tested against; missing gradients count as zeros.
void all_reduce_gradients(Comm& comm, torch::nn::Module& module);

struct GradSyncOptions : BucketReducerOptions {
  int64_t bucket_cap_bytes = 25 << 20;   // dist.bucket-cap-mb
  int64_t first_bucket_bytes = 1 << 20;  // small, so communication starts early
};

// dist.bucket-cap-mb, dist.grad-compression and dist.powersgd-rank.
GradSyncOptions grad_sync_options(const DistOptions& dist, uint64_t seed);

// A bucketed gradient reducer that overlaps communication with backward.
//
// GradSync buckets (GradBuckets), orders and overlaps; how a bucket is
// summed is its BucketReducer's (sync/bucket_reducer.hpp: the exact sum,
// a wire dtype, PowerSGD, reduce to owner). A post hook on each parameter's
// gradient accumulator marks it ready; when every parameter of a bucket is
// ready the bucket is launched, while backward goes on. Where the reducer
// wants them, every .grad is a view into its bucket's flat buffer, so
// backward accumulates straight into the wire buffer.
//
// Cross-rank contract: buckets are identical on every rank (same module, same
// options) and are launched strictly in bucket order, whatever order their
// hooks fire in, so every rank issues the same collectives in the same order.
// A parameter that receives no gradient in a step is reduced as zeros when
// finalize() launches the buckets still pending, so it cannot hang the job.
//
// The exact sum (Compression::kNone): micro-batches' gradients are summed
// in fp64, on this rank (prepare() folds each finished micro-batch's into an
// fp64 accumulator) and on the wire, and rounded to fp32 once. A sum of k
// fp32 values in fp64 is exact unless they span more than about 2^(29 -
// log2 k) in magnitude, and even then its error is far below fp32's
// rounding, so the result (nearly always to the bit) does not depend on
// which rank computed which micro-batch nor on the order of the sums: the
// step is the same at any world size. kFp32 sums in fp32 (half the
// traffic; the rounding then follows the world size).
class GradSync : public GradReduction {
 public:
  GradSync(Comm& comm, torch::nn::Module& module, GradSyncOptions opts = {});
  ~GradSync() override;
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  Comm* summed_over() const override { return &comm_; }
  // Before each micro-batch's backward. `sync` is true only for the last
  // micro-batch of an optimizer step: earlier ones accumulate locally and
  // issue no collective at all (the exact sum folds them into fp64, so
  // .grad holds only the micro-batches since: every step's prepare() calls
  // end with finalize(), which puts the whole sum back), unless the reducer
  // sums every micro-batch (dist.shard = gradients).
  void prepare(bool sync) override;
  // After the last backward: launches pending buckets, waits for all, and
  // writes the summed gradients back into every parameter's .grad (or
  // hands them to the sink).
  void finalize() override;

  // dist.shard = gradients: every micro-batch's prepare() starts a round of
  // sums, so every rank must run as many rounds (empty ones included).
  bool reduces_every_micro_batch() const override { return reducer_->every_micro_batch(); }
  int64_t collectives_issued() const { return collectives_; }
  // Buckets already launched this step (by hooks, during backward).
  size_t launched() const { return next_launch_; }
  // Parameter indices (registration order) of each bucket, in launch order.
  const std::vector<std::vector<size_t>>& buckets() const { return buckets_.all(); }
  // Floats put on the wire per step, and what an exact sum would.
  int64_t wire_floats() const { return reducer_->wire_floats(); }
  int64_t exact_floats() const { return buckets_.total_numel(); }
  // powersgd: matrices compressed, and tensors in all.
  size_t compressed_tensors() const { return reducer_->compressed_tensors(); }
  size_t tensors() const { return buckets_.param_count(); }

  // The reducer's state (powersgd: the Qs, the same on every rank, and this
  // rank's error-feedback remainders; nothing for the others).
  NamedTensors shared_state() const { return reducer_->shared_state(); }
  NamedTensors own_state() const { return reducer_->own_state(); }
  void load_state(const NamedTensors& shared, const NamedTensors& own) { reducer_->load_state(shared, own); }
  // The first step's state (a new elastic world).
  void reset_state() { reducer_->reset_state(); }

 private:
  struct Hook;
  void mark_ready(size_t param);
  void launch(size_t bucket);
  // Launches the buckets still pending and waits for every sum.
  void settle(std::unique_lock<std::mutex>& lock);
  void fill_views();

  Comm& comm_;
  GradBuckets buckets_;
  std::unique_ptr<BucketReducer> reducer_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // keep alive: tensors hold weak refs
  std::vector<uintptr_t> hook_keys_;

  std::mutex mu_;
  bool sync_ = false;
  std::vector<size_t> waiting_;  // per bucket: params not yet ready
  size_t next_launch_ = 0;
  int64_t collectives_ = 0;
  size_t micro_in_step_ = 0;  // prepare() calls since the last finalize()
};

}  // namespace cohort
