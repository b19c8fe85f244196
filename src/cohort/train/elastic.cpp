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
  for (bool first = true;; first = false) {
    std::unique_ptr<Comm> comm = membership.next_world(held ? held->state.step : -1);
    const WorldChange& change = membership.last_change();
    RunOptions r = run;
    if (!first || change.generation > 0) {
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
      r.handover = held;
      if (change.state_survived) {
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
      } else if (!first) {
        r.resume.reset();
        r.overwrite = true;
        r.notes.push_back("elastic: no member of the previous world survived with its state and the run has no "
                          "checkpoint; starting over");
        m.state = "start";
      } else {
        m.state = run.resume ? "checkpoint" : "start";  // a newcomer to a job whose state was lost: as planned
        m.step = run.resume ? run.resume->state.step : 0;
      }
      r.membership = m;
    }
    per_world(comm->world(), r);
    try {
      Trainer trainer(cfg, *comm, r);
      try {
        return trainer.run();
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
