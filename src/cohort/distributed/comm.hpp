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

#include "cohort/distributed/rendezvous.hpp"
#include "cohort/distributed/world.hpp"

namespace cohort {

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
  ~Comm();

  const World& world() const { return world_; }
  int rank() const { return world_.rank; }
  int size() const { return world_.world_size; }

  // In place. All ranks get the element-wise sum.
  void all_reduce_sum(torch::Tensor& t, const char* what = "all_reduce");
  // Starts an in-place sum; the returned function waits for it (and throws
  // DistError like the blocking form). Ranks must start them in one order.
  std::function<void()> all_reduce_sum_async(torch::Tensor& t, const char* what = "all_reduce");
  std::vector<double> all_reduce_sum(const std::vector<double>& values, const char* what = "all_reduce");
  // In place. Every rank gets root's tensor.
  void broadcast(torch::Tensor& t, int root = 0, const char* what = "broadcast");
  // Every rank's tensor, in rank order. First dimensions may differ.
  std::vector<torch::Tensor> all_gather(const torch::Tensor& t, const char* what = "all_gather");
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
  std::unique_ptr<Impl> impl_;
};

}  // namespace cohort
