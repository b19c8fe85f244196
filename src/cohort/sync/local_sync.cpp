#include "cohort/sync/local_sync.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <map>

#include "cohort/core/error.hpp"
#include "cohort/core/format.hpp"
#include "cohort/distributed/comm.hpp"

namespace cohort {

namespace {

constexpr char kMomentum[] = "local.momentum";
constexpr char kParams[] = "local.params";
constexpr char kSamples[] = "local.window-samples";  // one per fragment
constexpr char kIsland[] = "local.island";
constexpr char kInFlight[] = "local.in-flight";                   // fragment, due step, delayed
constexpr char kInFlightSent[] = "local.in-flight.sent";          // this rank's weighted slice
constexpr char kInFlightSamples[] = "local.in-flight.samples";    // this rank's, its island's
constexpr char kRemainder[] = "local.error-feedback";              // what rounding left out, per value

// An integer wire: each block of `block` values as signed integers of
// `bits` bits in [-levels, levels], with an fp32 scale (the block's largest
// magnitude / levels) in front of the payload. int8 is one byte a value;
// int4 two a byte (the first in the low nibble, offset by 8), in smaller
// blocks, since 15 levels per block leave a block's small values at zero
// beside one large one (error feedback then carries them to the next sync).
struct IntegerWire {
  int bits;
  int levels;
  int64_t block;

  int64_t blocks(int64_t n) const { return (n + block - 1) / block; }
  int64_t payload(int64_t n) const { return (n * bits + 7) / 8; }
  int64_t bytes(int64_t n) const { return blocks(n) * 4 + payload(n); }

  // x (fp32, n values) as [scales as bytes][payload], uint8.
  torch::Tensor pack(const torch::Tensor& x) const {
    const int64_t n = x.numel(), b = blocks(n);
    torch::Tensor padded = torch::zeros({b * block}, x.options());
    padded.narrow(0, 0, n).copy_(x);
    torch::Tensor rows = padded.view({b, block});
    torch::Tensor scale = std::get<0>(rows.abs().max(1)).div_(levels);
    scale.masked_fill_(scale == 0, 1.0f);
    torch::Tensor q = rows.div(scale.unsqueeze(1)).round_().clamp_(-levels, levels).reshape({-1}).narrow(0, 0, n);
    torch::Tensor out;
    if (bits == 8) {
      out = q.to(torch::kInt8).view(torch::kUInt8);
    } else {  // two nibbles a byte
      torch::Tensor nib = torch::zeros({payload(n) * 2}, torch::kUInt8);
      nib.narrow(0, 0, n).copy_(q.add(8).to(torch::kUInt8));
      torch::Tensor pairs = nib.view({-1, 2});
      out = pairs.select(1, 0).bitwise_or(pairs.select(1, 1).bitwise_left_shift(4));
    }
    return torch::cat({scale.contiguous().view(torch::kUInt8), out});
  }

  // The n fp32 values pack() put into `bytes`.
  torch::Tensor unpack(const torch::Tensor& bytes, int64_t n) const {
    const int64_t b = blocks(n);
    torch::Tensor scale = bytes.narrow(0, 0, b * 4).contiguous().view(torch::kFloat32);
    torch::Tensor body = bytes.narrow(0, b * 4, payload(n)).contiguous();
    torch::Tensor q;
    if (bits == 8) {
      q = body.view(torch::kInt8).to(torch::kFloat32);
    } else {
      torch::Tensor nib = torch::stack({body.bitwise_and(15), body.bitwise_right_shift(4)}, 1).reshape({-1});
      q = nib.narrow(0, 0, n).to(torch::kFloat32).sub_(8);
    }
    torch::Tensor padded = torch::zeros({b * block});
    padded.narrow(0, 0, n).copy_(q);
    return padded.view({b, block}).mul_(scale.unsqueeze(1)).reshape({-1}).narrow(0, 0, n);
  }
};

constexpr IntegerWire kInt8Wire{8, 127, 4096};
constexpr IntegerWire kInt4Wire{4, 7, 128};

const IntegerWire& integer_wire_of(Compression wire) { return wire == Compression::kInt4 ? kInt4Wire : kInt8Wire; }

torch::Tensor find(const NamedTensors& tensors, const std::string& name) {
  for (const auto& [n, t] : tensors) {
    if (n == name) return t;
  }
  return torch::Tensor();
}

}  // namespace

int island_width(const std::vector<int>& island_of) {
  std::map<int, int> sizes;
  for (int i : island_of) ++sizes[i];
  int width = sizes.empty() ? 1 : sizes.begin()->second;
  for (const auto& [island, size] : sizes) width = std::min(width, size);
  return width;
}

LocalSync::LocalSync(Comm& inside, Comm& across, torch::nn::Module& module, LocalSyncOptions opts)
    : inside_(inside), across_(across), opts_(opts) {
  COHORT_CHECK(opts_.every >= 1, ConfigError, "dist.local-steps must be >= 1, got ", opts_.every);
  COHORT_CHECK(opts_.fragments >= 1 && opts_.every % opts_.fragments == 0, ConfigError, "dist.outer-fragments ",
               opts_.fragments, " must divide dist.local-steps ", opts_.every);
  COHORT_CHECK(opts_.delay >= 0 && opts_.delay < opts_.every / opts_.fragments, ConfigError, "dist.outer-delay ",
               opts_.delay, " must be below dist.local-steps / dist.outer-fragments = ",
               opts_.every / opts_.fragments, " (one fragment in flight at a time)");
  for (auto& p : module.parameters()) {
    if (p.requires_grad()) params_.push_back(p);
  }
  for (auto& b : module.buffers()) {
    if (b.is_floating_point()) params_.push_back(b);
  }
  anchor_ = flat_params();
  momentum_ = torch::zeros_like(anchor_);
  samples_.assign(static_cast<size_t>(opts_.fragments), 0.0);
  const int global = inside_.global_ranks().at(static_cast<size_t>(inside_.rank()));
  island_ = opts_.island_of.empty() ? across_.rank() : opts_.island_of.at(static_cast<size_t>(global));
  width_ = opts_.island_of.empty() ? inside_.size() : island_width(opts_.island_of);
  if (opts_.error_feedback) {  // this rank's slices only, end to end
    int64_t kept = 0;
    for (int64_t f = 0; f < opts_.fragments; ++f) {
      kept_at_.push_back(kept);
      kept += slice(fragment(f)).size();
    }
    remainder_ = torch::zeros({kept}, anchor_.options());
  }
}

torch::Tensor LocalSync::kept(int64_t f) const {
  return remainder_.narrow(0, kept_at_.at(static_cast<size_t>(f)), slice(fragment(f)).size());
}

int LocalSync::world_size() const {
  return opts_.island_of.empty() ? inside_.size() * across_.size() : static_cast<int>(opts_.island_of.size());
}

int LocalSync::islands() const {
  return opts_.island_of.empty() ? across_.size()
                                 : *std::max_element(opts_.island_of.begin(), opts_.island_of.end()) + 1;
}

torch::Tensor LocalSync::flat_params() const {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> parts;
  for (const auto& p : params_) parts.push_back(p.detach().reshape({-1}).to(torch::kFloat32));
  return parts.empty() ? torch::zeros({0}) : torch::cat(parts);
}

void LocalSync::set_params(const torch::Tensor& flat) {
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (auto& p : params_) {
    p.detach().copy_(flat.narrow(0, offset, p.numel()).view_as(p));
    offset += p.numel();
  }
}

LocalSync::Range LocalSync::fragment(int64_t f) const {
  const int64_t n = anchor_.numel(), per = (n + opts_.fragments - 1) / opts_.fragments;
  const int64_t lo = std::min(n, per * f);
  return {lo, std::min(n, lo + per)};
}

LocalSync::Range LocalSync::slice(const Range& r) const {
  if (inside_.rank() >= width_) return {r.hi, r.hi};  // beyond the smallest island: sends nothing
  const int64_t k = width_, per = (r.size() + k - 1) / k;
  const int64_t lo = r.lo + std::min(r.size(), per * inside_.rank());
  return {lo, std::min(r.hi, lo + per)};
}

int64_t LocalSync::wire_bytes() const {
  int64_t bytes = 0;
  for (int64_t f = 0; f < opts_.fragments; ++f) {
    const int64_t n = slice(fragment(f)).size();
    switch (opts_.wire) {
      case Compression::kInt8:
      case Compression::kInt4: bytes += integer_wire_of(opts_.wire).bytes(n); break;
      case Compression::kBf16:
      case Compression::kFp16: bytes += 2 * n; break;
      default: bytes += 4 * n;
    }
  }
  return bytes;
}

bool LocalSync::window_open() const {
  return in_flight_ || std::any_of(samples_.begin(), samples_.end(), [](double s) { return s > 0; });
}

// anchor -= lr * (change + momentum * buf), buf = momentum * buf + change
// (torch.optim.SGD's Nesterov form), on every rank alike, over range `r`.
void LocalSync::outer_step(const Range& r, const torch::Tensor& mean_change) {
  torch::Tensor buf = momentum_.narrow(0, r.lo, r.size()), anchor = anchor_.narrow(0, r.lo, r.size());
  buf.mul_(opts_.outer_momentum).add_(mean_change);
  anchor.sub_(mean_change.add(buf, opts_.outer_momentum), opts_.outer_lr);
}

void LocalSync::launch(InFlight& flight) {
  flight.count = torch::tensor({flight.island_samples}, torch::kFloat64);
  flight.wait_count = across_.all_reduce_sum_async(flight.count, "local sync sample count");
  const int64_t n = slice(fragment(flight.fragment)).size();
  const auto device = anchor_.device();
  if (n == 0) {
    flight.sum = [] { return torch::zeros({0}); };
  } else if (integer_wire(opts_.wire)) {
    // A sum in int8 or int4 would wrap: every island's bytes are gathered and
    // added in fp32, in island order, the same on every rank.
    auto gathered = across_.all_gather_async(flight.sent, "local sync integer gather");
    const IntegerWire& wire = integer_wire_of(opts_.wire);
    flight.sum = [gathered, n, device, &wire] {
      torch::Tensor sum = torch::zeros({n});
      for (const auto& part : gathered()) sum.add_(wire.unpack(part, n));
      return sum.to(device);
    };
  } else {
    torch::Tensor sum = flight.sent.clone();
    auto wait = across_.all_reduce_sum_async(sum, "local sync all-reduce");
    flight.sum = [wait, sum] {
      wait();
      return sum.to(torch::kFloat32);
    };
  }
}

void LocalSync::start(int64_t f, int64_t due, bool delayed) {
  torch::NoGradGuard no_grad;
  auto flight = std::make_unique<InFlight>();
  flight->fragment = f;
  flight->due = due;
  flight->delayed = delayed;
  flight->rank_samples = samples_[static_cast<size_t>(f)];
  samples_[static_cast<size_t>(f)] = 0;
  // Each island's change, weighted by the samples it trained in the window
  // (its ranks hold one model; their samples are the island's), so that an
  // island dealt more (data.balance, more ranks) counts for more; divided by
  // every island's samples when the sums land.
  const double island =
      inside_.all_reduce_sum(std::vector<double>{flight->rank_samples}, "island sample count")[0];
  flight->island_samples = island;
  const Range s = slice(fragment(f));
  torch::Tensor change = anchor_.narrow(0, s.lo, s.size()) - flat_params().narrow(0, s.lo, s.size());
  if (remainder_.defined()) change.add_(kept(f));
  torch::Tensor sent = change * island;
  if (opts_.wire == Compression::kBf16) sent = sent.to(torch::kBFloat16);
  if (opts_.wire == Compression::kFp16) sent = sent.to(torch::kFloat16);
  if (integer_wire(opts_.wire)) sent = integer_wire_of(opts_.wire).pack(sent.cpu());
  flight->sent = sent.contiguous();
  if (remainder_.defined()) {  // what the wire carries, per sample, taken from what it should have
    torch::Tensor carried = integer_wire(opts_.wire)
                                ? integer_wire_of(opts_.wire).unpack(flight->sent, s.size()).to(change.device())
                                : flight->sent.to(torch::kFloat32);
    if (island > 0) change.sub_(carried.div_(island));
    kept(f).copy_(change);
  }
  launch(*flight);
  in_flight_ = std::move(flight);
}

void LocalSync::apply(InFlight& flight) {
  if (flight.applied) return;
  flight.wait_count();
  torch::Tensor piece = flight.sum();
  const double total = flight.count.item<double>();
  piece.div_(total > 0 ? total : 1.0);
  if (inside_.size() > 1) piece = torch::cat(inside_.all_gather(piece, "local sync island gather"));
  outer_step(fragment(flight.fragment), piece);
  flight.applied = true;
  flight.sum = nullptr;  // its buffers are no longer needed
  flight.sent = torch::Tensor();
}

void LocalSync::land(const Range& r, bool delayed, torch::Tensor& flat) const {
  torch::Tensor mine = flat.narrow(0, r.lo, r.size()), synced = anchor_.narrow(0, r.lo, r.size());
  if (delayed) {
    mine.mul_(opts_.mix).add_(synced, 1.0 - opts_.mix);
  } else {
    mine.copy_(synced);
  }
}

void LocalSync::finish() {
  torch::NoGradGuard no_grad;
  std::unique_ptr<InFlight> flight = std::move(in_flight_);
  apply(*flight);
  // The fragment lands: the synced values, or after a delay those mixed with
  // the local progress made while the sum travelled.
  torch::Tensor flat = flat_params();
  land(fragment(flight->fragment), flight->delayed, flat);
  set_params(flat);
}

bool LocalSync::after_step(int64_t step, int64_t samples, bool force) {
  for (double& s : samples_) s += static_cast<double>(samples);
  if (in_flight_ && (force || step >= in_flight_->due)) finish();
  if (force) {
    for (int64_t f = 0; f < opts_.fragments; ++f) {
      start(f, step, /*delayed=*/false);
      finish();
    }
    ++syncs_;
    return true;
  }
  bool all = true;
  for (int64_t f = 0; f < opts_.fragments; ++f) {
    if (step % opts_.every != offset(f)) {
      all = false;
      continue;
    }
    start(f, step + opts_.delay, opts_.delay > 0);
    if (opts_.delay == 0) finish();
  }
  if (all && opts_.delay == 0) ++syncs_;
  return all && opts_.delay == 0;
}

void LocalSync::with_synced(const std::function<void()>& fn) {
  if (stash_.defined()) return fn();  // already in
  stash_ = flat_params();
  set_params(anchor_);
  try {
    fn();
  } catch (...) {
    set_params(stash_);
    stash_ = torch::Tensor();
    throw;
  }
  set_params(stash_);
  stash_ = torch::Tensor();
}

void LocalSync::with_newest_synced(const std::function<void()>& fn) {
  if (in_flight_ && !stash_.defined()) {
    torch::NoGradGuard no_grad;
    apply(*in_flight_);  // finish() then only lands it: the same outer step, earlier
  }
  with_synced(fn);
}

void LocalSync::restart(const NamedTensors& shared) {
  const torch::Tensor momentum = find(shared, kMomentum);
  anchor_ = flat_params();
  momentum_ = torch::zeros_like(anchor_);
  if (momentum.defined()) {
    COHORT_CHECK(momentum.numel() == anchor_.numel(), Error, "local sync: the handed-over outer momentum holds ",
                 momentum.numel(), " values, the model ", anchor_.numel());
    momentum_.copy_(momentum.reshape({-1}));  // copy_ crosses devices
  }
  std::fill(samples_.begin(), samples_.end(), 0.0);
  if (remainder_.defined()) remainder_.zero_();  // each rank's, of the old world
  in_flight_.reset();  // an elastic world syncs whole, blocking: nothing travels between steps
  stash_ = torch::Tensor();
}

NamedTensors LocalSync::shared_state() const {
  NamedTensors out{{kMomentum, momentum_}};
  if (in_flight_) {
    out.emplace_back(kInFlight, torch::tensor({in_flight_->fragment, in_flight_->due,
                                               static_cast<int64_t>(in_flight_->delayed),
                                               static_cast<int64_t>(in_flight_->applied)}, torch::kInt64));
  }
  return out;
}

NamedTensors LocalSync::own_state() const {
  NamedTensors out{{kParams, stash_.defined() ? stash_ : flat_params()},
                   {kSamples, torch::tensor(samples_, torch::kFloat64)},
                   {kIsland, torch::tensor({static_cast<int64_t>(island_)}, torch::kInt64)}};
  if (remainder_.defined()) out.emplace_back(kRemainder, remainder_);
  if (in_flight_) {
    if (!in_flight_->applied) out.emplace_back(kInFlightSent, in_flight_->sent);
    out.emplace_back(kInFlightSamples,
                     torch::tensor({in_flight_->rank_samples, in_flight_->island_samples}, torch::kFloat64));
  }
  return out;
}

int LocalSync::writer_island(const NamedTensors& own, int rank) {
  const torch::Tensor t = find(own, kIsland);
  return t.defined() ? static_cast<int>(t.item<int64_t>()) : rank;
}

std::string LocalSync::load_state(const NamedTensors& shared, const std::vector<NamedTensors>& by_rank, int rank) {
  torch::NoGradGuard no_grad;
  anchor_ = flat_params();
  in_flight_.reset();
  // A checkpoint's tensors are read on the CPU: the state moves to the
  // parameters' device; the sample counts stay host numbers.
  auto check = [&](const torch::Tensor& t, const std::string& name, int64_t numel,
                   const torch::TensorOptions& to) {
    COHORT_CHECK(t.defined(), DataError, "local sync: the checkpoint lacks ", name,
                 " (was it written with dist.sync = step?)");
    COHORT_CHECK(numel < 0 || t.numel() == numel, DataError, "local sync: the checkpoint's ", name, " holds ",
                 t.numel(), " values, the model ", numel);
    return t.to(to).reshape({-1});
  };
  const auto on_device = anchor_.options();
  const auto f64 = torch::TensorOptions(torch::kFloat64);
  auto samples = [&](const NamedTensors& r) {
    torch::Tensor t = check(find(r, kSamples), kSamples, -1, f64).contiguous();
    return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  };
  momentum_ = check(find(shared, kMomentum), kMomentum, anchor_.numel(), on_device).clone();
  const torch::Tensor flying = find(shared, kInFlight);
  // Checkpoints from before early application hold 3 values: not applied.
  const bool applied = flying.defined() && flying.numel() > 3 && flying.index({3}).item<int64_t>() != 0;
  // The writer's islands (checkpoints from before islands: one per rank)
  // and fragments.
  auto same_layout = [&] {
    if (static_cast<int>(by_rank.size()) != world_size()) return false;
    for (size_t r = 0; r < by_rank.size(); ++r) {
      const int64_t theirs = writer_island(by_rank[r], static_cast<int>(r));
      const int64_t ours = opts_.island_of.empty() ? static_cast<int64_t>(r) : opts_.island_of.at(r);
      if (theirs != ours || static_cast<int64_t>(samples(by_rank[r]).size()) != opts_.fragments) return false;
    }
    return true;
  };
  if (same_layout()) {
    const auto& mine = by_rank.at(static_cast<size_t>(rank));
    set_params(check(find(mine, kParams), kParams, anchor_.numel(), on_device));
    samples_ = samples(mine);
    if (remainder_.defined()) {  // none when the writer had no error feedback
      const torch::Tensor kept = find(mine, kRemainder);
      remainder_.zero_();
      if (kept.defined() && kept.numel() == anchor_.numel() && kept.numel() != remainder_.numel()) {
        // Written whole (zeros outside the writer's slices) by earlier builds.
        const torch::Tensor whole = kept.to(on_device).reshape({-1});
        for (int64_t f = 0; f < opts_.fragments; ++f) {
          const Range s = slice(fragment(f));
          this->kept(f).copy_(whole.narrow(0, s.lo, s.size()));
        }
      } else if (kept.defined()) {
        remainder_.copy_(check(kept, kRemainder, remainder_.numel(), on_device));
      }
    }
    if (flying.defined()) {
      auto flight = std::make_unique<InFlight>();
      flight->fragment = flying.index({0}).item<int64_t>();
      flight->due = flying.index({1}).item<int64_t>();
      flight->delayed = flying.index({2}).item<int64_t>() != 0;
      const torch::Tensor counts = check(find(mine, kInFlightSamples), kInFlightSamples, 2, f64);
      flight->rank_samples = counts.index({0}).item<double>();
      flight->island_samples = counts.index({1}).item<double>();
      if (applied) {  // its outer step is in the checkpoint's model: it only lands
        flight->applied = true;
        in_flight_ = std::move(flight);
        return "";
      }
      // Send it again: every rank sends what it sent, so the sum is the same.
      const Range s = slice(fragment(flight->fragment));
      torch::Tensor sent = find(mine, kInFlightSent);
      const int64_t sent_size = integer_wire(opts_.wire) ? integer_wire_of(opts_.wire).bytes(s.size()) : s.size();
      COHORT_CHECK(sent.defined() && sent.numel() == sent_size, DataError, "local sync: the checkpoint's ",
                   kInFlightSent, " does not hold this rank's ", s.size(), " values of fragment ", flight->fragment,
                   " (was the run's dist.grad-compression another?)");
      flight->sent = integer_wire(opts_.wire)
                         ? sent.reshape({-1}).contiguous()
                         : sent.to(on_device.dtype(sent.scalar_type())).reshape({-1}).contiguous();
      launch(*flight);
      in_flight_ = std::move(flight);
    }
    return "";
  }
  // Other islands or fragments: each of the writer's fragments merges its
  // open window as a sync would have. A fragment in flight had not landed:
  // its window runs from its last sync, so its sent samples count again;
  // unless its outer step is applied already (the checkpoint's model holds
  // it), when it lands in each rank's parameters first, as at its step.
  std::vector<std::vector<double>> counts;
  for (const auto& r : by_rank) {
    counts.push_back(samples(r));
    if (flying.defined() && !applied) {
      const torch::Tensor sent = check(find(r, kInFlightSamples), kInFlightSamples, 2, f64);
      counts.back().at(static_cast<size_t>(flying.index({0}).item<int64_t>())) += sent.index({0}).item<double>();
    }
  }
  const int64_t fragments = static_cast<int64_t>(counts.at(0).size()), n = anchor_.numel();
  const int64_t per = (n + fragments - 1) / fragments;
  std::fill(samples_.begin(), samples_.end(), 0.0);
  double merged = 0;
  std::vector<torch::Tensor> params;
  for (const auto& r : by_rank) params.push_back(check(find(r, kParams), kParams, n, on_device));
  if (applied) {
    const int64_t f = flying.index({0}).item<int64_t>();
    const Range range{std::min(n, per * f), std::min(n, per * f + per)};
    for (auto& p : params) land(range, flying.index({2}).item<int64_t>() != 0, p);
  }
  for (int64_t f = 0; f < fragments; ++f) {
    const Range range{std::min(n, per * f), std::min(n, per * f + per)};
    double total = 0;
    for (const auto& c : counts) total += c.at(static_cast<size_t>(f));
    if (total == 0 || range.size() == 0) continue;  // closed at the checkpoint: nothing open
    torch::Tensor mean_change = torch::zeros({range.size()}, on_device);
    for (size_t r = 0; r < by_rank.size(); ++r) {
      mean_change.add_(anchor_.narrow(0, range.lo, range.size()) - params[r].narrow(0, range.lo, range.size()),
                       counts[r][static_cast<size_t>(f)] / total);
    }
    outer_step(range, mean_change);
    merged = std::max(merged, total);
  }
  set_params(anchor_);
  if (merged == 0) return "";
  return strf("local sync: the checkpoint's %zu rank(s) had %.0f samples in an open window; merged by one outer step "
              "before going on with %d rank(s) in %d island(s)", by_rank.size(), merged, world_size(), islands());
}

}  // namespace cohort
