#include "cohort/train/lifecycle/train_state.hpp"

#include <filesystem>
#include <mutex>
#include <sstream>

#include <torch/serialize.h>

#include "cohort/core/error.hpp"
#include "cohort/core/format.hpp"
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

TrainState::Snapshot TrainState::capture(Comm& comm, int64_t train_samples,
                                         const std::vector<const StatePart*>& parts) const {
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
  for (const StatePart* part : parts) {
    const std::string name = part->state_name();
    PartState p = part->capture();
    for (const auto& [tensor, t] : p.shared) s.rng.emplace_back(part_tensor_name(name, tensor), t.contiguous());
    for (const auto& [tensor, t] : p.own) {
      // Only the main rank writes the checkpoint: the others' state goes to
      // it alone (over a slow link, once and not to every rank).
      auto all = comm.gather(t.reshape({-1}).contiguous(), 0, "checkpoint state gather");
      for (size_t r = 0; r < all.size(); ++r) {
        s.rng.emplace_back("rank." + std::to_string(r) + "." + part_tensor_name(name, tensor), all[r]);
      }
    }
  }
  return s;
}

std::vector<std::string> TrainState::restore(const ResolvedCheckpoint& from, const World& world,
                                             const std::vector<StatePart*>& parts) {
  step = from.state.step;
  cursor = from.state.cursor;
  samples_seen = from.state.samples_seen;
  balance_shares = from.state.balance_shares;
  const std::string file = from.file("rng.safetensors");
  auto rng = load_safetensors(file);
  if (from.state.world_size == world.world_size) {
    auto it = rng.tensors.find("rank." + std::to_string(world.rank));
    COHORT_CHECK(it != rng.tensors.end(), DataError, from.dir, "/rng.safetensors lacks rank.", world.rank);
    set_cpu_rng_state(it->second);
  }
  std::vector<std::string> notes;
  for (StatePart* part : parts) {
    SavedPart saved = read_saved_part(rng.tensors, part->state_name(), from.state.world_size,
                                      from.dir + "/rng.safetensors");
    for (auto& note : part->restore(saved)) notes.push_back(std::move(note));
  }
  return notes;
}

namespace {

torch::Tensor bytes_tensor(const std::string& s) {
  return torch::from_blob(const_cast<char*>(s.data()), {static_cast<int64_t>(s.size())}, torch::kUInt8).clone();
}

std::string bytes_string(const torch::Tensor& t) {
  auto c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.numel()));
}

}  // namespace

std::string encode_handover(const Handover& h) {
  torch::serialize::OutputArchive a;
  const CheckpointState& s = h.state;
  a.write("state", torch::tensor({s.step, s.cursor.epoch, s.cursor.consumed, s.samples_seen,
                                  static_cast<int64_t>(s.world_size)}, torch::kInt64));
  a.write("optimizer", torch::from_blob(const_cast<char*>(h.optimizer.data()),
                                        {static_cast<int64_t>(h.optimizer.size())}, torch::kUInt8));
  // The parts' shared tensors: "partI" names the part and its tensors (a
  // line each: archive keys take no dots), "partI_J" is tensor J.
  int64_t i = 0;
  for (const auto& [name, state] : h.parts) {
    std::string names = name + "\n";
    for (const auto& [tensor, t] : state.shared) names += tensor + "\n";  // a tensor's name may be ""
    a.write(strf("part%lld", static_cast<long long>(i)), bytes_tensor(names));
    int64_t j = 0;
    for (const auto& [tensor, t] : state.shared) a.write(strf("part%lld_%lld", static_cast<long long>(i), static_cast<long long>(j++)), t);
    ++i;
  }
  a.write("parts", torch::tensor({i}, torch::kInt64));
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
  torch::Tensor parts;
  a.read("parts", parts);
  for (int64_t i = 0; i < parts.item<int64_t>(); ++i) {
    torch::Tensor names_bytes;
    a.read(strf("part%lld", static_cast<long long>(i)), names_bytes);
    std::vector<std::string> names;
    std::istringstream lines(bytes_string(names_bytes));
    for (std::string line; std::getline(lines, line);) names.push_back(line);
    COHORT_CHECK(!names.empty(), Error, "state handover: part ", i, " has no name");
    PartState& state = h.parts[names[0]];
    for (size_t j = 1; j < names.size(); ++j) {
      torch::Tensor t;
      a.read(strf("part%lld_%lld", static_cast<long long>(i), static_cast<long long>(j - 1)), t);
      state.shared.emplace_back(names[j], t);
    }
  }
  auto f = fields.data_ptr<int64_t>();
  h.state.step = f[0];
  h.state.cursor = {f[1], f[2]};
  h.state.samples_seen = f[3];
  h.state.world_size = static_cast<int>(f[4]);
  return h;
}

}  // namespace cohort
