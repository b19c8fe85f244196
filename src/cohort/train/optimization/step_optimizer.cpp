#include "cohort/train/optimization/step_optimizer.hpp"

#include <torch/optim/adamw.h>
#include <torch/serialize.h>

#include <algorithm>
#include <map>
#include <sstream>

#include "cohort/core/format.hpp"
#include "cohort/train/optimization/optim.hpp"
#include "cohort/train/optimization/sharded_optim.hpp"

namespace cohort {

void RangeSource::for_each(int64_t lo, int64_t hi, int64_t piece_floats,
                           const std::function<void(int64_t, const torch::Tensor&, const torch::Tensor&)>& take) const {
  for (size_t i = 0; i < ranges.size(); ++i) {
    const Range& r = ranges[i];
    if (!collective && (r.hi <= lo || r.lo >= hi)) continue;
    // A collective source sends every piece of every range, in order, so
    // that every rank issues the same broadcasts.
    const int64_t from = collective ? r.lo : std::max(r.lo, lo), to = collective ? r.hi : std::min(r.hi, hi);
    for (int64_t at = from; at < to; at += piece_floats) {
      const int64_t n = std::min(piece_floats, to - at);
      auto [m, v] = piece(i, at, n);
      take(at, m, v);
    }
  }
}

RangeSource read_ranges(const ResolvedCheckpoint& from) {
  struct Files {
    ResolvedCheckpoint from;
    std::map<size_t, NamedTensors> read;
    const NamedTensors& at(size_t g) {
      auto it = read.find(g);
      if (it != read.end()) return it->second;
      const std::string path = from.file(ShardRecord::file(static_cast<int>(g)));
      SafetensorsFile f = load_safetensors(path);
      for (const char* key : {"exp_avg", "exp_avg_sq", "steps"}) {
        COHORT_CHECK(f.tensors.count(key), DataError, path, ": no tensor '", key, "'");
      }
      const int64_t n = from.state.shard.bounds.at(g + 1) - from.state.shard.bounds.at(g);
      COHORT_CHECK(f.tensors.at("exp_avg").numel() == n && f.tensors.at("exp_avg_sq").numel() == n, DataError, path,
                   ": holds ", f.tensors.at("exp_avg").numel(), " values, but state.json gives its range [",
                   from.state.shard.bounds.at(g), ", ", from.state.shard.bounds.at(g + 1), ")");
      NamedTensors t = {{"exp_avg", f.tensors.at("exp_avg").reshape({-1})},
                        {"exp_avg_sq", f.tensors.at("exp_avg_sq").reshape({-1})},
                        {"steps", f.tensors.at("steps")}};
      return read.emplace(g, std::move(t)).first->second;
    }
  };
  auto files = std::make_shared<Files>(Files{from, {}});
  const std::vector<int64_t>& bounds = from.state.shard.bounds;
  RangeSource src;
  for (size_t g = 0; g + 1 < bounds.size(); ++g) src.ranges.push_back({bounds[g], bounds[g + 1]});
  src.piece = [files, bounds](size_t g, int64_t at, int64_t n) {
    const NamedTensors& t = files->at(g);
    return std::make_pair(t[0].second.narrow(0, at - bounds[g], n), t[1].second.narrow(0, at - bounds[g], n));
  };
  src.steps = [files] {  // a file already read, or the first
    return (files->read.empty() ? files->at(0) : files->read.begin()->second)[2].second;
  };
  return src;
}

torch::Tensor archive_bytes(torch::optim::Optimizer& optimizer) {
  std::ostringstream os;
  torch::save(optimizer, os);
  std::string bytes = os.str();
  return torch::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size())}, torch::kUInt8).clone();
}

void load_archive(torch::optim::Optimizer& optimizer, const torch::Tensor& bytes, const torch::Device& device) {
  auto t = bytes.contiguous().cpu();
  std::istringstream in(std::string(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel())));
  torch::load(optimizer, in, device);
}

torch::Tensor named_or_none(const NamedTensors& tensors, const std::string& name) {
  for (const auto& [n, t] : tensors) {
    if (n == name) return t;
  }
  return torch::Tensor();
}

RangeSource own_ranges(const std::vector<NamedTensors>& island, int64_t total) {
  struct Held {
    RangeSource::Range range;
    torch::Tensor exp_avg, exp_avg_sq, steps;
  };
  auto held = std::make_shared<std::vector<Held>>();
  for (const auto& own : island) {
    torch::Tensor r = named_or_none(own, "optimizer.range");
    if (!r.defined()) continue;
    r = r.to(torch::kInt64).contiguous();
    COHORT_CHECK(r.numel() == 2, DataError, "optimizer state: a range of ", r.numel(), " bounds");
    Held h{{r.data_ptr<int64_t>()[0], r.data_ptr<int64_t>()[1]}, named_or_none(own, "optimizer.exp_avg"),
           named_or_none(own, "optimizer.exp_avg_sq"), named_or_none(own, "optimizer.steps")};
    const int64_t n = h.range.hi - h.range.lo;
    COHORT_CHECK(h.exp_avg.defined() && h.exp_avg_sq.defined() && h.steps.defined() && h.exp_avg.numel() == n &&
                     h.exp_avg_sq.numel() == n,
                 DataError, "optimizer state: the range [", h.range.lo, ", ", h.range.hi,
                 ") lacks its moments or step counts, or holds another number of values");
    h.exp_avg = h.exp_avg.reshape({-1});
    h.exp_avg_sq = h.exp_avg_sq.reshape({-1});
    bool seen = false;  // dist.shard-replicas = 2: two holders of one range
    for (const auto& x : *held) seen = seen || (x.range.lo == h.range.lo && x.range.hi == h.range.hi);
    if (!seen) held->push_back(std::move(h));
  }
  std::sort(held->begin(), held->end(), [](const Held& a, const Held& b) { return a.range.lo < b.range.lo; });
  RangeSource src;
  if (held->empty()) return src;
  int64_t covered = 0;
  for (const auto& h : *held) {
    COHORT_CHECK(h.range.lo <= covered, DataError, "optimizer state: no rank holds [", covered, ", ", h.range.lo,
                 ") of the optimizer's ", total, " values");
    covered = std::max(covered, h.range.hi);
    src.ranges.push_back(h.range);
  }
  COHORT_CHECK(covered == total, DataError, "optimizer state: the ranges cover ", covered, " values, the model has ",
               total);
  src.piece = [held](size_t i, int64_t at, int64_t n) {
    const Held& h = held->at(i);
    return std::make_pair(h.exp_avg.narrow(0, at - h.range.lo, n), h.exp_avg_sq.narrow(0, at - h.range.lo, n));
  };
  src.steps = [held] { return held->front().steps; };
  return src;
}

namespace {

// A whole optimizer (make_optimizer's) over every trainable parameter.
class WholeOptimizer : public StepOptimizer {
 public:
  WholeOptimizer(const OptimOptions& opts, torch::nn::Module& module)
      : optimizer_(make_optimizer(opts, module)), module_(module) {}

  torch::optim::Optimizer& optimizer() override { return *optimizer_; }
  GradientSet gradients() override { return module_gradients(module_); }
  void write_ranges(Comm&, Checkpoints&, int64_t, CheckpointState&) override {}  // optimizer.pt holds it all

  std::string restore(const ResolvedCheckpoint& from) override {
    // Saved where the writer's parameters were: the state goes where this
    // rank's are.
    if (!from.state.shard.sharded()) {
      torch::load(*optimizer_, from.file("optimizer.pt"), device());
      return "";
    }
    const ShardRecord& rec = from.state.shard;
    COHORT_CHECK(rec.bounds.back() == total(), DataError, from.dir, ": its optimizer ranges cover ",
                 rec.bounds.back(), " parameters, this model has ", total());
    join(read_ranges(from));
    return strf("dist.shard: joined the checkpoint's %d optimizer range(s) into one whole state", rec.groups());
  }

  NamedTensors own_state() const override { return {{"optimizer", archive_bytes(*optimizer_)}}; }

  std::string restore_own(const std::vector<NamedTensors>& island) override {
    COHORT_CHECK(!island.empty(), DataError, "optimizer state: the checkpoint holds no rank's");
    if (torch::Tensor archive = named_or_none(island.front(), "optimizer"); archive.defined()) {
      load_archive(*optimizer_, archive, device());
      return "";
    }
    RangeSource src = own_ranges(island, total());
    COHORT_CHECK(!src.ranges.empty(), DataError, "optimizer state: the checkpoint holds neither a whole optimizer "
                 "nor ranges of one for this rank");
    join(src);
    return strf("dist.shard: joined the island's %zu optimizer range(s) into one whole state", src.ranges.size());
  }

 private:
  torch::Device device() const {
    const auto params = module_.parameters();
    return params.empty() ? torch::Device(torch::kCPU) : params[0].device();
  }
  int64_t total() const {
    int64_t n = 0;
    for (auto& p : module_.parameters()) n += p.requires_grad() ? p.numel() : 0;
    return n;
  }

  // Ranges of a sharded state (a checkpoint's files, or ranks' own states)
  // into this whole optimizer's state.
  void join(const RangeSource& src) {
    std::vector<torch::Tensor> params;
    for (auto& p : module_.parameters()) {
      if (p.requires_grad()) params.push_back(p);
    }
    std::vector<int64_t> starts(params.size() + 1, 0);
    for (size_t k = 0; k < params.size(); ++k) starts[k + 1] = starts[k] + params[k].numel();
    const auto steps = src.steps().to(torch::kInt64).contiguous();
    COHORT_CHECK(steps.numel() == static_cast<int64_t>(params.size()), DataError, "optimizer state: ", steps.numel(),
                 " step counts for ", params.size(), " parameters");
    torch::NoGradGuard no_grad;
    auto& state = optimizer_->state();
    src.for_each(0, starts.back(), starts.back() + 1, [&](int64_t at, const torch::Tensor& m, const torch::Tensor& v) {
      for (size_t k = 0; k < params.size(); ++k) {
        const int64_t a = std::max(starts[k], at), b = std::min(starts[k + 1], at + m.numel());
        if (a >= b || steps.data_ptr<int64_t>()[k] == 0) continue;
        void* key = params[k].unsafeGetTensorImpl();
        auto it = state.find(key);
        if (it == state.end()) {
          auto st = std::make_unique<torch::optim::AdamWParamState>();
          st->exp_avg(torch::zeros_like(params[k]));
          st->exp_avg_sq(torch::zeros_like(params[k]));
          st->step(steps.data_ptr<int64_t>()[k]);
          it = state.emplace(key, std::move(st)).first;
        }
        auto& st = static_cast<torch::optim::AdamWParamState&>(*it->second);
        st.exp_avg().view({-1}).narrow(0, a - starts[k], b - a).copy_(m.narrow(0, a - at, b - a));
        st.exp_avg_sq().view({-1}).narrow(0, a - starts[k], b - a).copy_(v.narrow(0, a - at, b - a));
      }
    });
  }

  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  torch::nn::Module& module_;
};

}  // namespace

std::unique_ptr<StepOptimizer> make_step_optimizer(Comm& comm, const Config& cfg, torch::nn::Module& module) {
  if (cfg.dist.shard == ShardMode::kNone) return std::make_unique<WholeOptimizer>(cfg.optim, module);
  return std::make_unique<ShardedOptimizer>(comm, module, cfg);
}

}  // namespace cohort
