#include "cohort/train/lifecycle/train_state.hpp"

#include <filesystem>
#include <mutex>
#include <sstream>

#include <torch/serialize.h>

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

TrainState::Snapshot TrainState::capture(Comm& comm, int64_t train_samples, const SyncState& sync) const {
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
  for (const auto& [name, t] : sync.shared) s.rng.emplace_back("sync." + name, t.contiguous());
  for (const auto& [name, t] : sync.own) {
    auto all = comm.all_gather(t.reshape({-1}).contiguous(), "checkpoint sync-state gather");
    for (size_t r = 0; r < all.size(); ++r) s.rng.emplace_back("rank." + std::to_string(r) + ".sync." + name, all[r]);
  }
  return s;
}

SavedSync read_sync_state(const ResolvedCheckpoint& from) {
  auto file = load_safetensors(from.file("rng.safetensors"));
  SavedSync saved;
  saved.by_rank.resize(static_cast<size_t>(from.state.world_size));
  const std::string shared = "sync.";
  for (auto& [name, t] : file.tensors) {
    if (name.rfind(shared, 0) == 0) {
      saved.shared.emplace_back(name.substr(shared.size()), t);
      continue;
    }
    auto dot = name.find(".sync.");
    if (name.rfind("rank.", 0) != 0 || dot == std::string::npos) continue;
    int r = std::stoi(name.substr(5, dot - 5));
    COHORT_CHECK(r >= 0 && r < from.state.world_size, DataError, from.dir, "/rng.safetensors: ", name,
                 " names a rank outside the checkpoint's ", from.state.world_size);
    saved.by_rank[static_cast<size_t>(r)].emplace_back(name.substr(dot + 6), t);
  }
  return saved;
}

void TrainState::restore(const ResolvedCheckpoint& from, const World& world) {
  step = from.state.step;
  cursor = from.state.cursor;
  samples_seen = from.state.samples_seen;
  balance_shares = from.state.balance_shares;
  auto rng = load_safetensors(from.file("rng.safetensors"));
  if (auto ls = rng.tensors.find("loss_scaler"); ls != rng.tensors.end()) scaler.restore(ls->second);
  if (from.state.world_size != world.world_size) return;
  auto it = rng.tensors.find("rank." + std::to_string(world.rank));
  COHORT_CHECK(it != rng.tensors.end(), DataError, from.dir, "/rng.safetensors lacks rank.", world.rank);
  set_cpu_rng_state(it->second);
}

std::string encode_handover(const Handover& h) {
  torch::serialize::OutputArchive a;
  const CheckpointState& s = h.state;
  a.write("state", torch::tensor({s.step, s.cursor.epoch, s.cursor.consumed, s.samples_seen,
                                  static_cast<int64_t>(s.world_size)}, torch::kInt64));
  a.write("optimizer", torch::from_blob(const_cast<char*>(h.optimizer.data()),
                                        {static_cast<int64_t>(h.optimizer.size())}, torch::kUInt8));
  if (h.scaler.defined()) a.write("scaler", h.scaler);
  if (h.outer_momentum.defined()) a.write("outer_momentum", h.outer_momentum);
  std::ostringstream os;
  a.save_to(os);
  return os.str();
}

Handover decode_handover(const std::string& blob) {
  torch::serialize::InputArchive a;
  a.load_from(blob.data(), blob.size(), torch::Device(torch::kCPU));  // each rank moves what it takes
  torch::Tensor fields, opt;
  Handover h;
  a.read("state", fields);
  a.read("optimizer", opt);
  COHORT_CHECK(fields.numel() == 5 && fields.scalar_type() == torch::kInt64, Error,
               "state handover: unreadable state record (", fields.numel(), " fields)");
  h.optimizer.assign(static_cast<const char*>(opt.data_ptr()), static_cast<size_t>(opt.numel()));
  a.try_read("scaler", h.scaler);
  a.try_read("outer_momentum", h.outer_momentum);
  auto f = fields.data_ptr<int64_t>();
  h.state.step = f[0];
  h.state.cursor = {f[1], f[2]};
  h.state.samples_seen = f[3];
  h.state.world_size = static_cast<int>(f[4]);
  return h;
}

}  // namespace cohort
