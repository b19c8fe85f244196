// defines: CommOptions, Comm
//
// The job's communicator: a c10d store for rendezvous plus a Gloo process
// group for collectives. A world of one needs neither and makes every
// collective a no-op, so single-process code takes the same path.
//
// Cross-rank contract: every rank calls the collectives of one Comm in the
// same order, with tensors of the same dtype and (except all_gather) shape.
// Every collective is bounded by CommOptions::timeout. When one fails, the
// error names the ranks whose heartbeats stopped (dead or stalled) or, for
// agree(), the ranks whose values differ.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/distributed/rendezvous.hpp"
#include "cohort/distributed/world.hpp"

namespace c10d {
class Store;
}

namespace cohort {

// An elastic world's membership changed while a collective ran (a member
// left, stalled or announced a change): the collective is abandoned and the
// members form a new world (distributed/membership.hpp).
class MembershipChanged : public DistError {
 public:
  using DistError::DistError;
};

// What an elastic world's collectives consult: Membership implements it.
class ElasticLink {
 public:
  virtual ~ElasticLink() = default;
  // Another member announced a change: abandon the collective.
  virtual bool changed() const = 0;
  // Why the world is changing, for the error.
  virtual std::string why() const = 0;
  // Newcomers wait to join and the world has room for them.
  virtual bool joiners_waiting() const = 0;
  // This member saw a collective fail: tell the others.
  virtual void announce(const std::string& why) = 0;
  // Takes a process group that may still hold abandoned work: destroying it
  // would block until that work times out.
  virtual void bury(c10::intrusive_ptr<c10::intrusive_ptr_target> group) = 0;
};

struct CommOptions {
  std::chrono::milliseconds timeout{300000};
  std::string secret;   // shared by every process of the job; "" is a valid secret
  std::string iface;    // network interface for Gloo; "" picks one from the master address
  std::chrono::milliseconds heartbeat{1000};
  DeviceKind device = DeviceKind::kAuto;  // train.device
  BackendKind backend = BackendKind::kAuto;  // dist.backend: for CUDA tensors
  int generation = 0;  // restart attempt: keys of earlier attempts are not seen
  // Polled while the ranks meet: true ends the rendezvous at once (a stop
  // signal). Null: never.
  std::function<bool()> interrupted;
};

class Comm {
 public:
  // A world of one, without any network.
  static std::unique_ptr<Comm> single(DeviceKind device = DeviceKind::kAuto);
  // Joins the job `spec` describes: connects to (or hosts) the store, checks
  // the secret, takes a roll call (each rank number is claimed once, every
  // rank agrees on the world size, and a slow rendezvous says whom it waits
  // for), creates the process group and starts the heartbeat. Throws
  // DistError naming the rendezvous address on failure or timeout, and
  // UsageError for a world-size mismatch or a rank number taken twice.
  static std::unique_ptr<Comm> connect(const RankSpec& spec, const CommOptions& opts);
  // One generation of an elastic world whose members Membership agreed on:
  // a Gloo group over `store` (private to the generation). Collectives wait
  // in slices and throw MembershipChanged when `link` says the world changed
  // or when they fail (after announcing it). No heartbeat of its own. A null
  // `link` makes a fixed world over `store` (the tests' thread worlds).
  static std::unique_ptr<Comm> form(const World& world, const RankSpec& spec, const CommOptions& opts,
                                    const c10::intrusive_ptr<c10d::Store>& store, std::shared_ptr<ElasticLink> link);
  // A group of some of this world's ranks (`members`: global ranks, in the
  // group's rank order; this rank among them), with its own process group
  // under the store prefix `name`. Collective over the members, who pass the
  // same list and name. Its errors name global ranks and it reads the
  // world's heartbeats; it must not outlive this Comm. An elastic world's
  // group is its generation's: its collectives throw MembershipChanged as
  // the world's do.
  std::unique_ptr<Comm> split(const std::vector<int>& members, const std::string& name);
  ~Comm();

  const World& world() const { return world_; }
  // An elastic world (Comm::form): its membership can change.
  bool elastic() const { return link_ != nullptr; }
  // Elastic: newcomers wait to join (the trainer admits them at a step boundary).
  bool joiners_waiting() const { return link_ && link_->joiners_waiting(); }
  int rank() const { return world_.rank; }
  int size() const { return world_.world_size; }
  // The global ranks of this group's members, in its rank order (a world:
  // 0 .. size-1).
  std::vector<int> global_ranks() const;
  // A group split from a world (Comm::split), not a world.
  bool is_group() const { return !members_.empty(); }

  // In place. All ranks get the element-wise sum.
  void all_reduce_sum(torch::Tensor& t, const char* what = "all_reduce");
  // Starts an in-place sum; the returned function waits for it (and throws
  // DistError like the blocking form). Ranks must start them in one order.
  std::function<void()> all_reduce_sum_async(torch::Tensor& t, const char* what = "all_reduce");
  std::vector<double> all_reduce_sum(const std::vector<double>& values, const char* what = "all_reduce");
  // In place. Every rank gets root's tensor.
  void broadcast(torch::Tensor& t, int root = 0, const char* what = "broadcast");
  // Every rank gets root's bytes (the length travels first).
  void broadcast_bytes(std::string& bytes, int root = 0, const char* what = "broadcast");
  // Every rank's tensor, in rank order. First dimensions may differ.
  std::vector<torch::Tensor> all_gather(const torch::Tensor& t, const char* what = "all_gather");
  // Every rank's tensor, in rank order, on `root` only (elsewhere: none).
  // First dimensions may differ. What one rank writes for all (a
  // checkpoint) crosses each link once, not to every rank.
  std::vector<torch::Tensor> gather(const torch::Tensor& t, int root = 0, const char* what = "gather");
  // Starts gathering every rank's tensor (the same shape and dtype on every
  // rank); the returned function waits for them, on the host in rank order,
  // and throws DistError like the blocking form.
  std::function<std::vector<torch::Tensor>()> all_gather_async(const torch::Tensor& t,
                                                               const char* what = "all_gather");
  void barrier(const char* what = "barrier");
  // Checks that every rank holds the same `values`; throws DistError naming
  // each disagreeing rank, the field and both values.
  // A non-empty `hint` says why the values can differ and what to do; then
  // the error is a UsageError (exit 2: a restart cannot help).
  void agree(const std::vector<int64_t>& values, const std::vector<std::string>& names, const char* what,
             const std::string& hint = "");

  struct Impl;

 private:
  Comm();
  std::vector<torch::Tensor> all_gather_fixed(const torch::Tensor& t, const char* what);
  World world_;
  std::vector<int> members_;  // a split group's global ranks; empty: the world's
  std::shared_ptr<ElasticLink> link_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cohort
