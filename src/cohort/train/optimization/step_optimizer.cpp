#include "cohort/train/optimization/step_optimizer.hpp"

#include <torch/optim/adamw.h>
#include <torch/serialize.h>

#include <algorithm>
#include <map>

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
    const auto params = module_.parameters();
    const torch::Device device = params.empty() ? torch::Device(torch::kCPU) : params[0].device();
    if (!from.state.shard.sharded()) {
      torch::load(*optimizer_, from.file("optimizer.pt"), device);
      return "";
    }
    return join(from);
  }

 private:
  // A sharded checkpoint: every range into this whole optimizer's state.
  std::string join(const ResolvedCheckpoint& from) {
    std::vector<torch::Tensor> params;
    for (auto& p : module_.parameters()) {
      if (p.requires_grad()) params.push_back(p);
    }
    std::vector<int64_t> starts(params.size() + 1, 0);
    for (size_t k = 0; k < params.size(); ++k) starts[k + 1] = starts[k] + params[k].numel();
    const ShardRecord& rec = from.state.shard;
    COHORT_CHECK(rec.bounds.back() == starts.back(), DataError, from.dir, ": its optimizer ranges cover ",
                 rec.bounds.back(), " parameters, this model has ", starts.back());
    RangeSource src = read_ranges(from);
    const auto steps = src.steps().to(torch::kInt64).contiguous();
    COHORT_CHECK(steps.numel() == static_cast<int64_t>(params.size()), DataError, from.dir, ": ", steps.numel(),
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
    return strf("dist.shard: joined the checkpoint's %d optimizer range(s) into one whole state", rec.groups());
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
