// Dropout alone, forward and backward: libtorch's (torch::dropout, masks from
// the generator) beside Cohort's per-sample masks (model/dropout.hpp), on
// bert-mini's two dropout shapes, interleaved, median of the rounds.
//
//   build/bench/dropout_bench --threads 2 --rounds 15 [--precision bf16]
// prints one JSON line per shape: milliseconds per forward+backward of each,
// and the ratio.
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <numeric>
#include <optional>

#include "cohort/model/dropout.hpp"
#include "interleave.hpp"
#include "kernel_shape.hpp"

int main(int argc, char** argv) {
  CLI::App app{"dropout forward+backward: libtorch's against per-sample masks"};
  cohort::bench::KernelShape k(app);
  int64_t heads = 4;
  app.add_option("--heads", heads)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const auto dtype = k.start();
  const std::vector<int64_t> ids = k.sample_ids();
  const int64_t batch = k.batch, seq = k.seq, hidden = k.hidden;
  const int rounds = k.rounds;
  const std::string& precision = k.precision;
  for (auto shape : {std::vector<int64_t>{batch, seq, hidden}, {batch, heads, seq, seq}}) {
    auto x = torch::randn(shape).to(dtype).requires_grad_(true);
    auto g = torch::randn(shape).to(dtype);
    auto time = [&](bool sample) {
      auto t0 = std::chrono::steady_clock::now();
      {
        std::optional<cohort::DropoutRows> rows;
        if (sample) rows.emplace(1, 0, ids);
        cohort::sample_dropout(x, 0.1, 3, true).backward(g);
      }
      x.mutable_grad() = torch::Tensor();
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    };
    const auto [ml, ms] =
        cohort::bench::interleaved_medians(rounds, /*warmup=*/2, [&] { return time(false); }, [&] { return time(true); });
    std::printf("{\"shape\": \"%s\", \"precision\": \"%s\", \"libtorch_ms\": %.3f, \"sample_ms\": %.3f, "
                "\"sample_over_libtorch\": %.3f, \"ns_per_element\": %.3f}\n",
                shape.size() == 3 ? "[B,L,H]" : "[B,A,L,L]", precision.c_str(), ml, ms, ms / ml,
                ms * 1e6 / static_cast<double>(x.numel()));
  }
  return 0;
}
