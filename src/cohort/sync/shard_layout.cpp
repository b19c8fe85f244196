#include "cohort/sync/shard_layout.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <sstream>

#include "cohort/core/error.hpp"
#include "cohort/core/format.hpp"
#include "cohort/distributed/comm.hpp"

#ifdef USE_C10D_NCCL
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace cohort {

ShardLayout ShardLayout::make(std::vector<int64_t> numels, std::vector<double> weights, int replicas) {
  COHORT_CHECK(!weights.empty(), Error, "dist.shard: no ranks to shard over");
  COHORT_CHECK(replicas >= 1, ConfigError, "dist.shard-replicas must be >= 1, got ", replicas);
  for (double w : weights) COHORT_CHECK(std::isfinite(w) && w > 0, ConfigError, "dist.shard: weight ", w, " is not > 0");
  ShardLayout l;
  l.numels = std::move(numels);
  l.weights = std::move(weights);
  l.replicas = replicas;
  const int g = std::max(1, l.world() / replicas);
  std::vector<double> group_w(g, 0.0);
  for (int k = 0; k < g; ++k) {
    double w = l.weights[k];
    for (int r = k; r < l.world(); r += g) w = std::min(w, l.weights[r]);
    group_w[k] = w;
  }
  const int64_t total = std::accumulate(l.numels.begin(), l.numels.end(), int64_t{0});
  const double sum = std::accumulate(group_w.begin(), group_w.end(), 0.0);
  l.bounds.assign(g + 1, 0);
  double cum = 0;
  for (int k = 0; k < g; ++k) {
    cum += group_w[k];
    l.bounds[k + 1] = k + 1 == g ? total : std::min<int64_t>(total, std::llround(static_cast<double>(total) * cum / sum));
    l.bounds[k + 1] = std::max(l.bounds[k + 1], l.bounds[k]);
  }
  return l;
}

std::vector<int> ShardLayout::members(int group) const {
  std::vector<int> out;
  for (int r = group; r < world(); r += groups()) out.push_back(r);
  return out;
}

std::vector<int64_t> ShardLayout::starts() const {
  std::vector<int64_t> s(numels.size(), 0);
  for (size_t k = 1; k < numels.size(); ++k) s[k] = s[k - 1] + numels[k - 1];
  return s;
}

std::vector<ShardLayout::Segment> ShardLayout::segments(int64_t lo, int64_t hi) const {
  std::vector<Segment> out;
  int64_t start = 0;
  for (size_t k = 0; k < numels.size(); ++k) {
    int64_t end = start + numels[k];
    int64_t a = std::max(lo, start), b = std::min(hi, end);
    if (a < b) out.push_back({k, a - start, b - a, a - lo});
    start = end;
  }
  return out;
}

std::string ShardLayout::describe(const std::string& mode) const {
  std::ostringstream os;
  os << "dist.shard: " << mode << ", " << groups() << " range(s) x " << replicas << " replica(s) over "
     << total() << " parameters:";
  for (int g = 0; g < groups(); ++g) {
    std::vector<std::string> who;
    for (int r : members(g)) who.push_back(std::to_string(r));
    os << (g ? ";" : "") << " rank" << (who.size() > 1 ? "s " : " ") << detail::join(who, ",") << " ["
       << lo(g) << ", " << hi(g) << ") "
       << strf("%.1f%%", total() ? 100.0 * static_cast<double>(hi(g) - lo(g)) / static_cast<double>(total()) : 0.0);
  }
  return os.str();
}

namespace {

// /proc/meminfo's MemAvailable, in GiB; 0 when unreadable.
double mem_available_gib() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib / (1024.0 * 1024.0);
  }
  return 0;
}

}  // namespace

double shard_memory_weight(const DistOptions& dist, const World& world) {
  double gib = 0;
#ifdef USE_C10D_NCCL
  if (world.device.is_cuda()) {
    c10::cuda::CUDAGuard guard(world.device);
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) == cudaSuccess) gib = static_cast<double>(free) / (1u << 30);
  }
#endif
  if (gib <= 0) {
    double node = dist.max_memory_gb > 0 ? dist.max_memory_gb * 1e9 / (1u << 30) : mem_available_gib();
    gib = node / std::max(1, world.local_world_size);
  }
  return std::max(1.0 / 16, std::round(gib * 16) / 16);  // the ranks of one node agree despite noise
}

std::vector<double> agree_shard_weights(Comm& comm, const DistOptions& dist) {
  std::vector<double> given = shard_weights(dist);
  if (!given.empty()) {  // one per rank of the world (validate_world): this group's ranks'
    std::vector<double> ours;
    for (int r : comm.global_ranks()) ours.push_back(given.at(static_cast<size_t>(r)));
    return ours;
  }
  std::vector<double> mine(comm.size(), 0.0);
  mine[comm.rank()] = shard_memory_weight(dist, comm.world());
  return comm.all_reduce_sum(mine, "dist.shard-weights = auto");
}

}  // namespace cohort
