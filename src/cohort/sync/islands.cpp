#include "cohort/sync/islands.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <map>

#include "cohort/config/config.hpp"
#include "cohort/core/error.hpp"
#include "cohort/distributed/comm.hpp"

namespace cohort {

int IslandLayout::island_of(int rank) const {
  for (size_t i = 0; i < islands.size(); ++i) {
    if (std::find(islands[i].begin(), islands[i].end(), rank) != islands[i].end()) return static_cast<int>(i);
  }
  throw Error(detail::cat("islands: rank ", rank, " is in no island"));
}

int IslandLayout::width() const {
  size_t w = islands.empty() ? 1 : islands.front().size();
  for (const auto& island : islands) w = std::min(w, island.size());
  return static_cast<int>(w);
}

int IslandLayout::largest() const {
  size_t w = 1;
  for (const auto& island : islands) w = std::max(w, island.size());
  return static_cast<int>(w);
}

std::vector<int> IslandLayout::across(int r) const {
  std::vector<int> out;
  for (const auto& island : islands) out.push_back(island.at(static_cast<size_t>(r)));
  return out;
}

std::string IslandLayout::describe() const {
  std::string sizes;
  for (const auto& island : islands) sizes += detail::cat(sizes.empty() ? "" : ",", island.size());
  if (width() == largest()) sizes = std::to_string(width());
  return detail::cat(islands.size(), " island(s) of ", sizes, " rank(s)",
                     how == "node" ? " (one per node)" : how == "rank" ? " (one per rank)" : "");
}

IslandLayout plan_islands(const std::string& spec, const std::vector<int>& node_of_rank, bool elastic) {
  const int world = static_cast<int>(node_of_rank.size());
  std::map<int, std::vector<int>> by_node;
  for (int r = 0; r < world; ++r) by_node[node_of_rank[static_cast<size_t>(r)]].push_back(r);
  bool several_per_node = true;
  for (const auto& [node, ranks] : by_node) several_per_node = several_per_node && ranks.size() > 1;

  IslandLayout out;
  std::vector<int64_t> sizes = island_sizes(spec);
  out.how = !sizes.empty() ? "sizes"
            : spec == "node" || (spec == "auto" && by_node.size() > 1 && several_per_node) ? "node"
                                                                                             : "rank";
  if (out.how == "node") {
    for (auto& [node, ranks] : by_node) out.islands.push_back(ranks);
    std::sort(out.islands.begin(), out.islands.end());
    return out;
  }
  if (out.how == "rank") sizes = {1};
  if (sizes.size() == 1) {
    const int64_t s = std::max<int64_t>(1, sizes[0]);
    COHORT_CHECK(elastic || world % s == 0, ConfigError, "dist.islands '", spec, "' does not divide the world's ",
                 world, " rank(s) into islands: give sizes that add up to it, or one size that divides it");
    sizes.assign(static_cast<size_t>(world / s), s);
    if (world % s != 0 || sizes.empty()) sizes.push_back(world % s);  // elastic: what is left
  }
  int64_t sum = 0;
  for (int64_t s : sizes) sum += s;
  COHORT_CHECK(sum == world, ConfigError, "dist.islands '", spec, "' covers ", sum, " rank(s) but the world has ",
               world, ": give sizes that add up to it, or one size that divides it");
  int next = 0;
  for (int64_t s : sizes) {
    std::vector<int> island;
    for (int64_t i = 0; i < s; ++i) island.push_back(next++);
    out.islands.push_back(island);
  }
  return out;
}

IslandGroups form_island_groups(Comm& world, const IslandLayout& layout) {
  IslandGroups g;
  const int island = layout.island_of(world.rank());
  const auto& mine = layout.islands.at(static_cast<size_t>(island));
  g.inside = world.split(mine, detail::cat("island/", island));
  if (layout.largest() == 1) {
    g.across = &world;
    return g;
  }
  const int r = g.inside->rank();
  g.own_across = r < layout.width() ? world.split(layout.across(r), detail::cat("across/", r))
                                    : world.split({world.rank()}, detail::cat("alone/", world.rank()));
  g.across = g.own_across.get();
  return g;
}

}  // namespace cohort
