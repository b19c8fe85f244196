// The flags the kernel benchmarks share (dropout_bench, residual_norm_bench):
// threads, timed rounds, the [batch, seq, hidden] activation and its dtype.
#pragma once

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <numeric>
#include <string>
#include <vector>

namespace cohort::bench {

struct KernelShape {
  int threads = 2, rounds = 15;
  int64_t batch = 32, seq = 128, hidden = 256;
  std::string precision = "fp32";

  explicit KernelShape(CLI::App& app) {
    app.add_option("--threads", threads)->capture_default_str();
    app.add_option("--rounds", rounds)->capture_default_str();
    app.add_option("--batch", batch)->capture_default_str();
    app.add_option("--seq", seq)->capture_default_str();
    app.add_option("--hidden", hidden)->capture_default_str();
    app.add_option("--precision", precision, "fp32 | bf16")->capture_default_str();
  }

  // After parsing: sets torch's threads and returns the activation dtype.
  torch::Dtype start() const {
    torch::set_num_threads(threads);
    return precision == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  }

  // Sample ids 0..batch-1, for per-sample dropout masks.
  std::vector<int64_t> sample_ids() const {
    std::vector<int64_t> ids(static_cast<size_t>(batch));
    std::iota(ids.begin(), ids.end(), 0);
    return ids;
  }
};

}  // namespace cohort::bench
