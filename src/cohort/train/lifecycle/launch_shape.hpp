// defines: LaunchShape
//
// How a run was launched: the ranks on each node and the intra-op threads
// of each node's ranks. The step's bits depend on both (how a global batch
// is dealt, how oneDNN blocks its reductions), so `train --resume RUN`
// launches the recorded shape unless flags name another one, and a resume
// at another shape says so in one line. Recorded as RUN/launch.json by
// rank 0 at every start of a fixed (not elastic) world.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cohort/distributed/comm.hpp"

namespace cohort {

struct LaunchShape {
  struct Node {
    int ranks = 1;
    int threads = 1;  // per rank
    bool operator==(const Node& o) const { return ranks == o.ranks && threads == o.threads; }
  };
  std::vector<Node> nodes;  // in node-rank order

  // A collective: every rank's node, and its threads as set now.
  static LaunchShape gather(Comm& comm);
  // RUN/launch.json; nullopt when absent (a run from before it was
  // recorded, or an elastic one). DataError naming the file when malformed.
  static std::optional<LaunchShape> read(const std::string& run_dir);
  void write(const std::string& run_dir) const;

  int world_size() const;
  // The threads recorded for `world`'s node, when that node has as many
  // ranks in as large a world as recorded; nullopt otherwise.
  std::optional<int> threads_for(const World& world) const;
  // "2 rank(s), 1 thread(s) each" / "3 rank(s) on 2 nodes (2+1), 1 thread(s) each".
  std::string describe() const;
  bool operator==(const LaunchShape& o) const { return nodes == o.nodes; }
};

// The note for a resume whose shape differs from the recorded one; "" when
// it is the same (or none was recorded).
std::string shape_change_note(const std::optional<LaunchShape>& recorded, const LaunchShape& now);

}  // namespace cohort
