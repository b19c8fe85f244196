// defines: BenchOptions, run_bench
//
// `cohort bench`: a short training run of one config at each rank count on
// this node, with a fixed per-rank batch (weak scaling, as HetSeq reports
// it), printed as a table of step time, throughput, speedup and efficiency.
// With a peer, the same model and batch run through PyTorch DDP
// (bench/peers/) and its throughput is printed beside Cohort's. With hosts >
// 1 (as root), each rank count also runs as that many "hosts": network
// namespaces joined by a bridge, optionally shaped with tc netem, one
// `cohort train` launcher per host meeting over tcp://, as on real nodes.
#pragma once

#include <string>
#include <vector>

namespace cohort {

struct BenchOptions {
  std::vector<int> ranks = {1, 2};
  int64_t per_rank_batch = 64;
  int64_t steps = 60;
  int threads_per_rank = 1;
  std::string peer;              // "" | "pytorch"
  int hosts = 1;                 // >1: also run across this many network-namespace "hosts" (root)
  std::string netem;             // tc netem options for each host's link, e.g. "delay 1ms rate 1gbit"
  std::string out_dir;           // where the runs go; "" = a temp dir, removed after
};

// `train_args` are extra `cohort train` arguments (--config, --model.*, ...).
// Returns the exit code for main.
int run_bench(const BenchOptions& opts, const std::vector<std::string>& train_args);

}  // namespace cohort
