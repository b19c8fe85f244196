// defines: LaunchOptions, launch_node
//
// One command per node. The launcher resolves this node's global ranks
// (contiguous ranges in node-rank order, or HetSeq's explicit first rank),
// hosts the rendezvous store on node 0, starts one worker per local rank by
// re-executing this binary with COHORT_* variables, and supervises them:
// SIGINT/SIGTERM are forwarded (workers checkpoint and stop); when a worker
// exits non-zero or is killed the others are killed at once (their state is
// in the last checkpoint) and either all are restarted from it, up to
// max_restarts times, or the launcher exits non-zero naming the rank and the
// cause. The restart generation is the job's, kept in the store: a node
// whose ranks failed moves it on, and every other node's launcher sees that
// within a second and restarts its ranks into the same generation, so nodes
// that failed a different number of times still meet. Workers die with the
// launcher (PR_SET_PDEATHSIG), so nothing is left behind, and a stop signal
// is honoured at every stage: while nodes meet, while workers start, and
// while they run.
#pragma once

#include <string>
#include <vector>

namespace cohort {

struct LaunchOptions {
  int nproc_per_node = 1;    // ranks on this node
  int nnodes = 1;
  int node_rank = 0;
  std::string init_method;   // "" on one node: a private store on 127.0.0.1
  int world_size = 0;        // HetSeq --distributed-world-size; 0: sum over nodes
  int first_rank = -1;       // HetSeq --distributed-rank: first global rank here
  double timeout_s = 300;    // rendezvous of the nodes
  double stop_grace_s = 300;  // after SIGINT/SIGTERM: time to checkpoint before SIGKILL
  int max_restarts = 0;       // restarts of the job (all nodes) from the latest checkpoint when a rank dies
  int max_local_ranks = 0;    // more than this is refused unless oversubscribe (cores, or GPUs); 0: no limit
  std::string local_units = "cores";  // what max_local_ranks counts, for the message
  bool oversubscribe = false;
  // Elastic (min_nodes > 0): the workers form their world themselves
  // (distributed/membership.hpp) and go on while min_nodes remain; a node
  // whose rank fails leaves the job and, with restarts left, joins again.
  int min_nodes = 0;
  int max_nodes = 0;          // 0: no limit
};

// Checks the flags' ranges and the form of the init method (a single
// process too, where it goes unused); throws UsageError naming the flag and
// its value. launch_node calls it again.
void validate(const LaunchOptions& opts);

// True when these options ask for a launcher rather than a single process.
bool wants_launcher(const LaunchOptions& opts);

// Runs this node's workers to completion; returns the exit code for main.
// Throws UsageError/DistError before any worker starts.
int launch_node(const LaunchOptions& opts, const std::vector<std::string>& argv);

}  // namespace cohort
