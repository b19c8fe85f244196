// defines: IslandLayout, plan_islands, IslandGroups, form_island_groups
//
// dist.islands: which ranks train one model exactly together under local
// steps. The ranks of an island (a node's GPUs, say, on fast links) sum their
// gradients every step; the islands meet in the outer sync every
// dist.local-steps over the slow links between them. Flat local steps are
// islands of one rank. Islands may differ in size (a box of 4 GPUs beside
// one of 2, or an island that lost a rank): the change is cut into as many
// slices as the smallest island has ranks, and island rank r < that width
// sums slice r with the same island rank elsewhere; the others send nothing
// between islands.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace cohort {

class Comm;

struct IslandLayout {
  std::vector<std::vector<int>> islands;  // each island's global ranks, ascending; islands in rank order
  std::string how;                        // "node", "rank" or "sizes": what dist.islands resolved to

  // The smallest island's ranks: the slices the change is summed in.
  int width() const;
  // The largest island's ranks (1: flat local steps).
  int largest() const;
  int island_of(int rank) const;
  // The global ranks that are island rank `r` (< width()) of each island, in
  // island order.
  std::vector<int> across(int r) const;
  // "2 island(s) of 2 rank(s) (one per node)", or "of 2,1 rank(s)".
  std::string describe() const;
};

// dist.islands (`spec`: auto, node, rank, or island sizes "2" / "2,1") over
// a world whose rank r runs on node `node_of_rank[r]`. auto: one island per
// node when there are several nodes of more than one rank each; else one per
// rank. One size must divide the world; in an `elastic` world, whose size
// changes, the last island holds what is left. A list must add up to the
// world: ConfigError naming the key otherwise.
IslandLayout plan_islands(const std::string& spec, const std::vector<int>& node_of_rank, bool elastic = false);

// This rank's two groups: its island's ranks (`inside`) and the same island
// rank in every island (`across`; the world itself when islands are single
// ranks, a group of this rank alone when its island rank is beyond the
// smallest island's).
struct IslandGroups {
  std::unique_ptr<Comm> inside;
  std::unique_ptr<Comm> own_across;  // null when `across` is the world
  Comm* across = nullptr;
};

// Collective: every rank of `world` forms its island's group, then its
// across group.
IslandGroups form_island_groups(Comm& world, const IslandLayout& layout);

}  // namespace cohort
