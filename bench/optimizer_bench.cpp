// AdamW step time: libtorch's torch::optim::AdamW against Cohort's FusedAdamW
// (ATen's _fused_adamw_), on the parameters of a BERT shape, with the same
// random gradients, interleaved, median of --rounds. Also prints how far the
// two drift apart over the measured steps (they share the formula, not the
// rounding).
//
//   build/bench/optimizer_bench --hidden 256 --layers 4 --vocab 30522 --threads 2
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "bert_options.hpp"
#include "cohort/config/config.hpp"
#include "cohort/model/bert.hpp"
#include "cohort/train/optimization/optim.hpp"
#include "interleave.hpp"

int main(int argc, char** argv) {
  using namespace cohort;
  CLI::App app{"AdamW step time: torch::optim::AdamW vs FusedAdamW"};
  bench::BertOptions shape(app);
  int rounds = 15, threads = 1;
  app.add_option("--rounds", rounds)->capture_default_str();
  app.add_option("--threads", threads)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const BertConfig& c = shape.resolve();
  torch::set_num_threads(threads);

  OptimOptions oo;
  oo.lr = 1e-3;
  oo.eps = 1e-6;
  torch::manual_seed(1);
  BertForPretraining a(c), b(c);
  {
    torch::NoGradGuard no_grad;
    auto pa = a->parameters(), pb = b->parameters();
    for (size_t i = 0; i < pa.size(); ++i) pb[i].copy_(pa[i]);
  }
  int64_t numel = 0;
  for (auto& p : a->parameters()) numel += p.numel();
  // make_optimizer gives FusedAdamW for adamw; the reference is libtorch's own.
  auto fused = make_optimizer(oo, *b);
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : a->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  auto base = torch::optim::AdamWOptions(oo.lr).eps(oo.eps);
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(base).weight_decay(0.01)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(base).weight_decay(0.0)));
  torch::optim::AdamW plain(std::move(groups), base);

  std::vector<double> t_plain, t_fused;
  auto time_step = [](torch::optim::Optimizer& opt) {
    auto t0 = std::chrono::steady_clock::now();
    opt.step();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 1e3;
  };
  for (int r = 0; r < rounds; ++r) {
    auto pa = a->parameters(), pb = b->parameters();
    for (size_t i = 0; i < pa.size(); ++i) {
      auto g = torch::randn_like(pa[i]) * 1e-2;
      pa[i].mutable_grad() = g.clone();
      pb[i].mutable_grad() = g;
    }
    t_plain.push_back(time_step(plain));
    t_fused.push_back(time_step(*fused));
  }
  double drift = 0;
  {
    auto pa = a->parameters(), pb = b->parameters();
    for (size_t i = 0; i < pa.size(); ++i) drift = std::max(drift, (pa[i] - pb[i]).abs().max().item<double>());
  }
  t_plain.erase(t_plain.begin());  // first step allocates the moments
  t_fused.erase(t_fused.begin());
  double mp = bench::median(t_plain), mf = bench::median(t_fused);
  std::printf("AdamW on BERT H=%lld L=%lld V=%lld (%.1f M params), %d thread(s), median of %zu steps\n",
              static_cast<long long>(c.hidden), static_cast<long long>(c.layers),
              static_cast<long long>(c.vocab_size), static_cast<double>(numel) / 1e6, threads, t_plain.size());
  std::printf("torch::optim::AdamW %8.2f ms\nFusedAdamW          %8.2f ms\nspeedup             %8.2f x\n"
              "max |w_plain - w_fused| after %d steps: %.2e\n",
              mp, mf, mp / mf, rounds, drift);
  return 0;
}
