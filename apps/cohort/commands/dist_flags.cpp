#include <torch/cuda.h>

#include <algorithm>
#include <charconv>

#include "cohort/core/error.hpp"
#include "cohort/train/lifecycle/runtime.hpp"
#include "commands/command.hpp"

namespace cohort::cli {

CLI::Validator at_least(long long least) {
  return CLI::Validator(
      [least](std::string& text) -> std::string {
        long long v = 0;
        auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (ec != std::errc() || end != text.data() + text.size()) return "must be an integer (got '" + text + "')";
        return v < least ? detail::cat("must be >= ", least, " (got ", text, ")") : std::string();
      },
      "", "");
}

void DistFlags::add(CLI::App& sub, bool elastic) {
  const std::string group = "Distributed (per node; HetSeq spellings accepted)";
  sub.add_option("--nproc-per-node,--distributed-gpus", launch.nproc_per_node,
                 "ranks to start on this node (one per GPU, or CPU ranks)")
      ->capture_default_str()->group(group);
  sub.add_flag("--oversubscribe", launch.oversubscribe,
               "allow more ranks on this node than it has cores (CPU) or GPUs")->group(group);
  sub.add_option("--nnodes", launch.nnodes, elastic ? "nodes in the job (elastic: nodes the first world waits for)"
                                                    : "nodes in the job")
      ->capture_default_str()->group(group);
  if (elastic) {
    sub.add_option("--min-nodes", launch.min_nodes,
                   "elastic: the job goes on while at least N nodes remain, and nodes may join mid-run "
                   "(0: off, a fixed world)")->capture_default_str()->group(group);
    sub.add_option("--max-nodes", launch.max_nodes, "elastic: at most N nodes; later ones wait (0: no limit)")
        ->capture_default_str()->group(group);
  }
  sub.add_option("--node-rank", launch.node_rank, "this node's index, 0..nnodes-1")
      ->capture_default_str()->group(group);
  sub.add_option("--init-method,--distributed-init-method", launch.init_method,
                 "rendezvous: tcp://HOST:PORT | file:///shared/path | env://; "
                 "default: SLURM/Open MPI/env:// variables, else a private store on one node")
      ->group(group);
  sub.add_option("--distributed-world-size", launch.world_size, "total ranks over all nodes (HetSeq)")
      ->check(at_least(1))->group(group);
  sub.add_option("--distributed-rank", launch.first_rank, "first global rank on this node (HetSeq)")
      ->check(at_least(0))->group(group);
  sub.add_option("--dist.secret", comm.secret, "shared secret every process of the job must know")
      ->envname("COHORT_SECRET")->group(group);
  sub.add_option("--dist.iface", comm.iface, "network interface for collectives (default: the one "
                 "that reaches the master)")->envname("GLOO_SOCKET_IFNAME")->group(group);
}

std::optional<int> DistFlags::launch_ranks(const CLI::App& sub, const Env& env, const Config& cfg, int argc,
                                           char** argv) {
  const bool gpus = cfg.train.device != DeviceKind::kCpu && torch::cuda::is_available();
  if (!env.count("COHORT_RANK") && sub.count("--nproc-per-node") == 0 && !nproc_kept_ && gpus) {
    launch.nproc_per_node = std::max<int>(1, static_cast<int>(torch::cuda::device_count()));
  }
  // A recorded shape of more CPU ranks than cores was accepted when the run began.
  if (nproc_kept_ && !gpus) launch.oversubscribe = true;
  launch.max_local_ranks = gpus ? static_cast<int>(torch::cuda::device_count()) : available_cores();
  launch.local_units = gpus ? "GPUs" : "cores";
  validate(launch);  // one process too: a bad --init-method or --node-rank is refused, not ignored
  if (env.count("COHORT_RANK") || !wants_launcher(launch)) return std::nullopt;
  // A world this node alone makes is known now: what does not fit it is one
  // line from the launcher, before any rank starts.
  if (launch.nnodes == 1 && launch.min_nodes == 0 && launch.world_size <= 0) validate_world(cfg, launch.nproc_per_node, /*one_node=*/true);
  launch.timeout_s = cfg.dist.timeout;
  return launch_node(launch, std::vector<std::string>(argv, argv + argc));
}

void DistFlags::keep_shape(const CLI::App& sub, const LaunchShape& shape, const std::string& run_dir) {
  if (sub.count("--distributed-world-size") || sub.count("--distributed-rank")) return;  // HetSeq names every rank
  // A node of a multi-node job names its part (and is then not the one
  // that starts the job: train.cpp's starts_job).
  const int nodes = static_cast<int>(shape.nodes.size());
  COHORT_CHECK(nodes == 1 || sub.count("--nnodes") > 0, UsageError, run_dir, " ran as ", shape.describe(),
               ": continue it with this command on each node: cohort train --resume ", run_dir, " --nnodes ", nodes,
               " --node-rank K --init-method tcp://HOST:PORT (or --nnodes 1 to go on with this node alone)");
  if (sub.count("--nproc-per-node") == 0 && launch.nnodes == nodes && launch.node_rank >= 0 &&
      launch.node_rank < nodes) {
    launch.nproc_per_node = shape.nodes[static_cast<size_t>(launch.node_rank)].ranks;
    nproc_kept_ = true;
  }
}

void DistFlags::complete(const Config& cfg, int generation) {
  comm.timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.dist.timeout * 1000));
  comm.device = cfg.train.device;
  comm.backend = cfg.dist.backend;
  comm.generation = generation;
}

}  // namespace cohort::cli
