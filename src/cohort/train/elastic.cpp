#include "cohort/train/elastic.hpp"

#include <cstdio>
#include <filesystem>
#include <algorithm>
#include <map>
#include <sstream>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/format.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/distributed/grad_sync.hpp"
#include "cohort/data/order.hpp"
#include "cohort/distributed/membership.hpp"
#include "cohort/train/phase_timer.hpp"
#include "cohort/train/run_dir.hpp"
#include "cohort/train/trainer.hpp"

namespace cohort {

namespace fs = std::filesystem;

namespace {

std::vector<std::string> described(const std::vector<Member>& members) {
  std::vector<std::string> out;
  for (const auto& m : members) out.push_back(describe_members({m}));
  return out;
}

// The world cannot go on from memory (`why`): from the run's latest
// checkpoint, or, with none, from the start as planned, over what the
// earlier worlds wrote.
void go_on_without_memory(RunOptions& r, const std::string& why) {
  std::string state = "start";
  int64_t step = 0;
  if (fs::exists(fs::path(r.out_dir) / "checkpoints" / "latest")) {
    std::vector<std::string> warnings;
    r.start = StartFromCheckpoint{Checkpoints::resolve(r.out_dir, &warnings)};
    for (auto& w : warnings) r.notes.push_back("warning: " + w);
    r.notes.push_back("elastic: " + why + "; continuing from " + r.checkpoint()->dir);
    state = "checkpoint";
    step = r.checkpoint()->state.step;
  } else {
    r.notes.push_back("elastic: " + why + " and the run has no checkpoint; starting as planned");
    if (r.checkpoint()) {
      state = "checkpoint";
      step = r.checkpoint()->state.step;
    } else {
      r.start = StartFresh{/*overwrite=*/true};
    }
  }
  if (r.membership) {
    r.membership->state = state;
    r.membership->step = step;
  }
}

}  // namespace

RunSummary train_elastic(const Config& cfg, Membership& membership, const RunOptions& run,
                         const std::function<void(const World&, RunOptions&)>& per_world) {
  std::shared_ptr<const Handover> held;  // this process's state from the world that ended
  auto noticed = std::chrono::steady_clock::now();
  std::string cause;
  COHORT_CHECK(cfg.data.balance != Balance::kWeights, ConfigError,
               "data.balance = weights gives one weight per rank, but an elastic world's ranks change; use auto "
               "(measured speeds) or equal with --min-nodes");
  COHORT_CHECK(cfg.dist.shard == ShardMode::kNone || shard_weights(cfg.dist).empty(), ConfigError,
               "dist.shard-weights '", cfg.dist.shard_weights, "' gives one weight per rank, but an elastic world's "
               "ranks change; use auto (each rank's free memory) with --min-nodes");
  bool started = false;  // a trainer ran in this process
  for (;;) {
    std::unique_ptr<Comm> comm;
    try {
      comm = membership.next_world(held ? held->state.step : -1);
    } catch (const MembershipChanged& e) {  // a member was lost while the group formed
      cause = e.what();
      noticed = std::chrono::steady_clock::now();
      continue;
    }
    if (!comm) {
      std::fprintf(stderr, "cohort: the job finished before this process could join it\n");
      return {};
    }
    const WorldChange& change = membership.last_change();
    RunOptions r = run;
    if (started || change.generation > 0) {
      MembershipReport m;
      m.generation = change.generation;
      m.world_size = comm->size();
      m.nodes = change.nodes;
      m.left = described(change.left);
      m.joined = described(change.joined);
      m.cause = cause.empty() ? change.cause : cause;
      m.formed_s = change.seconds;
      m.noticed = noticed;
      r.notes.clear();
      if (change.state_survived) {
        r.start = StartFromPeers{held};  // rank 0's memory: no checkpoint is read
        m.state = "memory";
        m.step = change.members[0].step;
        r.membership = m;
      } else {
        r.membership = m;
        go_on_without_memory(r, "no member of the previous world survived with its state");
      }
    }
    per_world(comm->world(), r);
    try {
      std::unique_ptr<Trainer> trainer;
      try {
        trainer = std::make_unique<Trainer>(cfg, *comm, r);
      } catch (const ShardsLost& e) {  // every rank: the survivors' ranges were pooled
        go_on_without_memory(r, e.what());
        trainer = std::make_unique<Trainer>(cfg, *comm, r);
      }
      started = true;
      try {
        RunSummary done = trainer->run();
        membership.finish();
        return done;
      } catch (const MembershipChanged& e) {
        held = trainer->handover();
        cause = e.what();
      }
    } catch (const MembershipChanged& e) {
      // While the new world was starting: the state held before still stands.
      cause = e.what();
    }
    noticed = std::chrono::steady_clock::now();
    std::fprintf(stderr, "cohort: %s; forming a new world (holding step %lld)\n", cause.c_str(),
                 static_cast<long long>(held ? held->state.step : -1));
  }
}

std::shared_ptr<Handover> capture_handover(torch::nn::Module& module, StepOptimizer& optimizer,
                                           const TrainState& state, int world_size, int64_t train_samples) {
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
  if (state.scaler.enabled()) h->scaler = state.scaler.state().clone();
  return h;
}

bool adopt_handover(Comm& comm, const Handover* held, torch::nn::Module& module, StepOptimizer& optimizer,
                    ReplicaSync& replicas, TrainState& state, std::vector<std::string>& notes) {
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
  if (got.scaler.defined()) state.scaler.restore(got.scaler);
  for (const std::string& note : {optimizer.adopt_ranges(comm, held, got.state.step),
                                  replicas.start_new_world(got.outer_momentum), held ? held->note : std::string()}) {
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

void rewind_to_sync(Handover& h, const SyncMark& mark, int64_t reached, const torch::Tensor& outer_momentum) {
  h.state.step = mark.step;
  h.state.cursor = mark.cursor;
  h.state.samples_seen = mark.samples_seen;
  h.rng = mark.rng.clone();
  h.step_cursor = mark.step_cursor;
  h.train_line = mark.line;
  h.interval = mark.interval;
  h.outer_momentum = outer_momentum;
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
