#include "cohort/train/optimization/sharded_optim.hpp"

#include <ATen/ops/_fused_adamw.h>
#include <malloc.h>
#include <torch/serialize.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "cohort/core/error.hpp"
#include "cohort/core/format.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/train/lifecycle/startup.hpp"
#include "cohort/train/lifecycle/train_state.hpp"
#include "cohort/train/optimization/optim.hpp"

namespace cohort {

ShardedOptimizer::ShardedOptimizer(Comm& comm, torch::nn::Module& module, const Config& cfg)
    : torch::optim::AdamW(adamw_groups(cfg.optim, module), adamw_options(cfg.optim)),
      comm_(comm),
      mode_(cfg.dist.shard),
      kind_(cfg.optim.name),
      module_(module) {
  std::vector<int64_t> numels;
  for (auto& p : module.parameters()) {
    if (!p.requires_grad()) continue;
    params_.push_back(p);
    numels.push_back(p.numel());
  }
  COHORT_CHECK(!params_.empty(), ConfigError, "dist.shard: the model has no trainable parameters");
  layout_ = ShardLayout::make(numels, agree_shard_weights(comm, cfg.dist), static_cast<int>(cfg.dist.shard_replicas));
  group_ = layout_.group_of(comm.rank());
  starts_ = layout_.starts();
  shard_grads_ = mode_ == ShardMode::kGradients && comm.size() > 1;
  auto_weights_ = shard_weights(cfg.dist).empty();
  steps_.assign(params_.size(), 0);

  // The parameters become views into one flat buffer: a range is one
  // contiguous piece of it.
  torch::NoGradGuard no_grad;
  flat_params_ = torch::empty({layout_.total()}, params_.front().options());
  for (size_t k = 0; k < params_.size(); ++k) {
    auto& p = params_[k];
    COHORT_CHECK(p.dtype() == flat_params_.dtype() && p.device() == flat_params_.device(), ConfigError,
                 "dist.shard: every trainable parameter must share one dtype and device");
    auto view = flat_params_.narrow(0, starts_[k], p.numel());
    view.copy_(p.reshape({-1}));
    p.set_data(view.view(p.sizes()));
  }
  malloc_trim(0);  // the parameters' old pages go back to the system, not into the heap's free lists
  for (const auto& s : layout_.segments(lo(), hi())) {
    segments_.push_back({s.param, s.offset, s.length, s.at, params_[s.param].dim() >= 2});
  }
  exp_avg_ = torch::zeros({hi() - lo()}, flat_params_.options());
  exp_avg_sq_ = torch::zeros({hi() - lo()}, flat_params_.options());
  if (shard_grads_) grad_ = torch::zeros({hi() - lo()}, flat_params_.options());
}

std::string ShardedOptimizer::describe() const {
  std::vector<std::string> w;
  for (double x : layout_.weights) w.push_back(strf("%g", x));
  return "cohort: " + layout_.describe(name_of(mode_)) + "; weights " + detail::join(w, ",") +
         (auto_weights_ ? " (auto: GiB of memory per rank)" : "") +
         (comm_.is_group() ? "; in each island, over its ranks" : "");
}

torch::Tensor ShardedOptimizer::grad_of(const Segment& s) const {
  if (shard_grads_) return grad_.narrow(0, s.at, s.length);
  const auto& g = params_[s.param].grad();
  return g.defined() ? g.reshape({-1}).narrow(0, s.offset, s.length) : torch::Tensor();
}

void ShardedOptimizer::add_reduced(const std::vector<size_t>& params, const torch::Tensor& flat) {
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (size_t k : params) {
    int64_t start = starts_[k], n = params_[k].numel();
    int64_t a = std::max(start, lo()), b = std::min(start + n, hi());
    if (a < b) exact_sum().narrow(0, a - lo(), b - a).add_(flat.narrow(0, offset + (a - start), b - a));
    offset += n;
  }
}

torch::Tensor& ShardedOptimizer::exact_sum() {
  if (!grad64_.defined()) grad64_ = torch::zeros_like(grad_, grad_.options().dtype(torch::kFloat64));
  has_exact_ = true;
  return grad64_;
}

GradientSet ShardedOptimizer::gradients() {
  if (!shard_grads_) return module_gradients(module_);  // every rank holds every summed gradient
  if (has_exact_) {  // the step's sum, rounded once
    grad_.copy_(grad64_);
    grad64_.zero_();
    has_exact_ = false;
  }
  GradientSet g;
  g.device = grad_.device();
  // One piece per parameter in this rank's range, as the unsharded norm
  // takes one per parameter: the norm is then summed the same way.
  for (const auto& seg : layout_.segments(layout_.lo(group_), layout_.hi(group_))) {
    g.tensors.push_back(grad_.narrow(0, seg.at, seg.length));
  }
  const bool counts = layout_.primary(comm_.rank());  // one copy of each range in the sum
  g.pool = [this, counts](torch::Tensor& sq) {
    if (!counts) sq.zero_();
    comm_.all_reduce_sum(sq, "gradient norm");
  };
  return g;
}

void ShardedOptimizer::zero_grad_range() {
  if (shard_grads_) grad_.zero_();
  if (grad64_.defined()) grad64_.zero_();
  has_exact_ = false;
}

torch::Tensor ShardedOptimizer::step(LossClosure closure) {
  torch::Tensor loss;
  if (closure) {
    torch::AutoGradMode enable_grad(true);
    loss = closure();
  }
  torch::NoGradGuard no_grad;
  consistent_ = false;
  // A parameter's step counts when it has a gradient (GradSync gives every
  // one a gradient on more than one rank), so the counts agree everywhere.
  for (size_t k = 0; k < params_.size(); ++k) {
    if (shard_grads_ || params_[k].grad().defined()) ++steps_[k];
  }
  if (kind_ == OptimizerKind::kLamb) lamb_step();
  else adamw_step();
  share_params();
  consistent_ = true;
  return loss;
}

// The fused kernel of FusedAdamW over the range's pieces of each group.
void ShardedOptimizer::adamw_step() {
  for (int g = 0; g < 2; ++g) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(param_groups_.at(g).options());
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
    std::map<int64_t, torch::Tensor> step_tensors;
    for (const auto& s : segments_) {
      if (s.decay != (g == 0)) continue;
      torch::Tensor grad = grad_of(s);
      if (!grad.defined()) continue;
      params.push_back(param_of(s));
      grads.push_back(grad);
      exp_avgs.push_back(exp_avg_.narrow(0, s.at, s.length));
      exp_avg_sqs.push_back(exp_avg_sq_.narrow(0, s.at, s.length));
      auto& step = step_tensors[steps_[s.param]];
      if (!step.defined()) step = torch::full({}, static_cast<double>(steps_[s.param]), flat_params_.options());
      steps.push_back(step);
    }
    if (params.empty()) continue;
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, o.lr(),
                      std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(), o.eps(),
                      /*amsgrad=*/false, /*maximize=*/false);
  }
}

// Lamb::step over the range's pieces; each matrix's ||w|| and ||u|| are
// summed over the groups' primaries first (one all-reduce).
void ShardedOptimizer::lamb_step() {
  const bool counts = layout_.primary(comm_.rank());
  // Per parameter, ||w||² and ||u||² of this rank's pieces, summed on the
  // device: the trust ratios never leave it.
  std::vector<torch::Tensor> sq(2 * params_.size());
  auto add = [&sq](size_t at, const torch::Tensor& v) { sq[at] = sq[at].defined() ? sq[at] + v : v; };
  std::vector<torch::Tensor> updates(segments_.size());
  for (size_t i = 0; i < segments_.size(); ++i) {
    const auto& s = segments_[i];
    torch::Tensor grad = grad_of(s);
    if (!grad.defined()) continue;
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(param_groups_.at(s.decay ? 0 : 1).options());
    double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
    double t = static_cast<double>(steps_[s.param]);
    auto m = exp_avg_.narrow(0, s.at, s.length), v = exp_avg_sq_.narrow(0, s.at, s.length);
    m.mul_(beta1).add_(grad, 1 - beta1);
    v.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
    auto update = (m / (1 - std::pow(beta1, t))) / ((v / (1 - std::pow(beta2, t))).sqrt() + o.eps());
    auto w = param_of(s);
    if (o.weight_decay() != 0) {
      update.add_(w, o.weight_decay());
      if (counts) {
        add(2 * s.param, w.norm().to(torch::kFloat64).square());
        add(2 * s.param + 1, update.norm().to(torch::kFloat64).square());
      }
    }
    updates[i] = update;
  }
  auto zero = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(exp_avg_.device()));
  for (auto& v : sq) {
    if (!v.defined()) v = zero;
  }
  torch::Tensor norms = torch::stack(sq);
  comm_.all_reduce_sum(norms, "LAMB trust ratios");
  norms = norms.sqrt();
  for (size_t i = 0; i < segments_.size(); ++i) {
    if (!updates[i].defined()) continue;
    const auto& s = segments_[i];
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(param_groups_.at(s.decay ? 0 : 1).options());
    if (o.weight_decay() == 0) {
      param_of(s).add_(updates[i], -o.lr());
      continue;
    }
    param_of(s).sub_(updates[i] * (o.lr() * trust_ratio(norms[2 * s.param], norms[2 * s.param + 1])));
  }
}

// Every group's primary sends the range it updated.
void ShardedOptimizer::share_params() {
  if (comm_.size() == 1) return;
  for (int g = 0; g < layout_.groups(); ++g) {
    int64_t n = layout_.hi(g) - layout_.lo(g);
    if (n == 0) continue;
    torch::Tensor range = flat_params_.narrow(0, layout_.lo(g), n);
    comm_.broadcast(range, /*root=*/g, "sharded parameter all-gather");
  }
}

NamedTensors ShardedOptimizer::range_state() const {
  return {{"exp_avg", exp_avg_},
          {"exp_avg_sq", exp_avg_sq_},
          {"steps", torch::tensor(steps_, torch::kInt64)},
          {"range", torch::tensor(std::vector<int64_t>{lo(), hi()}, torch::kInt64)}};
}

void ShardedOptimizer::take(int64_t from, const torch::Tensor& exp_avg, const torch::Tensor& exp_avg_sq) {
  int64_t a = std::max(from, lo()), b = std::min(from + exp_avg.numel(), hi());
  if (a >= b) return;
  torch::NoGradGuard no_grad;
  exp_avg_.narrow(0, a - lo(), b - a).copy_(exp_avg.reshape({-1}).narrow(0, a - from, b - a));
  exp_avg_sq_.narrow(0, a - lo(), b - a).copy_(exp_avg_sq.reshape({-1}).narrow(0, a - from, b - a));
}

void ShardedOptimizer::set_steps(const torch::Tensor& steps) {
  COHORT_CHECK(steps.numel() == static_cast<int64_t>(steps_.size()), DataError, "sharded optimizer state has ",
               steps.numel(), " step counts, the model ", steps_.size(), " trainable parameters");
  auto s = steps.to(torch::kInt64).contiguous();
  for (size_t k = 0; k < steps_.size(); ++k) steps_[k] = s.data_ptr<int64_t>()[k];
}

bool ShardedOptimizer::take_whole(torch::optim::Optimizer& whole) {
  torch::NoGradGuard no_grad;
  for (size_t g = 0; g < whole.param_groups().size(); ++g) {  // its options, as a whole reader takes them
    param_groups().at(g).set_options(whole.param_groups()[g].options().clone());
  }
  auto& state = whole.state();
  if (state.empty()) return false;
  for (size_t k = 0; k < params_.size(); ++k) {
    auto it = state.find(params_[k].unsafeGetTensorImpl());
    if (it == state.end()) continue;  // never stepped
    auto& st = static_cast<torch::optim::AdamWParamState&>(*it->second);
    steps_[k] = st.step();
    take(starts_[k], st.exp_avg(), st.exp_avg_sq());
  }
  return true;
}

NamedTensors ShardedOptimizer::own_state() const {
  NamedTensors out;
  for (const auto& [name, t] : range_state()) out.emplace_back("optimizer." + name, t);
  return out;
}

std::string ShardedOptimizer::restore_own(const std::vector<NamedTensors>& island) {
  COHORT_CHECK(!island.empty(), DataError, "optimizer state: the checkpoint holds no rank's");
  if (torch::Tensor archive = named_or_none(island.front(), "optimizer"); archive.defined()) {
    torch::optim::AdamW whole(param_groups(), torch::optim::AdamWOptions());
    load_archive(whole, archive, torch::Device(torch::kCPU));
    take_whole(whole);
    return "dist.shard: the island's optimizer state was whole; each rank took its range of it";
  }
  RangeSource src = own_ranges(island, layout_.total());
  COHORT_CHECK(!src.ranges.empty(), DataError, "optimizer state: the checkpoint holds neither a whole optimizer nor "
               "ranges of one for this rank");
  torch::NoGradGuard no_grad;
  src.for_each(lo(), hi(), layout_.total() + 1,
               [this](int64_t at, const torch::Tensor& m, const torch::Tensor& v) { take(at, m, v); });
  set_steps(src.steps());
  bool same = static_cast<int>(src.ranges.size()) == layout_.groups();
  for (size_t g = 0; same && g < src.ranges.size(); ++g) {
    same = src.ranges[g].lo == layout_.lo(static_cast<int>(g)) && src.ranges[g].hi == layout_.hi(static_cast<int>(g));
  }
  if (same) return "";
  return strf("dist.shard: re-sharded the island's optimizer state from %zu range(s) to %d", src.ranges.size(),
              layout_.groups());
}

NamedTensors ShardedOptimizer::held_ranges() const {
  NamedTensors out;
  if (!consistent_) return out;  // its parameters mix two steps: no range to hand over
  for (auto& [name, t] : range_state()) out.emplace_back(name, t.clone());
  // Whose state it is: islands (dist.islands) each hold their own, named by
  // the island's first rank.
  out.emplace_back("team", torch::tensor({static_cast<int64_t>(comm_.global_ranks().front())}, torch::kInt64));
  return out;
}

std::string ShardedOptimizer::restore(const ResolvedCheckpoint& from) {
  const ShardRecord& rec = from.state.shard;
  const std::string archive = from.file("optimizer.pt");
  if (!rec.sharded()) {
    // A whole state: read it beside the parameters, keep this rank's range.
    torch::optim::AdamW whole(param_groups(), torch::optim::AdamWOptions());
    torch::load(whole, archive, torch::Device(torch::kCPU));
    if (!take_whole(whole)) return "";  // written before any step: no moments to keep
    return "dist.shard: the checkpoint's optimizer state was whole; this rank kept its range of it";
  }
  COHORT_CHECK(rec.bounds.back() == layout_.total(), DataError, from.dir, ": its optimizer ranges cover ",
               rec.bounds.back(), " parameters, this model has ", layout_.total());
  torch::load(*this, archive);  // the options only: a sharded optimizer's archive holds no state
  RangeSource src = read_ranges(from);
  src.for_each(lo(), hi(), layout_.total() + 1,
               [this](int64_t at, const torch::Tensor& m, const torch::Tensor& v) { take(at, m, v); });
  set_steps(src.steps());
  if (layout_.bounds == rec.bounds && layout_.replicas == rec.replicas) return "";
  return strf("dist.shard: re-sharded the optimizer state from %d range(s) to %d", rec.groups(), layout_.groups());
}

void ShardedOptimizer::write_ranges(Comm& comm, Checkpoints& checkpoints, int64_t step, CheckpointState& record) {
  record.shard = ShardRecord{name_of(mode_), layout_.replicas, layout_.bounds, layout_.weights};
  on_main_then_agree(comm, "checkpoint directory", [&] { checkpoints.begin(step); });
  try {
    on_each_then_agree(comm, "checkpoint range write", [&] {
      // Sharded over an island (dist.sync = local): the first island's
      // state is the checkpoint's, as rank 0's whole optimizer is.
      if (!layout_.primary(comm_.rank()) || comm_.global_ranks().front() != 0) return;
      std::string path = checkpoints.temp_dir(step) + "/" + ShardRecord::file(group_);
      try {
        save_safetensors(path, range_state(), {{"lo", std::to_string(lo())}, {"hi", std::to_string(hi())}});
      } catch (const Error& e) {  // a full disk: as a whole checkpoint's failed write says it
        throw Error(detail::cat(e.what(), "; ", checkpoints.not_written(step)), e.exit_code());
      }
    });
  } catch (...) {
    if (comm.world().is_main()) checkpoints.abandon(step);
    throw;
  }
}

namespace {

torch::Tensor named(const NamedTensors& ts, const std::string& name) {
  for (const auto& [n, t] : ts) {
    if (n == name) return t;
  }
  throw Error("state handover: the sharded optimizer state lacks " + name);
}

}  // namespace

// The members pool which range each holds at `step`, and whose state it is
// (the world's, or under local steps each island's own); every range of one
// whole state (the new rank 0's if it is whole, else the first island's that
// is) goes out from its lowest-ranked holder, in pieces, and each rank keeps
// what falls in its new range. ShardsLost when no state is whole.
std::string ShardedOptimizer::adopt_ranges(Comm& comm, const Handover* held, int64_t step) {
  const int n = comm.size();
  constexpr int kPer = 4;  // lo, hi, held, team
  // Every rank takes rank 0's model: a rank 0 that ended mid-update (its
  // range of step+1, the rest of step) hands over no range either.
  std::vector<double> offers(kPer * n + 1, 0.0);
  if (comm.world().is_main() && held && !held->shard.empty()) offers[kPer * n] = 1;
  if (held && held->state.step == step && !held->shard.empty()) {
    auto range = named(held->shard, "range").contiguous();
    offers[kPer * comm.rank()] = static_cast<double>(range.data_ptr<int64_t>()[0]);
    offers[kPer * comm.rank() + 1] = static_cast<double>(range.data_ptr<int64_t>()[1]);
    offers[kPer * comm.rank() + 2] = 1;
    offers[kPer * comm.rank() + 3] = static_cast<double>(named(held->shard, "team").item<int64_t>());
  }
  offers = comm.all_reduce_sum(offers, "sharded state handover");
  if (offers[kPer * n] == 0) {
    throw ShardsLost("dist.shard: the new world's rank 0 was applying a step's update when the world ended, so its "
                     "model mixes two steps");
  }
  struct Offer {
    RangeSource::Range range;
    int rank;  // its lowest-ranked holder
  };
  // Each state's distinct ranges, by team, and how far from 0 they cover.
  std::map<int, std::vector<Offer>> by_team;
  for (int r = 0; r < n; ++r) {
    if (offers[kPer * r + 2] == 0) continue;
    RangeSource::Range h{static_cast<int64_t>(offers[kPer * r]), static_cast<int64_t>(offers[kPer * r + 1])};
    auto& offered = by_team[static_cast<int>(offers[kPer * r + 3])];
    bool seen = false;
    for (const auto& x : offered) seen = seen || (x.range.lo == h.lo && x.range.hi == h.hi);
    if (!seen) offered.push_back({h, r});
  }
  // The first gap in a state's ranges: [covered, gap_end).
  struct Gap {
    int64_t covered = 0, gap_end = 0;
  };
  auto gap_of = [this](std::vector<Offer>& offered) {
    std::sort(offered.begin(), offered.end(), [](const Offer& a, const Offer& b) { return a.range.lo < b.range.lo; });
    Gap g{0, layout_.total()};
    for (const auto& o : offered) {
      if (o.range.lo > g.covered) {
        g.gap_end = o.range.lo;
        break;
      }
      g.covered = std::max(g.covered, o.range.hi);
    }
    return g;
  };
  const int main_team = offers[2] != 0 ? static_cast<int>(offers[3]) : -1;
  std::vector<Offer>* whole = nullptr;
  Gap best;
  for (bool mains : {true, false}) {
    for (auto& [team, offered] : by_team) {
      if (whole || (mains && team != main_team)) continue;
      const Gap g = gap_of(offered);
      if (g.covered >= best.covered) best = g;
      if (g.covered >= layout_.total()) whole = &offered;
    }
  }
  if (!whole) {
    throw ShardsLost(strf("dist.shard: elements [%lld, %lld) of the optimizer state (of %lld) were held only by the "
                          "lost rank(s) (dist.shard-replicas = %d)%s", static_cast<long long>(best.covered),
                          static_cast<long long>(best.gap_end), static_cast<long long>(layout_.total()),
                          layout_.replicas, by_team.size() > 1 ? ", in every island" : ""));
  }
  RangeSource src;
  src.collective = true;
  std::vector<int> holder;  // per range of src
  for (const auto& o : *whole) {
    src.ranges.push_back(o.range);
    holder.push_back(o.rank);
  }
  const int me = comm.rank();
  src.piece = [&](size_t i, int64_t at, int64_t len) {
    torch::Tensor m, v;
    if (holder[i] == me) {
      m = named(held->shard, "exp_avg").narrow(0, at - src.ranges[i].lo, len).clone();
      v = named(held->shard, "exp_avg_sq").narrow(0, at - src.ranges[i].lo, len).clone();
    } else {
      m = torch::empty({len}, state_options());
      v = torch::empty({len}, state_options());
    }
    comm.broadcast(m, holder[i], "sharded state handover");
    comm.broadcast(v, holder[i], "sharded state handover");
    return std::make_pair(m, v);
  };
  src.steps = [&] {
    torch::Tensor steps = holder.front() == me ? named(held->shard, "steps").clone()
                                               : torch::empty({static_cast<int64_t>(steps_.size())}, torch::kInt64);
    comm.broadcast(steps, holder.front(), "sharded state handover");
    return steps;
  };
  torch::NoGradGuard no_grad;
  constexpr int64_t kPiece = 1 << 22;  // floats per broadcast: what a rank holds beyond its range
  src.for_each(lo(), hi(), kPiece, [this](int64_t at, const torch::Tensor& m, const torch::Tensor& v) { take(at, m, v); });
  set_steps(src.steps());
  return strf("dist.shard: re-sharded the optimizer state in memory from %zu surviving range(s) into %d",
              src.ranges.size(), layout_.groups());
}

}  // namespace cohort
