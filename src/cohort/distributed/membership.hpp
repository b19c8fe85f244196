// defines: ElasticOptions, Member, WorldChange, BelowMinNodes, Membership
//
// Elastic membership (the launcher's --min-nodes): the ranks of a job are
// not fixed. Each worker process is a member with an id of its own; the
// members of one generation of the world are agreed through the job's
// store, and when one leaves or a node asks to join, the others form the
// next generation without leaving the process.
//
// Store keys, under the job's secret and restart generation (elastic/...):
//   gen                 the newest generation announced (absent: 0)
//   why/G               why generation G was announced
//   hb/ID               each member's heartbeat counter
//   gG/count, gG/slot/I every process that asked to be in generation G
//   gG/members          the decision: generation G's members in rank order
//
// A generation closes when every member of the one before has asked to be
// in it, or when those that have not are silent (their heartbeat stood
// still for three beats while we watched); the first world closes when
// --nnodes nodes have arrived (or, after dist.timeout, with at least
// --min-nodes). Whoever first sees the rule hold writes the decision
// (compare-and-set); everyone reads that one. A node counts only when all
// its local ranks are in. Ranks are given in this order: the members of the
// previous generation that hold state (the least advanced first: the step
// every survivor completed), by their old
// rank, then the newcomers by node and local rank, so rank 0 of a new world
// holds the survivors' state when any survived.
//
// Why and when a world changes is this class's: a collective that fails or
// times out announces it (Comm calls ElasticLink::announce), a member whose
// heartbeat stands still for five beats is announced by the others'
// heartbeat threads, and newcomers waiting to join are noticed there too
// (joiners_waiting(); the trainer admits them at a step boundary).
//
// Limits: the store lives in node 0's launcher, so node 0 must survive;
// elastic worlds use Gloo (CPU tensors, or CUDA tensors through Gloo).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/distributed/comm.hpp"

namespace cohort {

struct ElasticOptions {
  int nnodes = 1;     // nodes the first world waits for
  int min_nodes = 1;  // fewer: BelowMinNodes (the launcher restarts the job from its checkpoint)
  int max_nodes = 0;  // more are kept waiting; 0: no limit
  std::string node_key;  // this node's launcher incarnation: ranks of one node key leave and join together
  std::string config;    // a hash of the shared config: newcomers with another are not admitted
};

// The launcher hands ElasticOptions to its workers as COHORT_ELASTIC=
// "NNODES:MIN:MAX".
std::string elastic_env(const ElasticOptions& eo);
ElasticOptions parse_elastic_env(const std::string& text);

// One process of an elastic job.
struct Member {
  std::string id;
  int node = 0;
  int local_rank = 0;
  int local_world_size = 1;
  std::string node_key;
  int64_t step = -1;  // the step of the state it holds; -1: none (a newcomer)
  int prev_rank = -1;  // its rank in the previous generation; -1: not in it
  std::string config;  // ElasticOptions::config

  std::string encode() const;
  static Member decode(const std::string& text);
};

// What the last formation did, for the log.
struct WorldChange {
  int generation = 0;
  std::vector<Member> members;  // in rank order
  std::vector<Member> left;     // of the previous generation, not in this one
  std::vector<Member> joined;   // not in the previous generation
  int nodes = 0;
  bool state_survived = false;  // rank 0 holds state from the previous world
  std::string cause;            // why the previous world ended ("" for the first)
  double seconds = 0;           // the formation's wall time
};

// Fewer than --min-nodes nodes remain. Exit code 3: the launcher restarts
// the job from its latest checkpoint when --max-restarts allows.
class BelowMinNodes : public Error {
 public:
  explicit BelowMinNodes(const std::string& msg) : Error(msg, 3) {}
};

// "rank 2 (node 2, local rank 0), ..."
std::string describe_members(const std::vector<Member>& members);

class Membership : public ElasticLink, public std::enable_shared_from_this<Membership> {
 public:
  // Connects to the job's store (tcp:// only), checks the secret and starts
  // this process's heartbeat. `spec` gives the node and local rank.
  static std::shared_ptr<Membership> join(const RankSpec& spec, const CommOptions& opts, ElasticOptions eo);
  ~Membership() override;

  // Blocks until a generation that includes this process forms, and returns
  // its communicator; null when the job finished meanwhile (finish()).
  // `step` is the step of the state this process holds (-1: none). Throws
  // BelowMinNodes; DistError when interrupted or the store is gone;
  // MembershipChanged when a member is lost while the group forms.
  std::unique_ptr<Comm> next_world(int64_t step);
  // The job is done: newcomers still waiting go home.
  void finish();
  const WorldChange& last_change() const { return change_; }

  // Newcomers wait to join and the world has room for them (watched by the
  // heartbeat thread).
  // ElasticLink
  bool joiners_waiting() const override { return joiners_waiting_.load(); }
  bool changed() const override { return changed_.load(); }
  std::string why() const override;
  void announce(const std::string& why) override;
  void bury(c10::intrusive_ptr<c10::intrusive_ptr_target> group) override;

 private:
  Membership() = default;
  std::unique_ptr<Comm> form_next(int64_t step);
  // form_next's steps.
  struct Forming;  // one generation forming, as this process watches it
  // Registers `me` for `generation` and waits for its members (deciding them
  // when the rule holds here first); nullopt when the job finished meanwhile.
  std::optional<std::vector<Member>> await_members(int generation, const Member& me,
                                                   const std::vector<Member>& before);
  // Member `id` is silent: still for three beats, or said it left.
  bool silent(Forming& forming, const std::string& id, std::chrono::steady_clock::time_point now) const;
  // Whether the live registrations `regs` close the generation now; throws
  // BelowMinNodes when too few nodes remain for too long.
  bool closes(Forming& forming, const std::vector<Member>& regs, std::chrono::steady_clock::time_point now) const;
  // Makes `decided` this process's world (generation `generation`) and forms its communicator.
  std::unique_ptr<Comm> enter(int generation, const std::vector<Member>& decided, const World& world,
                              const WorldChange& change);
  void beat();
  void watch_peers(c10d::Store& store);
  void announce_on(c10d::Store& store, int generation, const std::string& why);
  static std::vector<Member> registrants(c10d::Store& store, int generation);
  std::vector<Member> decide(const std::vector<Member>& regs, const std::vector<Member>& prev) const;

  RankSpec spec_;
  CommOptions opts_;
  ElasticOptions eo_;
  std::string id_;
  c10::intrusive_ptr<c10d::Store> base_, hb_base_;  // the two clients, without the job's prefix
  c10::intrusive_ptr<c10d::Store> store_;     // the main thread's client
  c10::intrusive_ptr<c10d::Store> hb_store_;  // the heartbeat thread's own client
  WorldChange change_;
  std::vector<c10::intrusive_ptr<c10::intrusive_ptr_target>> graveyard_;  // never destroyed

  mutable std::mutex mu_;  // guards world_, generation_, why_, in_world_
  std::vector<Member> world_;
  int generation_ = -1;
  bool in_world_ = false;
  std::string why_;
  std::atomic<bool> changed_{false};
  std::atomic<bool> joiners_waiting_{false};

  // The heartbeat thread's view of the others' beats in this generation.
  std::mutex beats_mu_;
  std::map<std::string, std::pair<std::string, std::chrono::steady_clock::time_point>> peer_beats_;
  int peer_beats_generation_ = -1;

  std::thread heartbeat_;
  std::condition_variable cv_;
  bool stop_ = false;
};

}  // namespace cohort
