#include "cohort/train/elastic.hpp"

#include <cstdio>
#include <filesystem>

#include "cohort/core/error.hpp"
#include "cohort/distributed/membership.hpp"
#include "cohort/train/trainer.hpp"

namespace cohort {

namespace fs = std::filesystem;

namespace {

std::vector<std::string> described(const std::vector<Member>& members) {
  std::vector<std::string> out;
  for (const auto& m : members) out.push_back(describe_members({m}));
  return out;
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
        r.handover = held;
        // Rank 0's memory: no checkpoint is read.
        r.resume.reset();
        r.overwrite = false;
        r.from_peers = true;
        m.state = "memory";
        m.step = change.members[0].step;
      } else if (fs::exists(fs::path(r.out_dir) / "checkpoints" / "latest")) {
        std::vector<std::string> warnings;
        r.resume = Checkpoints::resolve(r.out_dir, &warnings);
        for (auto& w : warnings) r.notes.push_back("warning: " + w);
        r.notes.push_back("elastic: no member of the previous world survived with its state; continuing from " +
                          r.resume->dir);
        m.state = "checkpoint";
        m.step = r.resume->state.step;
      } else {
        // Nothing survived and nothing was saved: the start as planned,
        // over what the earlier worlds wrote.
        r.notes.push_back("elastic: no member of the previous world survived with its state and the run has no "
                          "checkpoint; starting as planned");
        r.overwrite = !r.resume;
        m.state = r.resume ? "checkpoint" : "start";
        m.step = r.resume ? r.resume->state.step : 0;
      }
      r.membership = m;
    }
    per_world(comm->world(), r);
    try {
      Trainer trainer(cfg, *comm, r);
      started = true;
      try {
        RunSummary done = trainer.run();
        membership.finish();
        return done;
      } catch (const MembershipChanged& e) {
        held = trainer.handover();
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
