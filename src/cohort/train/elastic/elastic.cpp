#include "cohort/train/elastic/elastic.hpp"

#include <cstdio>
#include <filesystem>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/format.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/distributed/membership.hpp"
#include "cohort/train/lifecycle/run_dir.hpp"
#include "cohort/train/loop/phase_timer.hpp"
#include "cohort/train/loop/trainer.hpp"
#include "cohort/train/optimization/step_optimizer.hpp"

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
  COHORT_CHECK(cfg.dist.sync != SyncMode::kLocal || island_sizes(cfg.dist.islands).size() < 2, ConfigError,
               "dist.islands '", cfg.dist.islands, "' lists the islands' sizes, but an elastic world's ranks change; "
               "give one size (the last island holds what is left), node or auto with --min-nodes");
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

}  // namespace cohort
