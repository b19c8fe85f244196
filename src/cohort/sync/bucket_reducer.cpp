#include "cohort/sync/bucket_reducer.hpp"

#include <torch/torch.h>

#include <ATen/Parallel.h>

#include <functional>

#include "cohort/core/error.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/sync/grad_buckets.hpp"
#include "cohort/sync/in_order_worker.hpp"
#include "cohort/sync/powersgd.hpp"

namespace cohort {

namespace {

// The exact sum's step: `acc` (fp64) = or += `src` (fp32). On the CPU a
// plain loop: torch's mixed-dtype add_ takes its casting path, about 9x
// the time of a copy here (5.5M elements: 26 ms against 3).
void accumulate_fp64(const torch::Tensor& acc, const torch::Tensor& src, bool add) {
  torch::NoGradGuard no_grad;
  if (!acc.is_cpu() || src.scalar_type() != torch::kFloat32 || acc.scalar_type() != torch::kFloat64 ||
      !acc.is_contiguous() || !src.is_contiguous()) {
    if (add) acc.add_(src.reshape(acc.sizes()));
    else acc.copy_(src.reshape(acc.sizes()));
    return;
  }
  double* a = acc.data_ptr<double>();
  const float* x = src.data_ptr<float>();
  at::parallel_for(0, acc.numel(), int64_t{1} << 16, [&](int64_t begin, int64_t end) {
    if (add) {
      for (int64_t i = begin; i < end; ++i) a[i] += static_cast<double>(x[i]);
    } else {
      for (int64_t i = begin; i < end; ++i) a[i] = static_cast<double>(x[i]);
    }
  });
}

// What a sum travels in: fp64 for the exact sum, else the wire dtype.
torch::ScalarType wire_dtype(Compression c, torch::ScalarType param) {
  switch (c) {
    case Compression::kNone: return torch::kFloat64;
    case Compression::kBf16: return torch::kBFloat16;
    case Compression::kFp16: return torch::kFloat16;
    default: return param;
  }
}

// Waits for the async sums launched this step, in launch order, then hands
// each launched bucket to `done`; forgets them either way.
class Launched {
 public:
  void add(size_t b, std::function<void()> wait) {
    buckets_.push_back(b);
    waits_.push_back(std::move(wait));
  }
  template <class Done>
  void finish(Done done) {
    auto buckets = std::move(buckets_);
    auto waits = std::move(waits_);
    buckets_.clear();
    waits_.clear();
    for (auto& wait : waits) wait();
    for (size_t b : buckets) done(b);
  }

 private:
  std::vector<size_t> buckets_;
  std::vector<std::function<void()>> waits_;
};

// One rank, with another dtype than the exact sum's: nothing to sum.
class Unreduced : public BucketReducer {
 public:
  explicit Unreduced(const GradBuckets& buckets) : buckets_(buckets) {}
  void launch(size_t) override {}  // never: one rank launches nothing
  void finish() override {}
  int64_t wire_floats() const override { return buckets_.total_numel(); }

 protected:
  const GradBuckets& buckets_;
};

// One rank computing several micro-batches: their gradients summed in fp64
// per parameter, as the ranks' would be, and rounded into .grad once, so
// the step is the one any world size computes.
class MicroBatchSum : public Unreduced {
 public:
  explicit MicroBatchSum(const GradBuckets& buckets)
      : Unreduced(buckets), sum_(buckets.param_count()), now_(buckets.param_count(), false) {}

  void fold() override {
    torch::NoGradGuard no_grad;
    for (size_t k = 0; k < sum_.size(); ++k) {
      const auto& p = buckets_.param(k);
      if (!p.grad().defined()) continue;
      if (!sum_[k].defined()) sum_[k] = torch::empty_like(p, p.options().dtype(torch::kFloat64));
      accumulate_fp64(sum_[k], p.grad().contiguous(), now_[k]);
      now_[k] = true;
      p.mutable_grad().zero_();
    }
  }

  void finish() override {
    torch::NoGradGuard no_grad;
    for (size_t k = 0; k < sum_.size(); ++k) {
      if (!now_[k]) continue;
      now_[k] = false;
      const auto& p = buckets_.param(k);
      if (p.grad().defined()) {
        accumulate_fp64(sum_[k], p.grad().contiguous(), true);
        p.mutable_grad().copy_(sum_[k]);
      } else {
        p.mutable_grad() = sum_[k].to(p.scalar_type());
      }
    }
  }

 private:
  std::vector<torch::Tensor> sum_;  // fp64, kept allocated from step to step
  std::vector<bool> now_;           // holds this step's sum
};

// The exact sum over ranks and micro-batches: each finished micro-batch is
// folded into the bucket's fp64 buffer, which is then the wire; the sum is
// rounded into the gradients once. Twice fp32's traffic.
class ExactSum : public BucketReducer {
 public:
  ExactSum(Comm& comm, const GradBuckets& buckets) : comm_(comm), buckets_(buckets), now_(buckets.size(), false) {
    for (size_t b = 0; b < buckets.size(); ++b) {
      const auto& p = buckets.param(buckets.params(b).front());
      sum_.push_back(torch::zeros({buckets.numel(b)}, p.options().dtype(torch::kFloat64)));
    }
  }

  void fold() override {
    for (size_t b = 0; b < buckets_.size(); ++b) {
      add(b);
      torch::NoGradGuard no_grad;
      buckets_.flat(b).zero_();
    }
  }

  void launch(size_t b) override {
    add(b);
    launched_.add(b, comm_.all_reduce_sum_async(sum_[b], "gradient all-reduce"));
  }

  void finish() override {
    struct Fresh {  // the next step starts its sums afresh, even when this one fails
      std::vector<bool>& now;
      ~Fresh() { now.assign(now.size(), false); }
    } fresh{now_};
    launched_.finish([&](size_t b) {
      torch::NoGradGuard no_grad;
      buckets_.flat(b).copy_(sum_[b]);  // rounded once
    });
  }

  int64_t wire_floats() const override { return buckets_.total_numel(); }

 private:
  void add(size_t b) {
    accumulate_fp64(sum_[b], buckets_.flat(b), now_[b]);
    now_[b] = true;
  }

  Comm& comm_;
  const GradBuckets& buckets_;
  std::vector<torch::Tensor> sum_;  // per bucket, fp64: this rank's micro-batches, then the ranks'
  std::vector<bool> now_;
  Launched launched_;
};

// A sum in the wire dtype (fp32: in place in the bucket; bf16, fp16: a cast
// copy, rounded back into the bucket).
class WireSum : public BucketReducer {
 public:
  WireSum(Comm& comm, const GradBuckets& buckets, Compression c)
      : comm_(comm), buckets_(buckets), compression_(c), wire_(buckets.size()) {}

  void launch(size_t b) override {
    const auto& flat = buckets_.flat(b);
    wire_[b] = flat.to(wire_dtype(compression_, flat.scalar_type()));
    launched_.add(b, comm_.all_reduce_sum_async(wire_[b], "gradient all-reduce"));
  }

  void finish() override {
    launched_.finish([&](size_t b) {
      torch::NoGradGuard no_grad;
      if (!wire_[b].is_same(buckets_.flat(b))) buckets_.flat(b).copy_(wire_[b]);
      wire_[b] = torch::Tensor();
    });
  }

  int64_t wire_floats() const override { return buckets_.total_numel(); }

 private:
  Comm& comm_;
  const GradBuckets& buckets_;
  Compression compression_;
  std::vector<torch::Tensor> wire_;
  Launched launched_;
};

// PowerSGD's compressors, one per bucket, and their state: what both
// PowerSGD reducers keep.
class PowerSgdReducer : public BucketReducer {
 public:
  PowerSgdReducer(const GradBuckets& buckets, int64_t rank, uint64_t seed) {
    for (size_t b = 0; b < buckets.size(); ++b) {
      std::vector<std::string> names;
      for (size_t k : buckets.params(b)) names.push_back(buckets.name(k));
      compressors_.push_back(std::make_unique<PowerSgdBucket>(buckets.params_of(b), names, rank, seed));
    }
  }

  int64_t wire_floats() const override {
    int64_t n = 0;
    for (const auto& c : compressors_) n += c->wire_floats();
    return n;
  }
  size_t compressed_tensors() const override {
    size_t n = 0;
    for (const auto& c : compressors_) n += c->matrices();
    return n;
  }
  NamedTensors shared_state() const override {
    NamedTensors out;
    for (const auto& c : compressors_) {
      for (auto& t : c->shared_state()) out.push_back(std::move(t));
    }
    return out;
  }
  NamedTensors own_state() const override {
    NamedTensors out;
    for (const auto& c : compressors_) {
      for (auto& t : c->own_state()) out.push_back(std::move(t));
    }
    return out;
  }
  void load_state(const NamedTensors& shared, const NamedTensors& own) override {
    for (auto& c : compressors_) {
      c->load_shared_state(shared);
      c->load_own_state(own);
    }
  }
  void reset_state() override {
    for (auto& c : compressors_) c->reset();
  }

 protected:
  std::vector<std::unique_ptr<PowerSgdBucket>> compressors_;
};

// PowerSGD: a compressor per bucket, run on the worker in bucket order
// (two all-reduces per bucket with arithmetic between them), in place in
// the gradients.
class PowerSgdSum : public PowerSgdReducer {
 public:
  PowerSgdSum(Comm& comm, const GradBuckets& buckets, int64_t rank, uint64_t seed)
      : PowerSgdReducer(buckets, rank, seed), comm_(comm), buckets_(buckets) {}

  void launch(size_t b) override {
    worker_.push([this, b, grads = buckets_.grads(b)] { compressors_[b]->reduce(comm_, grads); });
  }
  void finish() override { worker_.finish(); }

 private:
  Comm& comm_;
  const GradBuckets& buckets_;
  InOrderWorker worker_;  // stopped before the compressors (the base's) go
};

// PowerSGD on a hierarchical all-reduce (dist.islands with dist.sync =
// step): each island sums its gradients exactly over its fast links, as
// backward goes; then island rank i compresses the buckets b with b mod
// width = i between the islands (PowerSGD's products over `across`: one
// compressed gradient per island per step, its buckets spread over the
// island's links), and broadcasts them, with their Qs, inside the island.
// So every rank applies the same gradient and holds the same Qs; a bucket's
// error-feedback remainder is its compressing rank's.
class IslandPowerSgd : public PowerSgdReducer {
 public:
  IslandPowerSgd(Comm& inside, Comm& across, int width, const GradBuckets& buckets, int64_t rank, uint64_t seed)
      : PowerSgdReducer(buckets, rank, seed), inside_(inside), across_(across), width_(width), buckets_(buckets) {
    if (inside.size() > 1) inner_ = std::make_unique<ExactSum>(inside, buckets);
    else inner_ = std::make_unique<MicroBatchSum>(buckets);
  }

  void fold() override { inner_->fold(); }
  void launch(size_t b) override { inner_->launch(b); }

  void finish() override {
    inner_->finish();  // the island's exact sums, in the buckets
    torch::NoGradGuard no_grad;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      if (owner(b) == inside_.rank()) compressors_[b]->reduce(across_, buckets_.grads(b));
    }
    for (size_t b = 0; b < buckets_.size(); ++b) {
      torch::Tensor flat = buckets_.flat(b);
      inside_.broadcast(flat, owner(b), "island gradient broadcast");
      for (auto& [name, q] : compressors_[b]->shared_state()) inside_.broadcast(q, owner(b), "island powersgd Q");
    }
  }
  // wire_floats(): per island, its ranks together put one compressed
  // gradient between islands.

 private:
  int owner(size_t b) const { return static_cast<int>(b % static_cast<size_t>(width_)); }

  Comm& inside_;
  Comm& across_;
  int width_;
  const GradBuckets& buckets_;
  std::unique_ptr<BucketReducer> inner_;
};

// Reduce to owner (dist.shard = gradients): no bucket buffers. Each
// gradient is copied into its bucket's wire buffer as backward makes it
// (fp64 for the exact sum, else the wire dtype) and freed; the worker sums
// a full bucket (an all-reduce: c10d's Gloo reduce-scatter takes equal
// pieces, the ranges are not) and hands it to the sink, which keeps its
// range. Every micro-batch is reduced, and backward waits while a bucket is
// in flight, so no more than that one and the one filling are alive.
class ReduceToOwner : public BucketReducer {
 public:
  ReduceToOwner(Comm& comm, const GradBuckets& buckets, Compression c, GradShardSink& sink)
      : comm_(comm), buckets_(buckets), compression_(c), sink_(sink), wire_(buckets.size()) {}

  bool views() const override { return false; }
  bool every_micro_batch() const override { return true; }

  // Into the bucket's wire buffer (made at its first gradient, zeros where
  // none comes), and freed.
  void take(size_t param) override {
    const auto& p = buckets_.param(param);
    if (!p.grad().defined()) return;
    torch::NoGradGuard no_grad;
    size_t b = buckets_.bucket_of(param);
    const auto dtype = wire_dtype(compression_, p.scalar_type());
    if (buckets_.params(b).size() == 1) {
      wire_[b] = p.grad().reshape({-1}).to(dtype);  // a bucket of its own (the embeddings): no copy in fp32
    } else {
      if (!wire_[b].defined()) wire_[b] = torch::zeros({buckets_.numel(b)}, p.options().dtype(dtype));
      wire_[b].narrow(0, buckets_.offset(param), p.numel()).copy_(p.grad().reshape({-1}));
    }
    p.mutable_grad() = torch::Tensor();
  }

  void launch(size_t b) override {
    // At most kInFlight buckets are with the worker: when the network (or
    // a CPU shared with backward) is slower than backward, backward waits
    // here rather than keep every gradient of the model alive.
    worker_.wait_unfinished_at_most(kInFlight - 1);
    for (size_t k : buckets_.params(b)) take(k);  // a gradient no hook saw: none, or set by hand
    auto wire = std::move(wire_[b]);
    wire_[b] = torch::Tensor();
    if (!wire.defined()) {
      const auto& p = buckets_.param(buckets_.params(b).front());
      wire = torch::zeros({buckets_.numel(b)}, p.options().dtype(wire_dtype(compression_, p.scalar_type())));
    }
    worker_.push([this, b, wire]() mutable {
      comm_.all_reduce_sum(wire, "gradient all-reduce");
      sink_.add_reduced(buckets_.params(b), wire);
    });
  }

  void finish() override {
    struct Fresh {  // gradients taken for a bucket never launched do not reach the next round
      std::vector<torch::Tensor>& wire;
      ~Fresh() { wire.assign(wire.size(), torch::Tensor()); }
    } fresh{wire_};
    worker_.finish();
  }

  int64_t wire_floats() const override { return buckets_.total_numel(); }

 private:
  static constexpr size_t kInFlight = 1;
  Comm& comm_;
  const GradBuckets& buckets_;
  Compression compression_;
  GradShardSink& sink_;
  std::vector<torch::Tensor> wire_;  // per bucket: filling, until launched
  InOrderWorker worker_;
};

}  // namespace

std::unique_ptr<BucketReducer> make_bucket_reducer(Comm& comm, GradBuckets& buckets,
                                                   const BucketReducerOptions& o) {
  if (comm.size() == 1) {
    if (o.compression == Compression::kNone) return std::make_unique<MicroBatchSum>(buckets);
    return std::make_unique<Unreduced>(buckets);
  }
  if (o.sink) {
    COHORT_CHECK(o.compression != Compression::kPowerSgd, ConfigError,
                 "dist.shard = gradients cannot take PowerSGD: its products need each rank's whole gradient");
    return std::make_unique<ReduceToOwner>(comm, buckets, o.compression, *o.sink);
  }
  COHORT_CHECK(!integer_wire(o.compression), ConfigError, "dist.grad-compression ", name_of(o.compression),
               " quantizes the outer sync's change only (dist.sync = local)");
  if (o.inside && o.compression == Compression::kPowerSgd) {
    return std::make_unique<IslandPowerSgd>(*o.inside, *o.across, o.width, buckets, o.powersgd_rank, o.seed);
  }
  switch (o.compression) {
    case Compression::kNone: return std::make_unique<ExactSum>(comm, buckets);
    case Compression::kPowerSgd: return std::make_unique<PowerSgdSum>(comm, buckets, o.powersgd_rank, o.seed);
    default: return std::make_unique<WireSum>(comm, buckets, o.compression);
  }
}

}  // namespace cohort
