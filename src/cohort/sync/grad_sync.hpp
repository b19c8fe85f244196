// defines: broadcast_module, all_reduce_gradients, GradSyncOptions, GradSync
//
// Keeps replicas equal: parameters and buffers start as rank 0's, and after
// every optimizer step's backward the gradients are summed over ranks (each
// rank's loss is already divided by the global unit count, so the sum is the
// global mean).
#pragma once

#include <torch/nn/module.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cohort/config/choice.hpp"
#include "cohort/config/config.hpp"
#include "cohort/sync/grad_reduction.hpp"
#include "cohort/sync/powersgd.hpp"

namespace cohort {

class Comm;

// Copies rank 0's parameters and buffers to every rank.
void broadcast_module(Comm& comm, torch::nn::Module& module);

// Sums gradients over ranks with one flat all-reduce after backward. The
// reference GradSync is tested against; missing gradients count as zeros.
void all_reduce_gradients(Comm& comm, torch::nn::Module& module);

// dist.shard = gradients: takes each bucket's gradients, summed over the
// ranks, and keeps its own range of them (the sharded optimizer). `flat`
// holds the bucket's parameters (indices into the trainable parameters, in
// registration order) end to end, in `params`' order; it is freed after.
class GradShardSink {
 public:
  virtual ~GradShardSink() = default;
  virtual void add_reduced(const std::vector<size_t>& params, const torch::Tensor& flat) = 0;
};

struct GradSyncOptions {
  int64_t bucket_cap_bytes = 25 << 20;   // dist.bucket-cap-mb
  int64_t first_bucket_bytes = 1 << 20;  // small, so communication starts early
  Compression compression = Compression::kNone;  // dtype on the wire, or powersgd
  int64_t powersgd_rank = 4;
  uint64_t seed = 0;  // powersgd: draws the first Qs (train.seed), the same on every rank
  GradShardSink* sink = nullptr;  // dist.shard = gradients: no whole-model gradient buffers
};

// dist.bucket-cap-mb, dist.grad-compression and dist.powersgd-rank.
GradSyncOptions grad_sync_options(const DistOptions& dist, uint64_t seed);

// A bucketed gradient reducer that overlaps communication with backward.
//
// Each bucket is one flat buffer and every parameter's .grad is a view into
// it, so backward accumulates straight into the wire buffer: no copy before
// the all-reduce and none after (unless compressed). Parameters are grouped
// into buckets in reverse registration order (roughly
// the order backward produces their gradients); the first bucket is capped at
// first_bucket_bytes, the rest at bucket_cap_bytes. A post hook on each
// parameter's gradient accumulator marks it ready; when every parameter of a
// bucket is ready the bucket's async all-reduce starts, while backward goes on.
//
// Cross-rank contract: buckets are identical on every rank (same module, same
// options) and are launched strictly in bucket order, whatever order their
// hooks fire in, so every rank issues the same collectives in the same order.
// A parameter that receives no gradient in a step is reduced as zeros when
// finalize() launches the buckets still pending, so it cannot hang the job.
//
// PowerSGD (sync/powersgd.hpp) needs two all-reduces in a row per
// bucket with arithmetic between them, so a ready bucket is handed to one
// worker thread that reduces the buckets strictly in order while backward
// goes on; finalize() waits for it and rethrows its error.
//
// The exact sum (Compression::kNone): micro-batches' gradients are summed
// in fp64, on this rank (prepare() folds each finished micro-batch's into an
// fp64 accumulator) and on the wire, and rounded to fp32 once. A sum of k
// fp32 values in fp64 is exact unless they span more than about 2^(29 -
// log2 k) in magnitude, and even then its error is far below fp32's
// rounding, so the result (nearly always to the bit) does not depend on
// which rank computed which micro-batch nor on the order of the sums: the
// step is the same at any world size. It costs twice fp32's traffic and an
// fp64 copy of the gradients (per bucket with several ranks, where it is
// the wire; per parameter on one rank computing several micro-batches).
// kFp32 sums in fp32 (half the traffic; the rounding then follows the
// world size).
//
// With a GradShardSink (dist.shard = gradients) there are no bucket buffers:
// backward fills each parameter's .grad as usual, and its hook copies it
// into its bucket's wire buffer (fp64 for the exact sum, else the wire
// dtype: fp32, bf16 or fp16) and frees it; the worker sums a full bucket
// (an all-reduce: c10d's Gloo reduce-scatter takes equal pieces, the ranges
// are not) and hands it to the sink, which keeps its range. Every
// micro-batch is reduced this way, and backward waits while a bucket is in
// flight, so no more than that one and the one filling are alive.
class GradSync : public GradReduction {
 public:
  GradSync(Comm& comm, torch::nn::Module& module, GradSyncOptions opts = {});
  ~GradSync() override;
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  bool sums_over_ranks() const override { return true; }
  // Before each micro-batch's backward. `sync` is true only for the last
  // micro-batch of an optimizer step: earlier ones accumulate locally and
  // issue no collective at all (the exact sum folds them into fp64, so
  // .grad holds only the micro-batches since: every step's prepare() calls
  // end with finalize(), which puts the whole sum back).
  void prepare(bool sync) override;
  // After the last backward: launches pending buckets, waits for all, and
  // writes the summed gradients back into every parameter's .grad.
  void finalize() override;

  // dist.shard = gradients: every micro-batch's prepare() starts a round of
  // sums, so every rank must run as many rounds (empty ones included).
  bool reduces_every_micro_batch() const override { return opts_.sink != nullptr && comm_size_ > 1; }
  int64_t collectives_issued() const { return collectives_; }
  // Buckets already launched this step (by hooks, during backward).
  size_t launched() const { return next_launch_; }
  // Parameter indices (registration order) of each bucket, in launch order.
  const std::vector<std::vector<size_t>>& buckets() const { return buckets_; }
  // Floats put on the wire per step, and what an exact sum would.
  int64_t wire_floats() const;
  int64_t exact_floats() const;
  // powersgd: matrices compressed, and tensors in all.
  size_t compressed_tensors() const;
  size_t tensors() const { return params_.size(); }

  // powersgd's checkpoint state: the Qs (the same on every rank) and this
  // rank's error-feedback remainders. Empty otherwise.
  NamedTensors shared_state() const;
  NamedTensors own_state() const;
  void load_state(const NamedTensors& shared, const NamedTensors& own);
  // Back to fresh Qs and no remainders (a new elastic world).
  void reset_state();

 private:
  struct Hook;
  void mark_ready(size_t param);
  void launch(size_t bucket, std::unique_lock<std::mutex>& lock);
  static constexpr size_t kSinkInFlight = 1;  // sink: buckets handed to the worker and not yet reduced
  void work();
  void drain(std::unique_lock<std::mutex>& lock);
  void take_grad(size_t param);
  torch::ScalarType sink_wire_dtype(const torch::Tensor& p) const;
  std::vector<torch::Tensor> bucket_grads(size_t bucket) const;
  // The exact sum: whether this step's gradients are folded into fp64
  // (always but where every micro-batch goes to the sink), and the fold.
  bool folds() const;
  void fold();
  void attach_grads(size_t bucket);
  bool has_folded(size_t param) const;
  void settle_folded();

  Comm& comm_;
  int comm_size_ = 1;
  GradSyncOptions opts_;
  std::vector<torch::Tensor> params_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // keep alive: tensors hold weak refs
  std::vector<uintptr_t> hook_keys_;
  std::vector<std::vector<size_t>> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<int64_t> bucket_numel_;      // elements per bucket
  std::vector<int64_t> offset_in_bucket_;  // per parameter

  std::mutex mu_;
  bool sync_ = false;
  std::vector<size_t> waiting_;      // per bucket: params not yet ready
  size_t next_launch_ = 0;
  std::vector<torch::Tensor> storage_;  // per bucket: the flat buffer the grads view
  std::vector<torch::Tensor> wire_;     // per launched bucket: what is all-reduced
  std::vector<std::function<void()>> pending_;
  int64_t collectives_ = 0;
  // The exact sum in fp64: per bucket with several ranks (the wire too),
  // per parameter on one rank; *_now_: holds this step's sum.
  std::vector<torch::Tensor> exact_;
  std::vector<bool> exact_now_;
  std::vector<torch::Tensor> folded_;
  std::vector<bool> folded_now_;
  size_t micro_in_step_ = 0;           // prepare() calls since the last finalize()

  // powersgd: a compressor per bucket and the worker that runs them in order.
  std::vector<std::unique_ptr<PowerSgdBucket>> powersgd_;
  std::vector<std::string> names_;
  std::thread worker_;
  std::condition_variable work_cv_;
  std::deque<size_t> queue_;
  size_t reduced_ = 0;  // buckets the worker finished this step
  bool stopping_ = false;
  std::exception_ptr worker_error_;
};

}  // namespace cohort
