// BERT's sublayer output, LayerNorm(dropout(x) + residual), forward and
// backward: the unfused libtorch ops beside the fused pass
// (model/residual_norm.hpp), on bert-mini's [B, L, H] with per-sample masks,
// interleaved, median of the rounds. Under bf16 (autocast's types: x bf16,
// the residual fp32) both sides also produce the bf16 copy the next matrix
// product reads, and take its gradient back, as in the model.
//
//   build/bench/residual_norm_bench --threads 2 --rounds 15 [--precision bf16]
// prints one JSON line: milliseconds per forward+backward of each, and the ratio.
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <numeric>

#include "cohort/model/dropout.hpp"
#include "cohort/model/residual_norm.hpp"
#include "interleave.hpp"
#include "kernel_shape.hpp"

int main(int argc, char** argv) {
  CLI::App app{"dropout + residual + LayerNorm forward+backward: unfused against fused"};
  cohort::bench::KernelShape k(app);
  double p = 0.1;
  app.add_option("--dropout", p)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const auto low = k.start();
  const std::vector<int64_t> ids = k.sample_ids();
  const int64_t batch = k.batch, seq = k.seq, hidden = k.hidden;
  const int rounds = k.rounds;
  const std::string& precision = k.precision;
  cohort::DropoutRows rows(1, 0, ids);
  auto x = torch::randn({batch, seq, hidden}).to(low).requires_grad_(true);
  auto r = torch::randn({batch, seq, hidden}).requires_grad_(true);
  auto w = torch::ones({hidden}).requires_grad_(true), b = torch::zeros({hidden}).requires_grad_(true);
  auto gy = torch::randn({batch, seq, hidden}), gl = torch::randn({batch, seq, hidden}).to(low);
  auto time = [&](bool fused) {
    auto t0 = std::chrono::steady_clock::now();
    cohort::Hidden h = fused ? cohort::dropout_add_layer_norm(x, r, w, b, 1e-12, p, 3, true)
                             : cohort::dropout_add_layer_norm_unfused(x, r, w, b, 1e-12, p, 3, true);
    if (low == torch::kFloat32) {
      h.full.backward(gy);
    } else {  // the product's copy: the fused pass's own, or autocast's cast
      torch::autograd::backward({h.full, h.low.defined() ? h.low : h.full.to(low)}, {gy, gl});
    }
    for (auto* t : {&x, &r, &w, &b}) t->mutable_grad() = torch::Tensor();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  const auto [mu, mf] =
      cohort::bench::interleaved_medians(rounds, /*warmup=*/2, [&] { return time(false); }, [&] { return time(true); });
  std::printf("{\"shape\": [%ld, %ld, %ld], \"precision\": \"%s\", \"unfused_ms\": %.3f, \"fused_ms\": %.3f, "
              "\"fused_over_unfused\": %.3f}\n",
              static_cast<long>(batch), static_cast<long>(seq), static_cast<long>(hidden), precision.c_str(), mu, mf,
              mf / mu);
  return 0;
}
