#include "cohort/train/lifecycle/startup.hpp"

#include <sstream>

#include "cohort/config/config.hpp"
#include "cohort/core/sha256.hpp"
#include "cohort/train/optimization/precision.hpp"

namespace cohort {

namespace {

int64_t hash60(const std::string& text) {
  return static_cast<int64_t>(std::stoull(sha256_hex(text).substr(0, 15), nullptr, 16));
}

// Ranks started with different configs would build different models and
// fail inside a collective (Gloo aborts on a size mismatch): every shared
// key is compared first, before any collective whose shape depends on the
// config.
void agree_config(Comm& comm, const std::string& config_toml) {
  if (comm.size() == 1) return;
  std::vector<std::string> keys, values;
  std::istringstream in(shared_config(config_toml));
  for (std::string line; std::getline(in, line);) {
    auto eq = line.find('=');
    keys.push_back(line.substr(0, eq));
    values.push_back(line.substr(eq + 1));
  }
  std::vector<int64_t> hashes;
  for (const auto& v : values) hashes.push_back(hash60(v));
  auto all = comm.all_gather(torch::tensor(hashes, torch::kInt64), "start-up config check");
  for (int r = 1; r < comm.size(); ++r) {
    COHORT_CHECK(all[static_cast<size_t>(r)].numel() == static_cast<int64_t>(hashes.size()), ConfigError, "rank ", r,
                 " has ", all[static_cast<size_t>(r)].numel(), " shared config keys but rank 0 has ", all[0].numel(),
                 ": are all nodes running the same cohort build?");
  }
  std::string diff;
  for (size_t i = 0; i < keys.size(); ++i) {
    std::string ranks;
    for (int r = 1; r < comm.size(); ++r) {
      if (all[static_cast<size_t>(r)][static_cast<int64_t>(i)].item<int64_t>() != all[0][static_cast<int64_t>(i)].item<int64_t>())
        ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    }
    if (!ranks.empty()) {
      diff += detail::cat(diff.empty() ? "" : "; ", keys[i], " differs between rank 0 and rank(s) ", ranks,
                          " (rank ", comm.rank(), " has ", values[i], ")");
    }
  }
  COHORT_CHECK(diff.empty(), ConfigError, "ranks were started with different configs: ", diff,
               ". Every node must give the same values, except per-node keys (docs/configuration.md: Scopes)");
}

}  // namespace

std::string shared_config_fingerprint(const std::string& config_toml) {
  return sha256_hex(shared_config(config_toml)).substr(0, 16);
}

Precision agree_startup(Comm& comm, const std::string& config_toml, Precision requested) {
  agree_config(comm, config_toml);
  const World& world = comm.world();
  Precision p = resolve_precision(requested, world.device);
  if (world.world_size > 1 && !world.device.is_cuda()) {
    double with_bf16 = comm.all_reduce_sum(std::vector<double>{p == Precision::kBf16 ? 1.0 : 0.0},
                                           "precision check")[0];
    if (requested == Precision::kAuto && with_bf16 < world.world_size) p = Precision::kFp32;
  }
  return p;
}

void agree_start_point(Comm& comm, const StartPoint& p) {
  const auto hash = static_cast<int64_t>(std::stoull(shared_config_fingerprint(p.config_toml).substr(0, 15), nullptr, 16));
  uint64_t split_hash = 0;  // each rank's own read of the checkpoint's split
  for (int64_t s : p.shares) split_hash = split_hash * 1000003 + static_cast<uint64_t>(s);
  comm.agree({p.step}, {"start step"}, "start-up",
             "Every rank continues from the newest checkpoint it finds in --out " + p.out_dir +
                 ", so on several nodes --out must be one directory on a filesystem every node shares "
                 "(or give each node the same copy with --resume)");
  comm.agree({hash, p.train_samples, p.total_steps, p.step, static_cast<int64_t>(split_hash >> 1)},
             {"config hash", "training samples", "total steps", "start step", "batch split"}, "start-up");
}

}  // namespace cohort
