// defines: IslandLayout, plan_islands, IslandGroups, form_island_groups
//
// dist.islands: which ranks train one model exactly together under local
// steps. The ranks of an island (a node's GPUs, say, on fast links) sum their
// gradients every step; the islands meet in the outer sync every
// dist.local-steps over the slow links between them. Flat local steps are
// islands of one rank.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace cohort {

class Comm;

struct IslandLayout {
  std::vector<std::vector<int>> islands;  // each island's global ranks, ascending; islands in rank order
  std::string how;                        // "node", "rank" or "sizes": what dist.islands resolved to

  int ranks_per_island() const { return islands.empty() ? 1 : static_cast<int>(islands.front().size()); }
  int island_of(int rank) const;
  // The global ranks that are island rank `r` of each island, in island order.
  std::vector<int> across(int r) const;
  // "2 islands of 2 ranks (one per node)".
  std::string describe() const;
};

// dist.islands (`spec`: auto, node, rank, or island sizes "2" / "2,2") over
// a world whose rank r runs on node `node_of_rank[r]`. auto: one island per
// node when there are several nodes with the same number of ranks, more
// than one each; else one per rank. Islands must have equal sizes (rank r
// of each island sums its slice of the change with its peers): ConfigError
// naming the key otherwise.
IslandLayout plan_islands(const std::string& spec, const std::vector<int>& node_of_rank);

// This rank's two groups: its island's ranks (`inside`) and the same island
// rank in every island (`across`; the world itself when islands are single
// ranks).
struct IslandGroups {
  std::unique_ptr<Comm> inside;
  std::unique_ptr<Comm> own_across;  // null when `across` is the world
  Comm* across = nullptr;
};

// Collective: every rank of `world` forms its island's group, then its
// across group.
IslandGroups form_island_groups(Comm& world, const IslandLayout& layout);

}  // namespace cohort
