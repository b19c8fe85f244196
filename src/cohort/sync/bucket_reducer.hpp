// defines: GradShardSink, BucketReducer, BucketReducerOptions, make_bucket_reducer
//
// How a bucket's gradients are summed over the ranks, as c10d's comm hooks
// are (AllReduceCommHook, FP16CompressCommHook, PowerSGD's hook over a
// GradBucket): GradSync buckets, orders and overlaps with backward, and
// calls one reducer that owns its buffers and state. The reducers
// (bucket_reducer.cpp): the exact sum in fp64; a sum at a wire dtype
// (fp32, bf16, fp16); PowerSGD's rank-r products, flat or between islands
// (the exact sum inside each); reduce to owner, which
// hands each bucket's sum to a sink that keeps its range (dist.shard =
// gradients); and on one rank, the micro-batches' exact sum alone.
//
// Cross-rank contract: every rank builds the same reducer from the same
// buckets and options, and GradSync calls launch() in bucket order.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cohort/config/choice.hpp"

namespace cohort {

class Comm;
class GradBuckets;
// Named tensors, as ckpt/safetensors.hpp declares them (a layer above).
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// dist.shard = gradients: takes each bucket's gradients, summed over the
// ranks, and keeps its own range of them (the sharded optimizer). `flat`
// holds the bucket's parameters (indices into the trainable parameters, in
// registration order) end to end, in `params`' order; it is freed after.
class GradShardSink {
 public:
  virtual ~GradShardSink() = default;
  virtual void add_reduced(const std::vector<size_t>& params, const torch::Tensor& flat) = 0;
};

class BucketReducer {
 public:
  virtual ~BucketReducer() = default;

  // True: backward accumulates each bucket's gradients in its flat buffer
  // (GradBuckets::make_views). False: take() is handed each gradient as
  // backward makes it, and no whole-model gradient is kept.
  virtual bool views() const { return true; }
  // Every micro-batch's gradients are summed over the ranks (and handed on),
  // not only the step's total.
  virtual bool every_micro_batch() const { return false; }
  // A micro-batch is done and another of the same step follows.
  virtual void fold() {}
  // `param`'s gradient is ready (a reducer without views takes it).
  virtual void take(size_t /*param*/) {}
  // Starts summing bucket `b`, whose gradients are all ready.
  virtual void launch(size_t b) = 0;
  // After the step's (or, every_micro_batch, the micro-batch's) last
  // launch, or none on one rank: waits for the sums, puts them in place,
  // and rethrows a failed one's error. The next step starts afresh either way.
  virtual void finish() = 0;

  // Floats put on the wire per step (an exact sum: every gradient's), and
  // the matrices sent as low-rank products.
  virtual int64_t wire_floats() const = 0;
  virtual size_t compressed_tensors() const { return 0; }
  // State that outlives a step: `shared` is the same on every rank, `own`
  // this rank's. load_state restores what the names match; reset_state is
  // the first step's (a new elastic world).
  virtual NamedTensors shared_state() const { return {}; }
  virtual NamedTensors own_state() const { return {}; }
  virtual void load_state(const NamedTensors& /*shared*/, const NamedTensors& /*own*/) {}
  virtual void reset_state() {}
};

struct BucketReducerOptions {
  Compression compression = Compression::kNone;  // dtype on the wire, or powersgd
  int64_t powersgd_rank = 4;
  uint64_t seed = 0;              // powersgd: draws the first Qs, the same on every rank
  GradShardSink* sink = nullptr;  // dist.shard = gradients
  // PowerSGD between islands (dist.islands with dist.sync = step): this
  // rank's island (`inside`), the same island rank in every island
  // (`across`), and the smallest island's ranks (`width`). Null: flat.
  Comm* inside = nullptr;
  Comm* across = nullptr;
  int width = 1;
};

// The reducer for `options` over `buckets` (views not yet made).
std::unique_ptr<BucketReducer> make_bucket_reducer(Comm& comm, GradBuckets& buckets,
                                                   const BucketReducerOptions& options);

}  // namespace cohort
