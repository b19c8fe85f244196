#include "cohort/sync/grad_sync.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include <ATen/Parallel.h>

#include "cohort/core/error.hpp"
#include "cohort/distributed/comm.hpp"

namespace cohort {

namespace {

// The exact sum's step: `acc` (fp64) = or += `src` (fp32). On the CPU a
// plain loop: torch's mixed-dtype add_ takes its casting path, about 9x
// the time of a copy here (5.5M elements: 26 ms against 3).
void accumulate_fp64(torch::Tensor& acc, const torch::Tensor& src, bool add) {
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

}  // namespace

GradSyncOptions grad_sync_options(const DistOptions& dist, uint64_t seed) {
  GradSyncOptions o;
  o.bucket_cap_bytes = static_cast<int64_t>(dist.bucket_cap_mb * (1 << 20));
  o.compression = dist.grad_compression;
  o.powersgd_rank = dist.powersgd_rank;
  o.seed = seed;
  return o;
}

void broadcast_module(Comm& comm, torch::nn::Module& module) {
  if (comm.size() == 1) return;
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters()) {
    auto t = p.detach();
    comm.broadcast(t, 0, "initial parameter broadcast");
  }
  for (auto& b : module.buffers()) {
    auto t = b.detach();
    comm.broadcast(t, 0, "initial buffer broadcast");
  }
}

void all_reduce_gradients(Comm& comm, torch::nn::Module& module) {
  if (comm.size() == 1) return;
  std::vector<torch::Tensor> grads;
  for (auto& p : module.parameters()) {
    if (!p.requires_grad()) continue;
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    grads.push_back(p.grad());
  }
  if (grads.empty()) return;
  std::vector<torch::Tensor> parts;
  for (auto& g : grads) parts.push_back(g.reshape({-1}));
  auto flat = torch::cat(parts);
  comm.all_reduce_sum(flat, "gradient all-reduce");
  int64_t offset = 0;
  for (auto& g : grads) {
    g.copy_(flat.narrow(0, offset, g.numel()).view_as(g));
    offset += g.numel();
  }
}

struct GradSync::Hook : torch::autograd::FunctionPostHook {
  Hook(GradSync* owner, size_t param) : owner(owner), param(param) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    owner->mark_ready(param);
    return outputs;
  }
  GradSync* owner;
  size_t param;
};

GradSync::GradSync(Comm& comm, torch::nn::Module& module, GradSyncOptions opts)
    : comm_(comm), comm_size_(comm.size()), opts_(opts) {
  COHORT_CHECK(opts_.bucket_cap_bytes > 0, ConfigError, "dist.bucket-cap-mb must be > 0");
  for (auto& item : module.named_parameters()) {
    if (!item.value().requires_grad()) continue;
    params_.push_back(item.value());
    names_.push_back(item.key());
  }
  // Buckets in reverse registration order; a parameter larger than the cap
  // gets a bucket of its own.
  bucket_of_.assign(params_.size(), 0);
  int64_t filled = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    int64_t bytes = params_[k].numel() * static_cast<int64_t>(params_[k].element_size());
    bool start_new = buckets_.empty();
    if (!start_new) {
      int64_t cap = buckets_.size() == 1 ? std::min(opts_.first_bucket_bytes, opts_.bucket_cap_bytes)
                                         : opts_.bucket_cap_bytes;
      start_new = filled + bytes > cap;
    }
    if (start_new) {
      buckets_.emplace_back();
      filled = 0;
    }
    buckets_.back().push_back(k);
    bucket_of_[k] = buckets_.size() - 1;
    filled += bytes;
  }
  bucket_numel_.assign(buckets_.size(), 0);
  offset_in_bucket_.assign(params_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (size_t k : buckets_[b]) {
      offset_in_bucket_[k] = bucket_numel_[b];
      bucket_numel_[b] += params_[k].numel();
    }
  }
  if (comm_.size() == 1) return;  // nothing to reduce: no hooks, no views
  torch::NoGradGuard no_grad;
  for (const auto& bucket : opts_.sink ? std::vector<std::vector<size_t>>{} : buckets_) {
    int64_t numel = 0;
    for (size_t k : bucket) numel += params_[k].numel();
    auto flat = torch::zeros({numel}, params_[bucket.front()].options());
    int64_t offset = 0;
    for (size_t k : bucket) {
      auto& p = params_[k];
      auto view = flat.narrow(0, offset, p.numel()).view_as(p);
      if (p.grad().defined()) view.copy_(p.grad());
      p.mutable_grad() = view;
      offset += p.numel();
    }
    storage_.push_back(flat);
    // The exact sum's fp64 buffer: this rank's micro-batches folded in, then
    // the wire itself.
    if (opts_.compression == Compression::kNone) exact_.push_back(torch::zeros({numel}, flat.options().dtype(torch::kFloat64)));
  }
  exact_now_.assign(exact_.size(), false);
  for (size_t k = 0; k < params_.size(); ++k) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[k]);
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<Hook>(this, k)));
    accumulators_.push_back(std::move(acc));
  }
  if (opts_.compression == Compression::kPowerSgd) {
    for (size_t b = 0; b < buckets_.size(); ++b) {
      std::vector<std::string> names;
      for (size_t k : buckets_[b]) names.push_back(names_[k]);
      powersgd_.push_back(std::make_unique<PowerSgdBucket>(bucket_grads(b), names, opts_.powersgd_rank, opts_.seed));
    }
  }
  if (!powersgd_.empty() || opts_.sink) worker_ = std::thread([this] { work(); });
}

GradSync::~GradSync() {
  if (worker_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    work_cv_.notify_all();
    worker_.join();
  }
  for (size_t k = 0; k < accumulators_.size(); ++k) accumulators_[k]->del_post_hook(hook_keys_[k]);
}

std::vector<torch::Tensor> GradSync::bucket_grads(size_t b) const {
  std::vector<torch::Tensor> grads;
  for (size_t k : buckets_[b]) grads.push_back(params_[k].grad());
  return grads;
}

// powersgd: reduces the buckets handed over, strictly in order. After an
// error the rest of the step's buckets are only counted: finalize() throws.
void GradSync::work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    size_t b = queue_.front();
    queue_.pop_front();
    bool failed = worker_error_ != nullptr;
    auto grads = opts_.sink ? std::vector<torch::Tensor>{} : bucket_grads(b);
    torch::Tensor wire = opts_.sink ? std::move(wire_[b]) : torch::Tensor();
    lock.unlock();
    if (!failed) {
      try {
        if (opts_.sink) {
          comm_.all_reduce_sum(wire, "gradient all-reduce");
          opts_.sink->add_reduced(buckets_[b], wire);
        } else {
          powersgd_[b]->reduce(comm_, grads);
        }
      } catch (...) {
        lock.lock();
        worker_error_ = std::current_exception();
        lock.unlock();
      }
    }
    wire = torch::Tensor();  // freed before the next bucket
    lock.lock();
    ++reduced_;
    work_cv_.notify_all();
  }
}

int64_t GradSync::exact_floats() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.numel();
  return n;
}

int64_t GradSync::wire_floats() const {
  if (powersgd_.empty()) return exact_floats();
  int64_t n = 0;
  for (const auto& b : powersgd_) n += b->wire_floats();
  return n;
}

size_t GradSync::compressed_tensors() const {
  size_t n = 0;
  for (const auto& b : powersgd_) n += b->matrices();
  return n;
}

NamedTensors GradSync::shared_state() const {
  NamedTensors out;
  for (const auto& b : powersgd_) {
    for (auto& t : b->shared_state()) out.push_back(std::move(t));
  }
  return out;
}

NamedTensors GradSync::own_state() const {
  NamedTensors out;
  for (const auto& b : powersgd_) {
    for (auto& t : b->own_state()) out.push_back(std::move(t));
  }
  return out;
}

void GradSync::load_state(const NamedTensors& shared, const NamedTensors& own) {
  for (auto& b : powersgd_) {
    b->load_shared_state(shared);
    b->load_own_state(own);
  }
}

void GradSync::reset_state() {
  for (auto& b : powersgd_) b->reset();
}

bool GradSync::folds() const {
  return opts_.compression == Compression::kNone && !(opts_.sink && comm_size_ > 1);
}

// The micro-batch just computed: its gradients join the step's fp64 sum,
// and .grad starts again from zero for the next. With buckets (several
// ranks) the sum is kept per bucket, where it goes on the wire; on one rank
// per parameter. The fp64 buffers stay allocated from step to step.
void GradSync::fold() {
  torch::NoGradGuard no_grad;
  if (!exact_.empty()) {
    for (size_t b = 0; b < buckets_.size(); ++b) {
      attach_grads(b);
      accumulate_fp64(exact_[b], storage_[b], exact_now_[b]);
      exact_now_[b] = true;
      storage_[b].zero_();
    }
    return;
  }
  if (folded_.empty()) {
    folded_.resize(params_.size());
    folded_now_.assign(params_.size(), false);
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    auto& p = params_[k];
    if (!p.grad().defined()) continue;
    if (!folded_[k].defined()) folded_[k] = torch::empty_like(p, p.options().dtype(torch::kFloat64));
    accumulate_fp64(folded_[k], p.grad().contiguous(), folded_now_[k]);
    folded_now_[k] = true;
    p.mutable_grad().zero_();
  }
}

bool GradSync::has_folded(size_t param) const { return param < folded_now_.size() && folded_now_[param]; }

// One rank (nothing to reduce): the fp64 sum, rounded into .grad once.
void GradSync::settle_folded() {
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < params_.size(); ++k) {
    if (!has_folded(k)) continue;
    auto& p = params_[k];
    if (p.grad().defined()) {
      accumulate_fp64(folded_[k], p.grad().contiguous(), true);
      p.mutable_grad().copy_(folded_[k]);
    } else {
      p.mutable_grad() = folded_[k].to(p.scalar_type());
    }
  }
}

void GradSync::prepare(bool sync) {
  std::unique_lock<std::mutex> lock(mu_);
  if (folds() && micro_in_step_ > 0) fold();
  ++micro_in_step_;
  if (opts_.sink) {
    if (sync_) drain(lock);  // the previous micro-batch's buckets
    sync = true;             // every micro-batch is reduced: no whole-model gradient is kept
  }
  sync_ = sync && comm_.size() > 1;
  waiting_.assign(buckets_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) waiting_[b] = buckets_[b].size();
  next_launch_ = 0;
  wire_.assign(buckets_.size(), torch::Tensor());
  pending_.clear();
  reduced_ = 0;
  worker_error_ = nullptr;
}

void GradSync::mark_ready(size_t param) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!sync_) return;
  size_t b = bucket_of_[param];
  if (waiting_[b] == 0) return;  // already counted this step
  if (opts_.sink) take_grad(param);
  --waiting_[b];
  // Launch strictly in bucket order, so all ranks agree on the sequence.
  while (next_launch_ < buckets_.size() && waiting_[next_launch_] == 0) launch(next_launch_++, lock);
}

// Re-attaches any gradient something replaced (rather than updated in
// place) since the last step, so the bucket's buffer holds every gradient.
void GradSync::attach_grads(size_t b) {
  int64_t offset = 0;
  for (size_t k : buckets_[b]) {
    auto& p = params_[k];
    auto view = storage_[b].narrow(0, offset, p.numel()).view_as(p);
    if (!p.grad().defined()) {
      view.zero_();
      p.mutable_grad() = view;
    } else if (p.grad().data_ptr() != view.data_ptr()) {
      view.copy_(p.grad());
      p.mutable_grad() = view;
    }
    offset += p.numel();
  }
}

void GradSync::launch(size_t b, std::unique_lock<std::mutex>& lock) {
  if (opts_.sink) {  // the gradients are in the wire buffer already (mark_ready)
    // At most kSinkInFlight buckets are with the worker: when the network
    // (or a CPU shared with backward) is slower than backward, backward
    // waits here rather than keep every gradient of the model alive.
    work_cv_.wait(lock, [&] { return b < reduced_ + kSinkInFlight; });
    for (size_t k : buckets_[b]) take_grad(k);  // a gradient no hook saw: none, or set by hand
    if (!wire_[b].defined()) {
      const auto& p = params_[buckets_[b].front()];
      wire_[b] = torch::zeros({bucket_numel_[b]}, p.options().dtype(sink_wire_dtype(p)));
    }
    ++collectives_;
    queue_.push_back(b);
    work_cv_.notify_all();
    return;
  }
  attach_grads(b);
  ++collectives_;
  if (!powersgd_.empty()) {
    queue_.push_back(b);
    work_cv_.notify_all();
    return;
  }
  torch::Tensor wire = storage_[b];
  if (opts_.compression == Compression::kBf16) wire = wire.to(torch::kBFloat16);
  if (opts_.compression == Compression::kFp16) wire = wire.to(torch::kFloat16);
  if (opts_.compression == Compression::kNone) {  // the exact sum: this rank's micro-batches, then the ranks'
    accumulate_fp64(exact_[b], storage_[b], exact_now_[b]);
    wire = exact_[b];
  }
  wire_[b] = wire;
  pending_.push_back(comm_.all_reduce_sum_async(wire_[b], "gradient all-reduce"));
}

// sink: what a bucket's sums travel in: fp64 for the exact sum, else the
// configured wire dtype (the sink adds each round into its fp64 range).
torch::ScalarType GradSync::sink_wire_dtype(const torch::Tensor& p) const {
  switch (opts_.compression) {
    case Compression::kNone: return torch::kFloat64;
    case Compression::kBf16: return torch::kBFloat16;
    case Compression::kFp16: return torch::kFloat16;
    default: return p.scalar_type();
  }
}

// sink: `param`'s gradient into its bucket's wire buffer (made at the
// bucket's first gradient, zeros where none comes), and freed.
void GradSync::take_grad(size_t param) {
  auto& p = params_[param];
  if (!p.grad().defined()) return;
  torch::NoGradGuard no_grad;
  size_t b = bucket_of_[param];
  const auto dtype = sink_wire_dtype(p);
  if (buckets_[b].size() == 1) {
    wire_[b] = p.grad().reshape({-1}).to(dtype);  // a bucket of its own (the embeddings): no copy in fp32
  } else {
    if (!wire_[b].defined()) wire_[b] = torch::zeros({bucket_numel_[b]}, p.options().dtype(dtype));
    wire_[b].narrow(0, offset_in_bucket_[param], p.numel()).copy_(p.grad().reshape({-1}));
  }
  p.mutable_grad() = torch::Tensor();
}

void GradSync::finalize() {
  std::unique_lock<std::mutex> lock(mu_);
  micro_in_step_ = 0;
  if (!sync_) settle_folded();  // one rank: nothing goes on the wire
  // The next step starts its sums afresh, even when this one fails.
  struct Fresh {
    GradSync& s;
    ~Fresh() {
      s.folded_now_.assign(s.folded_now_.size(), false);
      s.exact_now_.assign(s.exact_now_.size(), false);
    }
  } fresh{*this};
  drain(lock);
}

void GradSync::drain(std::unique_lock<std::mutex>& lock) {
  if (!sync_) return;
  while (next_launch_ < buckets_.size()) {
    waiting_[next_launch_] = 0;
    launch(next_launch_++, lock);
  }
  sync_ = false;
  if (!powersgd_.empty() || opts_.sink) {
    work_cv_.wait(lock, [this] { return reduced_ == buckets_.size(); });
    if (worker_error_) std::rethrow_exception(worker_error_);
    return;  // reduced in place, in the grads (or handed to the sink)
  }
  auto pending = std::move(pending_);
  pending_.clear();
  lock.unlock();
  for (auto& wait : pending) wait();
  if (opts_.compression == Compression::kFp32) return;  // reduced in place, in the grads
  for (size_t b = 0; b < buckets_.size(); ++b) storage_[b].copy_(wire_[b]);  // rounded once
}

}  // namespace cohort
