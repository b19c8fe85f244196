#include "cohort/train/train_state.hpp"

#include <filesystem>
#include <mutex>

#include "cohort/core/error.hpp"
#include "cohort/distributed/comm.hpp"

namespace cohort {

torch::Tensor cpu_rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_cpu_rng_state(const torch::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state.to(torch::kUInt8));
}

TrainState::Snapshot TrainState::capture(Comm& comm, int64_t train_samples) const {
  torch::Tensor mine = cpu_rng_state().to(torch::kInt64);
  auto states = comm.all_gather(mine, "checkpoint RNG gather");
  Snapshot s;
  s.state.step = step;
  s.state.cursor = cursor;
  s.state.samples_seen = samples_seen;
  s.state.world_size = comm.size();
  s.state.train_samples = train_samples;
  s.state.balance_shares = balance_shares;
  for (size_t r = 0; r < states.size(); ++r) s.rng.emplace_back("rank." + std::to_string(r), states[r].to(torch::kUInt8));
  if (scaler.enabled()) s.rng.emplace_back("loss_scaler", scaler.state());
  return s;
}

void TrainState::restore(const ResolvedCheckpoint& from, const World& world) {
  step = from.state.step;
  cursor = from.state.cursor;
  samples_seen = from.state.samples_seen;
  balance_shares = from.state.balance_shares;
  auto rng = load_safetensors((std::filesystem::path(from.dir) / "rng.safetensors").string());
  if (auto ls = rng.tensors.find("loss_scaler"); ls != rng.tensors.end()) scaler.restore(ls->second);
  if (from.state.world_size != world.world_size) return;
  auto it = rng.tensors.find("rank." + std::to_string(world.rank));
  COHORT_CHECK(it != rng.tensors.end(), DataError, from.dir, "/rng.safetensors lacks rank.", world.rank);
  set_cpu_rng_state(it->second);
}

}  // namespace cohort
