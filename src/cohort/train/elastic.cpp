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
#include "cohort/train/sharded_optim.hpp"
#include "cohort/train/trainer.hpp"

namespace cohort {

namespace fs = std::filesystem;

namespace {

std::vector<std::string> described(const std::vector<Member>& members) {
  std::vector<std::string> out;
  for (const auto& m : members) out.push_back(describe_members({m}));
  return out;
}

torch::Tensor named(const NamedTensors& ts, const std::string& name) {
  for (const auto& [n, t] : ts) {
    if (n == name) return t;
  }
  throw Error("state handover: the sharded optimizer state lacks " + name);
}

// dist.shard: the survivors' ranges of the moments, each sent by its
// lowest-ranked holder in pieces, and kept by the ranks whose new range
// overlaps it. ShardsLost when the ranges held at `step` leave a gap.
std::string reshard_from_memory(Comm& comm, const Handover* held, int64_t step, ShardedOptimizer& shards) {
  const int n = comm.size();
  // Every rank takes rank 0's model: a rank 0 that ended mid-update (its
  // range of step+1, the rest of step) hands over no range either.
  std::vector<double> offers(3 * n + 1, 0.0);
  if (comm.world().is_main() && held && !held->shard.empty()) offers[3 * n] = 1;
  if (held && held->state.step == step && !held->shard.empty()) {
    auto range = named(held->shard, "range").contiguous();
    offers[3 * comm.rank()] = static_cast<double>(range.data_ptr<int64_t>()[0]);
    offers[3 * comm.rank() + 1] = static_cast<double>(range.data_ptr<int64_t>()[1]);
    offers[3 * comm.rank() + 2] = 1;
  }
  offers = comm.all_reduce_sum(offers, "sharded state handover");
  struct Held {
    int64_t lo, hi;
    int rank;
  };
  std::vector<Held> ranges;
  for (int r = 0; r < n; ++r) {
    if (offers[3 * r + 2] == 0) continue;
    Held h{static_cast<int64_t>(offers[3 * r]), static_cast<int64_t>(offers[3 * r + 1]), r};
    bool seen = false;
    for (const auto& x : ranges) seen = seen || (x.lo == h.lo && x.hi == h.hi);
    if (!seen) ranges.push_back(h);
  }
  std::sort(ranges.begin(), ranges.end(), [](const Held& a, const Held& b) { return a.lo < b.lo; });
  if (offers[3 * n] == 0) {
    throw ShardsLost("dist.shard: the new world's rank 0 was applying a step's update when the world ended, so its "
                     "model mixes two steps");
  }
  int64_t covered = 0, gap_end = -1;
  const int64_t total = shards.layout().total();
  for (const auto& h : ranges) {
    if (h.lo > covered) {
      gap_end = h.lo;
      break;
    }
    covered = std::max(covered, h.hi);
  }
  if (covered < total) {
    throw ShardsLost(strf("dist.shard: elements [%lld, %lld) of the optimizer state (of %lld) were held only by the "
                          "lost rank(s) (dist.shard-replicas = %d)", static_cast<long long>(covered),
                          static_cast<long long>(gap_end < 0 ? total : gap_end), static_cast<long long>(total),
                          shards.layout().replicas));
  }
  torch::NoGradGuard no_grad;
  constexpr int64_t kPiece = 1 << 22;  // floats per broadcast: what a rank holds beyond its range
  for (const auto& h : ranges) {
    const bool mine = h.rank == comm.rank();
    for (int64_t at = h.lo; at < h.hi; at += kPiece) {
      int64_t len = std::min(kPiece, h.hi - at);
      torch::Tensor m, v;
      if (mine) {
        m = named(held->shard, "exp_avg").narrow(0, at - h.lo, len).clone();
        v = named(held->shard, "exp_avg_sq").narrow(0, at - h.lo, len).clone();
      } else {
        m = torch::empty({len}, shards.state_options());
        v = torch::empty({len}, shards.state_options());
      }
      comm.broadcast(m, h.rank, "sharded state handover");
      comm.broadcast(v, h.rank, "sharded state handover");
      shards.take(at, m, v);
    }
  }
  torch::Tensor steps = ranges.front().rank == comm.rank() ? named(held->shard, "steps").clone()
                                                           : torch::empty({static_cast<int64_t>(shards.layout().numels.size())}, torch::kInt64);
  comm.broadcast(steps, ranges.front().rank, "sharded state handover");
  shards.set_steps(steps);
  return strf("dist.shard: re-sharded the optimizer state in memory from %zu surviving range(s) into %d",
              ranges.size(), shards.layout().groups());
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

std::shared_ptr<Handover> capture_handover(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
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
  torch::save(optimizer, os);
  h->optimizer = os.str();
  if (auto* shards = dynamic_cast<ShardedOptimizer*>(&optimizer); shards && shards->consistent()) {
    for (auto& [name, t] : shards->range_state()) h->shard.emplace_back(name, t.clone());
  }
  if (state.scaler.enabled()) h->scaler = state.scaler.state().clone();
  return h;
}

bool adopt_handover(Comm& comm, const Handover* held, torch::nn::Module& module, torch::optim::Optimizer& optimizer,
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
  torch::load(optimizer, opt_in, comm.world().device);  // saved where rank 0's parameters were
  if (got.scaler.defined()) state.scaler.restore(got.scaler);
  if (auto* shards = dynamic_cast<ShardedOptimizer*>(&optimizer)) {
    notes.push_back(reshard_from_memory(comm, held, got.state.step, *shards));
  }
  for (const std::string& note : {replicas.start_new_world(got.outer_momentum), held ? held->note : std::string()}) {
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
