#include "cohort/train/lifecycle/handover.hpp"

#include <chrono>
#include <map>
#include <sstream>

#include <torch/serialize.h>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/core/clock.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/format.hpp"
#include "cohort/data/order.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/obs/reporter.hpp"
#include "cohort/sync/grad_sync.hpp"
#include "cohort/train/lifecycle/run_dir.hpp"

namespace cohort {

std::shared_ptr<Handover> capture_handover(torch::nn::Module& module, StepOptimizer& optimizer,
                                           const TrainState& state, const std::vector<const StatePart*>& parts,
                                           int world_size, int64_t train_samples) {
  auto h = std::make_shared<Handover>();
  h->state.step = state.step;
  h->state.cursor = state.cursor;
  h->state.samples_seen = state.samples_seen;
  h->state.world_size = world_size;
  h->state.train_samples = train_samples;
  h->state.balance_shares = state.balance_shares;
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : module_tensors(module)) h->model.emplace_back(name, t.detach().clone());
  std::ostringstream os;
  torch::save(optimizer.optimizer(), os);
  h->optimizer = os.str();
  h->shard = optimizer.held_ranges();
  for (const StatePart* part : parts) {
    PartState& kept = h->parts[part->state_name()];
    PartState now = part->capture();
    for (const auto& [name, t] : now.shared) kept.shared.emplace_back(name, t.detach().clone());
    for (const auto& [name, t] : now.own) kept.own.emplace_back(name, t.detach().clone());
  }
  return h;
}

bool adopt_handover(Comm& comm, const Handover* held, torch::nn::Module& module, StepOptimizer& optimizer,
                    const std::vector<StatePart*>& parts, TrainState& state, std::vector<std::string>& notes) {
  const bool main_holds = comm.world().is_main() && held;
  if (comm.all_reduce_sum(std::vector<double>{main_holds ? 1.0 : 0.0}, "state handover")[0] == 0) return false;
  torch::NoGradGuard no_grad;
  std::string blob;
  if (main_holds) {
    std::map<std::string, torch::Tensor> by_name(held->model.begin(), held->model.end());
    for (auto& [name, t] : module_tensors(module)) {
      auto it = by_name.find(name);
      COHORT_CHECK(it != by_name.end() && it->second.sizes() == t.sizes(), Error,
                   "state handover: the previous world's model lacks ", name);
      t.copy_(it->second);
    }
    blob = encode_handover(*held);
  }
  broadcast_module(comm, module);
  comm.broadcast_bytes(blob, 0, "state handover");
  Handover got = decode_handover(blob);
  std::istringstream opt_in(got.optimizer);
  torch::load(optimizer.optimizer(), opt_in, comm.world().device);  // saved where rank 0's parameters were
  std::vector<std::string> said = {optimizer.adopt_ranges(comm, held, got.state.step)};
  const bool same_step = held && held->state.step == got.state.step;  // this process held the state handed on
  for (StatePart* part : parts) {
    PartState handed;
    if (auto it = got.parts.find(part->state_name()); it != got.parts.end()) handed.shared = it->second.shared;
    if (same_step) {
      if (auto it = held->parts.find(part->state_name()); it != held->parts.end()) handed.own = it->second.own;
    }
    said.push_back(part->adopt(handed));
  }
  if (held) said.push_back(held->note);
  for (const std::string& note : said) {
    if (!note.empty()) notes.push_back(note);
  }
  state.step = got.state.step;
  state.cursor = got.state.cursor;
  state.samples_seen = got.state.samples_seen;
  state.balance_shares.clear();
  // A survivor goes on with its own stream, as it stood after that step.
  if (held && held->state.step == state.step && held->rng.defined()) set_cpu_rng_state(held->rng);
  return true;
}

void rewind_to_sync(Handover& h, const SyncMark& mark, int64_t reached) {
  h.state.step = mark.step;
  h.state.cursor = mark.cursor;
  h.state.samples_seen = mark.samples_seen;
  h.rng = mark.rng.clone();
  h.step_cursor = mark.step_cursor;
  h.train_line = mark.line;
  h.interval = mark.interval;
  if (reached == mark.step) return;
  h.note = strf("local sync: the world changed at step %lld; going on from the last sync, step %lld (steps "
                "%lld..%lld are trained again, with rank 0's inner optimizer state)",
                static_cast<long long>(reached), static_cast<long long>(mark.step),
                static_cast<long long>(mark.step + 1), static_cast<long long>(reached));
}

std::string complete_sample_ids(const std::string& run_dir, const Handover& held, int64_t step,
                                const GlobalOrder& order, int rank) {
  if (held.state.step != step || step == 0 || held.step_cursor.consumed < 0) return "";
  const Cursor c = held.step_cursor;
  auto perm = order.permutation(c.epoch);
  std::vector<int64_t> ids(perm->begin() + c.consumed, perm->begin() + c.consumed + order.batch_size_at(c));
  size_t n = RunDir(run_dir).complete_sample_ids(step, c.epoch, ids, rank);
  if (n == 0) return "";
  return strf("elastic: logged %zu sample id(s) of step %lld for the member(s) lost after it", n,
              static_cast<long long>(step));
}

std::string write_held_train_line(const Handover& held, const RunDir& dir, Reporter& reporter) {
  if (!held.train_line || dir.has_train_line(held.state.step)) return "";
  reporter.train(*held.train_line);
  return strf("elastic: logged step %lld's train line for the world that took it",
              static_cast<long long>(held.state.step));
}

void report_world_change(std::optional<MembershipReport>& change, Reporter& reporter) {
  if (!change) return;
  MembershipReport r = *change;
  change.reset();
  r.recovery_s = seconds_since(r.noticed);
  r.unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::system_clock::now().time_since_epoch()).count();
  reporter.membership(r);
}

}  // namespace cohort
