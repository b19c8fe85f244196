#include "cohort/train/lifecycle/launch_shape.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>

#include "cohort/core/error.hpp"
#include "cohort/core/files.hpp"
#include "cohort/core/format.hpp"

namespace cohort {

namespace fs = std::filesystem;

namespace {

std::string file_of(const std::string& run_dir) { return (fs::path(run_dir) / "launch.json").string(); }

}  // namespace

LaunchShape LaunchShape::gather(Comm& comm) {
  const World& w = comm.world();
  torch::Tensor mine = torch::tensor({int64_t{w.node_rank}, int64_t{w.local_rank}, int64_t{w.local_world_size},
                                      int64_t{torch::get_num_threads()}}, torch::kInt64);
  std::vector<torch::Tensor> all = comm.size() > 1 ? comm.all_gather(mine, "launch shape") : std::vector{mine};
  LaunchShape shape;
  for (const auto& t : all) {
    auto node = static_cast<size_t>(t[0].item<int64_t>());
    if (t[1].item<int64_t>() != 0) continue;  // a node is its local rank 0's
    if (shape.nodes.size() <= node) shape.nodes.resize(node + 1);
    shape.nodes[node] = Node{static_cast<int>(t[2].item<int64_t>()), static_cast<int>(t[3].item<int64_t>())};
  }
  return shape;
}

std::optional<LaunchShape> LaunchShape::read(const std::string& run_dir) {
  const std::string file = file_of(run_dir);
  if (!fs::exists(file)) return std::nullopt;
  LaunchShape shape;
  try {
    auto j = nlohmann::json::parse(read_file(file));
    for (const auto& n : j.at("nodes")) shape.nodes.push_back(Node{n.at("ranks").get<int>(), n.at("threads").get<int>()});
  } catch (const nlohmann::json::exception& e) {
    throw DataError(detail::cat(file, ": not a launch record (", e.what(), "); remove it to resume at the flags' shape"));
  }
  COHORT_CHECK(!shape.nodes.empty(), DataError, file, ": no nodes; remove it to resume at the flags' shape");
  for (const auto& n : shape.nodes) {
    COHORT_CHECK(n.ranks >= 1 && n.threads >= 1, DataError, file, ": a node with ", n.ranks, " rank(s) of ", n.threads,
                 " thread(s); remove it to resume at the flags' shape");
  }
  return shape;
}

void LaunchShape::write(const std::string& run_dir) const {
  nlohmann::json j;
  j["nodes"] = nlohmann::json::array();
  for (const auto& n : nodes) j["nodes"].push_back({{"ranks", n.ranks}, {"threads", n.threads}});
  write_file_atomically(file_of(run_dir), j.dump(2) + "\n");
}

int LaunchShape::world_size() const {
  int n = 0;
  for (const auto& node : nodes) n += node.ranks;
  return n;
}

std::optional<int> LaunchShape::threads_for(const World& world) const {
  if (world.world_size != world_size() || static_cast<size_t>(world.node_rank) >= nodes.size()) return std::nullopt;
  const Node& node = nodes[static_cast<size_t>(world.node_rank)];
  if (node.ranks != world.local_world_size) return std::nullopt;
  return node.threads;
}

std::string LaunchShape::describe() const {
  std::string text = strf("%d rank(s)", world_size());
  if (nodes.size() > 1) {
    std::string split;
    for (const auto& n : nodes) split += (split.empty() ? "" : "+") + std::to_string(n.ranks);
    text += strf(" on %zu nodes (%s)", nodes.size(), split.c_str());
  }
  bool same = true;
  for (const auto& n : nodes) same = same && n.threads == nodes[0].threads;
  if (same) return text + strf(", %d thread(s) each", nodes.empty() ? 0 : nodes[0].threads);
  std::string per_node;
  for (const auto& n : nodes) per_node += (per_node.empty() ? "" : "/") + std::to_string(n.threads);
  return text + ", " + per_node + " thread(s) per rank by node";
}

std::string shape_change_note(const std::optional<LaunchShape>& recorded, const LaunchShape& now) {
  if (!recorded || *recorded == now) return "";
  return "launch shape changed on resume: was " + recorded->describe() + ", now " + now.describe() +
         ": every sample is still used once per epoch, but the steps are no longer bit-identical to an "
         "uninterrupted run (a resume without --nproc-per-node, --nnodes or --train.threads keeps the shape)";
}

}  // namespace cohort
