#include "cohort/distributed/comm.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <torch/cuda.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "cohort/core/error.hpp"
#include "cohort/core/sha256.hpp"
#include "cohort/device/host_read.hpp"
#include "cohort/distributed/store.hpp"

namespace cohort {

namespace {

using std::chrono::milliseconds;

// c10d's flight recorder (one per process, made at the first collective,
// sized by TORCH_FR_BUFFER_SIZE, 2000 by default) inserts each process
// group's first record into a map outside its lock: two groups of one
// process (a rank's island and the world, the tests' thread worlds) that
// start collectives from two threads at once corrupt it and crash. It
// also gathers a traceback per collective. Off unless the user sets the
// variable; set before main, while the process has one thread.
[[maybe_unused]] const bool kFlightRecorderOff = [] { return setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0) == 0; }();

std::string to_string(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> to_bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

// The local address this host uses to reach host:port, so that Gloo binds to
// the interface that can actually talk to the other ranks (in a network
// namespace the machine's hostname may resolve elsewhere).
std::string local_address_towards(const std::string& host, int port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res) return "";
  std::string out;
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    char buf[INET_ADDRSTRLEN];
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf)) {
      out = buf;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return out;
}

using Clock = std::chrono::steady_clock;

// Where to look when ranks do not all arrive, by who started them.
std::string arrival_hint(const RankSpec& spec) {
  if (spec.source == "SLURM")
    return "under SLURM every task must be started by srun: 'cohort train' run straight in an sbatch script is one "
           "process of SLURM_NTASKS";
  if (spec.source == "launcher") return "check --nnodes, --nproc-per-node and --node-rank on every node";
  if (spec.source == "Open MPI") return "check mpirun's -np and hosts";
  return "check RANK and WORLD_SIZE on every process";
}

// Waits for `key` in slices of the store's own bounded wait, so that
// `interrupted` is honoured at once and a store host that stopped answering
// cannot hold a rank past the deadline (check() has no reply timeout).
void wait_for_key(c10d::Store& store, const std::string& key, Clock::time_point deadline, const CommOptions& opts,
                  const RankSpec& spec, const char* stage) {
  for (;;) {
    try {
      store.wait({key}, milliseconds(200));
      return;
    } catch (const c10::DistStoreError&) {
    } catch (const c10::Error& e) {
      if (std::string(e.what()).find("imeout") == std::string::npos &&
          std::string(e.what()).find("imed out") == std::string::npos)
        throw;
    }
    COHORT_CHECK(!(opts.interrupted && opts.interrupted()), DistError, "rank ", spec.rank,
                 ": interrupted while the ranks were meeting at ", spec.init.text, " (", stage, ")");
    if (Clock::now() >= deadline) {
      throw DistError(detail::cat("rank ", spec.rank, ": rendezvous at ", spec.init.text, " did not complete within ",
                                  opts.timeout.count() / 1000.0, " s (", stage, "); ", arrival_hint(spec)));
    }
  }
}

// Every rank claims its number and counts itself in; rank 0 publishes the
// world size. A stray process (another job's rank, or one started twice)
// is refused instead of joining Gloo's mesh, a world-size mismatch is named,
// and after 10 s without everyone the wait says who is missing.
void roll_call(c10d::Store& store, const RankSpec& spec, const CommOptions& opts, Clock::time_point deadline) {
  const std::string where = spec.init.text;
  // Claim first: a stray must not publish or count anything.
  int64_t claims = store.add(detail::cat("claim/", spec.rank), 1);
  COHORT_CHECK(claims == 1, UsageError, "rank ", spec.rank, ": another process already joined the job at ", where,
               " as rank ", spec.rank, ": a rank started twice, or a process of another job that uses the same "
               "address and secret (give each job its own port, or set --dist.secret)");
  if (spec.rank == 0) store.set("world_size", to_bytes(std::to_string(spec.world_size)));
  wait_for_key(store, "world_size", deadline, opts, spec, "waiting for rank 0");
  int theirs = std::stoi(to_string(store.get("world_size")));
  COHORT_CHECK(theirs == spec.world_size, UsageError, "rank ", spec.rank, ": the job at ", where, " has ", theirs,
               " ranks but this process was told ", spec.world_size, "; ", arrival_hint(spec));
  // The last to arrive says so; the others wait for that in bounded slices.
  int64_t arrived = store.add("arrived", 1);
  COHORT_CHECK(arrived <= spec.world_size, UsageError, "rank ", spec.rank, ": ", arrived,
               " processes joined the job at ", where, " of ", spec.world_size, " ranks; ", arrival_hint(spec));
  if (arrived == spec.world_size) store.set("all_arrived", to_bytes("1"));
  const Clock::time_point started = Clock::now();
  bool told = false;
  for (;;) {
    try {
      store.wait({"all_arrived"}, milliseconds(200));
      return;
    } catch (const c10::Error&) {
    }
    arrived = store.add("arrived", 0);
    COHORT_CHECK(!(opts.interrupted && opts.interrupted()), DistError, "rank ", spec.rank,
                 ": interrupted while the ranks were meeting at ", where);
    auto missing = [&] {
      std::string out;
      int listed = 0;
      for (int r = 0; r < spec.world_size && listed < 8; ++r) {
        if (store.check({detail::cat("claim/", r)})) continue;
        out += detail::cat(listed++ ? ", " : "", r);
      }
      return out;
    };
    if (Clock::now() >= deadline) {
      throw DistError(detail::cat("rank ", spec.rank, ": only ", arrived, " of ", spec.world_size,
                                  " ranks arrived at ", where, " within ", opts.timeout.count() / 1000.0,
                                  " s; missing rank(s) ", missing(), "; ", arrival_hint(spec)));
    }
    if (!told && spec.rank == 0 && Clock::now() - started > std::chrono::seconds(10)) {
      told = true;
      std::fprintf(stderr, "cohort: rank 0: %lld of %d ranks have arrived at %s; waiting for rank(s) %s (%s)\n",
                   static_cast<long long>(arrived), spec.world_size, where.c_str(), missing().c_str(),
                   arrival_hint(spec).c_str());
    }
  }
}

// A Gloo group over `store`: on dist.iface when set, else on the address
// this host uses to reach the rendezvous host (tcp://), else Gloo's default.
// Connecting is bounded by `connect_timeout`; collectives by dist.timeout.
c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                      int size, const RankSpec& spec, const CommOptions& opts,
                                                      milliseconds connect_timeout) {
  auto go = c10d::ProcessGroupGloo::Options::create(connect_timeout);
  if (!opts.iface.empty()) {
    go->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(opts.iface));
  } else {
    std::string addr = spec.init.kind == InitMethod::Kind::kTcp
                           ? local_address_towards(spec.init.host, spec.init.port) : "";
    go->devices.push_back(addr.empty() ? c10d::ProcessGroupGloo::createDefaultDevice()
                                       : c10d::ProcessGroupGloo::createDeviceForHostname(addr));
  }
  go->threads = 2;
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, go);
  pg->setTimeout(opts.timeout);
  return pg;
}

// auto: NCCL when every local rank has a GPU of its own (NCCL refuses two
// ranks on one device), else Gloo, which carries CUDA tensors too.
bool wants_nccl(const World& world, const CommOptions& opts) {
  const bool nccl = world.device.is_cuda() &&
                    (opts.backend == BackendKind::kNccl ||
                     (opts.backend == BackendKind::kAuto &&
                      world.local_world_size <= static_cast<int>(torch::cuda::device_count())));
#ifndef USE_C10D_NCCL
  COHORT_CHECK(!nccl || opts.backend == BackendKind::kAuto, ConfigError,
               "dist.backend is nccl but this Cohort was built without NCCL (no CUDA toolkit); use gloo");
  return false;
#else
  return nccl;
#endif
}

// The NCCL group for CUDA tensors over `store`, or null without NCCL.
// A fixed world: a dead or stalled peer must end the job, not hang it, so
// async error handling tears the process down when the watchdog
// (dist.timeout plus a margin) fires. An elastic world (`device` set): the
// survivors go on, so an error only aborts the communicator (CleanUpOnly)
// and reaches the polling wait through the work's exception; the
// communicator connects now, in non-blocking mode bounded by the same
// timeout, so that a member lost before the generation's first collective
// cannot block the others inside NCCL's set-up.
c10::intrusive_ptr<c10d::Backend> nccl_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                             const CommOptions& opts, std::optional<c10::Device> elastic_device = {}) {
#ifdef USE_C10D_NCCL
  setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", elastic_device ? "2" : "1", /*overwrite=*/elastic_device ? 1 : 0);
  auto no = c10d::ProcessGroupNCCL::Options::create();
  no->timeout = opts.timeout + std::chrono::milliseconds(30000);
#ifdef NCCL_HAS_COMM_NONBLOCKING
  if (elastic_device) {
    no->config.blocking = 0;
    // What bounds a non-blocking set-up or abort: PyTorch reads it once per
    // process (30 minutes when unset). The job's own timeout, unless the
    // user set one.
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(opts.timeout).count();
    setenv("TORCH_NCCL_NONBLOCKING_TIMEOUT", std::to_string(std::max<int64_t>(1, seconds)).c_str(), /*overwrite=*/0);
  }
#endif
  auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(c10::make_intrusive<c10d::PrefixStore>("nccl", store), rank,
                                                        size, no);
  if (elastic_device) pg->eagerConnectSingleDevice(*elastic_device);
  return pg;
#else
  (void)store, (void)rank, (void)size, (void)opts, (void)elastic_device;
  return {};
#endif
}

}  // namespace

struct Comm::Impl {
  RankSpec spec;
  CommOptions opts;
  c10::intrusive_ptr<c10d::Store> store;  // prefixed by the job's secret
  // Where the ranks' heartbeats are (a group split from the world keeps its
  // keys under its own prefix, the beats under the world's), and the global
  // ranks of the group's members, in group-rank order (empty: the world).
  c10::intrusive_ptr<c10d::Store> beats_store;
  std::vector<int> members;
  c10::intrusive_ptr<c10d::Backend> pg;      // Gloo: CPU tensors, control collectives
  c10::intrusive_ptr<c10d::Backend> cuda_pg;  // NCCL for CUDA tensors, when used

  // Whether `t`'s collectives go through NCCL (and complete on a CUDA
  // stream) rather than Gloo (on the host), and that backend.
  bool on_stream(const torch::Tensor& t) const { return t.is_cuda() && cuda_pg; }
  c10d::Backend& backend_for(const torch::Tensor& t) { return on_stream(t) ? *cuda_pg : *pg; }

  std::shared_ptr<ElasticLink> link;  // an elastic world's membership; null: a fixed world

  std::thread heartbeat;
  int64_t beats = 0;
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    if (heartbeat.joinable()) heartbeat.join();
    // An elastic world's NCCL communicator ends with its generation: aborted,
    // so that nothing of it (a kernel waiting for a lost peer) outlives it.
    abort_device_group();
    // An abandoned collective may still run in the group's threads (after a
    // planned change, every collective completed: the group closes now).
    if (link && pg && link->changed()) link->bury(std::move(pg));
  }

  void beat() {
    std::unique_lock<std::mutex> lock(mu);
    while (!stop) {
      lock.unlock();  // a stalled store must not block shutdown
      try {
        store->set("hb/" + std::to_string(spec.rank), to_bytes(std::to_string(++beats)));
      } catch (const std::exception&) {
        // The store's host is gone; the next collective reports it.
      }
      lock.lock();
      cv.wait_for(lock, opts.heartbeat, [&] { return stop; });
    }
  }

  // Names the ranks whose heartbeat stopped, after giving a just-failed peer
  // time to miss a beat.
  // A rank is silent when its beat counter does not move while we watch for
  // three intervals; counters, unlike timestamps, need no synchronised clocks.
  std::string diagnose(const char* what, const std::string& cause) {
    std::string stale;
    try {
      std::vector<int> ranks = members;
      if (ranks.empty()) {
        for (int r = 0; r < spec.world_size; ++r) ranks.push_back(r);
      }
      c10d::Store& beats = beats_store ? *beats_store : *store;
      auto read_beats = [&] {
        std::map<int, std::string> seen;
        for (int r : ranks) {
          std::string key = "hb/" + std::to_string(r);
          if (r != spec.rank && beats.check({key})) seen[r] = to_string(beats.get(key));
        }
        return seen;
      };
      auto before = read_beats();
      std::this_thread::sleep_for(opts.heartbeat * 3);
      auto after = read_beats();
      double watched = 3.0 * static_cast<double>(opts.heartbeat.count()) / 1000.0;
      for (int r : ranks) {
        if (r == spec.rank || before[r] != after[r]) continue;
        stale += detail::cat(stale.empty() ? "" : ", ", "rank ", r,
                             after[r].empty() ? " (never seen)" : detail::cat(" (silent for over ", watched, " s)"));
      }
    } catch (const std::exception&) {
      return detail::cat("rank ", spec.rank, ": ", what, " failed and the rendezvous store at ", spec.init.text,
                         " is unreachable: the process hosting it (rank 0 or node 0's launcher) is likely dead. "
                         "Cause: ", detail::first_line(cause));
    }
    if (!stale.empty()) {
      return detail::cat("rank ", spec.rank, ": ", what, " failed: ", stale,
                         " stopped responding (dead or stalled). Cause: ", detail::first_line(cause));
    }
    bool timed_out = cause.find("imed out") != std::string::npos || cause.find("imeout") != std::string::npos;
    if (!timed_out) return detail::cat("rank ", spec.rank, ": ", what, " failed: ", detail::first_line(cause));
    return detail::cat("rank ", spec.rank, ": ", what, " timed out after dist.timeout ", opts.timeout.count() / 1000.0,
                       " s while every rank still beats: one is likely stuck in other work or diverged. Cause: ",
                       detail::first_line(cause));
  }

  // Elastic: aborts the generation's NCCL communicator (ncclCommAbort), which
  // ends any of its kernels still waiting for a peer that left, so that the
  // survivors' streams, and their host reads, go on. Idempotent.
  void abort_device_group() {
    if (!link || !cuda_pg) return;
    try {
      cuda_pg->abort();
    } catch (const std::exception&) {
      // Already torn down by NCCL's watchdog.
    }
    cuda_pg.reset();
  }

  // Gloo work is waited for on the host, within dist.timeout. NCCL work is
  // waited for on the stream (the host goes on; the caller's stream orders
  // after it). A stalled NCCL collective is caught by the next Gloo control
  // collective (every step has one), which names the silent rank; NCCL's
  // own watchdog, set to dist.timeout plus a margin, is the backstop.
  void wait(const char* what, const c10::intrusive_ptr<c10d::Work>& work, bool on_stream = false) {
    if (link) return wait_elastic(what, work, on_stream);
    try {
      if (on_stream) {
        work->wait();
        return;
      }
      work->wait(opts.timeout);
    } catch (const std::exception& e) {
      throw DistError(diagnose(what, e.what()));
    }
  }

  // An elastic world waits in slices: a change another member announced
  // ends the wait at once, and a failure is announced to the others (whose
  // collectives may be blocked on this rank, not on the one that left).
  //
  // NCCL work is waited for on the host too, polling its completion (never
  // a timed NCCL wait, which would tear the communicator down): a step must
  // not apply a gradient sum that a lost peer left half done, and the
  // survivors keep their state in memory. This is the one place a step waits
  // for the device (counted), and only in elastic worlds on NCCL.
  void wait_elastic(const char* what, const c10::intrusive_ptr<c10d::Work>& work, bool on_stream) {
    const Clock::time_point deadline = Clock::now() + opts.timeout;
    if (on_stream) {
      count_host_wait();
      while (!work->isCompleted()) {
        if (link->changed()) fail_elastic(detail::cat(what, " abandoned: ", link->why()), /*announce=*/false);
        if (Clock::now() >= deadline) {
          fail_elastic(detail::cat(what, " timed out on rank ", spec.rank, " after dist.timeout ",
                                   opts.timeout.count() / 1000.0, " s"), /*announce=*/true);
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      if (auto e = work->exception()) {
        std::string why = "unknown";
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& x) {
          why = detail::first_line(x.what());
        }
        fail_elastic(detail::cat(what, " failed on rank ", spec.rank, ": ", why), /*announce=*/true);
      }
      return;
    }
    for (;;) {
      try {  // done work first: a rank must not drop a step its peers completed
        work->wait(milliseconds(100));
        return;
      } catch (const std::exception& e) {
        // A slice that ran out ("Operation timed out!") just before the work
        // completed is not a failure: completed work without an exception
        // succeeded.
        if (work->isCompleted() && !work->exception()) return;
        if (work->isCompleted() || Clock::now() >= deadline) {
          std::string why = work->isCompleted()
                                ? detail::cat(what, " failed on rank ", spec.rank, ": ", detail::first_line(e.what()))
                                : detail::cat(what, " timed out on rank ", spec.rank, " after dist.timeout ",
                                              opts.timeout.count() / 1000.0, " s");
          fail_elastic(why, /*announce=*/true);
        }
      }
      if (link->changed()) fail_elastic(detail::cat(what, " abandoned: ", link->why()), /*announce=*/false);
    }
  }

  // Ends an elastic collective: tells the others (when this rank saw the
  // failure), aborts the NCCL communicator, and throws MembershipChanged.
  [[noreturn]] void fail_elastic(const std::string& why, bool announce) {
    if (announce) link->announce(why);
    abort_device_group();
    throw MembershipChanged(detail::cat("rank ", spec.rank, ": ", why));
  }
};

Comm::Comm() = default;
Comm::~Comm() = default;

std::unique_ptr<Comm> Comm::single(DeviceKind device) {
  std::unique_ptr<Comm> c(new Comm());
  c->world_.device = resolve_device(device, 0);
  return c;
}

std::unique_ptr<Comm> Comm::connect(const RankSpec& spec, const CommOptions& opts) {
  if (spec.world_size == 1) return single(opts.device);
  std::unique_ptr<Comm> c(new Comm());
  c->world_.rank = spec.rank;
  c->world_.world_size = spec.world_size;
  c->world_.local_rank = spec.local_rank;
  c->world_.local_world_size = spec.local_world_size;
  c->world_.node_rank = spec.node_rank;
  c->world_.device = resolve_device(opts.device, spec.local_rank);
  const bool nccl = wants_nccl(c->world_, opts);

  auto impl = std::make_unique<Impl>();
  impl->spec = spec;
  impl->opts = opts;
  const std::string where = spec.init.text;

  c10::intrusive_ptr<c10d::Store> base;
  const Clock::time_point deadline = Clock::now() + opts.timeout;
  try {
    if (spec.init.kind == InitMethod::Kind::kTcp) {
      COHORT_CHECK(resolves(spec.init.host), UsageError, "rank ", spec.rank, ": init method ", where, ": host '",
                   spec.init.host, "' does not resolve to an address");
      // A client retries in slices, so that a stop signal ends the wait.
      for (;;) {
        auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
        try {
          base = open_tcp_store(spec.init.host, spec.init.port, spec.host_store,
                                spec.host_store ? opts.timeout : std::clamp(left, milliseconds(1), milliseconds(1000)));
          base->setTimeout(opts.timeout);
          break;
        } catch (const std::exception&) {
          if (spec.host_store || Clock::now() >= deadline) throw;
          COHORT_CHECK(!(opts.interrupted && opts.interrupted()), DistError, "rank ", spec.rank,
                       ": interrupted while connecting to the rendezvous store at ", where);
        }
      }
    } else if (spec.init.kind == InitMethod::Kind::kFile) {
      base = c10::make_intrusive<c10d::FileStore>(spec.init.path, spec.world_size);
      base->setTimeout(opts.timeout);
    } else {
      throw UsageError(detail::cat("rank ", spec.rank, ": no rendezvous address; pass --init-method tcp://HOST:PORT"));
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string why = detail::first_line(e.what());
    if (spec.host_store) {
      throw DistError(detail::cat("rank ", spec.rank, ": cannot host the rendezvous store at ", where, ": ", why,
                                  ". Is the port in use by another job? Pick another port."));
    }
    throw DistError(detail::cat("rank ", spec.rank, ": cannot reach the rendezvous store at ", where, " within ",
                                opts.timeout.count() / 1000.0, " s: ", why));
  }

  // The secret: rank 0 publishes a proof of it; everyone else compares. All
  // job keys then live under a prefix derived from it, so a process without
  // the secret can neither join nor overwrite the job's keys.
  try {
    std::string proof = sha256_hex("cohort-proof:" + opts.secret);
    std::string proof_key = "cohort/proof/" + std::to_string(opts.generation);
    if (spec.rank == 0) base->set(proof_key, to_bytes(proof));
    wait_for_key(*base, proof_key, deadline, opts, spec, "waiting for rank 0");
    COHORT_CHECK(to_string(base->get(proof_key)) == proof, UsageError, "rank ", spec.rank,
                 ": refused by the job at ", where,
                 ": its secret differs from ours. Set the same --dist.secret or COHORT_SECRET on every node.");
    impl->store = c10::make_intrusive<c10d::PrefixStore>(
        detail::cat("cohort/", sha256_hex(opts.secret).substr(0, 16), "/", opts.generation), base);
    roll_call(*impl->store, spec, opts, deadline);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw DistError(detail::cat("rank ", spec.rank, ": rendezvous at ", where, " did not complete within ",
                                opts.timeout.count() / 1000.0, " s: ", detail::first_line(e.what())));
  }

  try {
    impl->pg = gloo_group(c10::make_intrusive<c10d::PrefixStore>("gloo", impl->store), spec.rank, spec.world_size,
                          spec, opts, opts.timeout);
    if (nccl) impl->cuda_pg = nccl_group(impl->store, spec.rank, spec.world_size, opts);
  } catch (const std::exception& e) {
    throw DistError(detail::cat("rank ", spec.rank, ": could not form the process group of ", spec.world_size,
                                " ranks through ", where, " within ", opts.timeout.count() / 1000.0,
                                " s: ", detail::first_line(e.what())));
  }
  c->impl_ = std::move(impl);
  Impl* raw = c->impl_.get();
  raw->heartbeat = std::thread([raw] { raw->beat(); });
  return c;
}

std::unique_ptr<Comm> Comm::form(const World& world, const RankSpec& spec, const CommOptions& opts,
                                 const c10::intrusive_ptr<c10d::Store>& store, std::shared_ptr<ElasticLink> link) {
  std::unique_ptr<Comm> c(new Comm());
  c->world_ = world;
  c->link_ = link;
  if (world.world_size == 1) return c;  // a world of one needs no group (and has no peer to lose)
  auto impl = std::make_unique<Impl>();
  impl->spec = spec;
  impl->spec.rank = world.rank;
  impl->spec.world_size = world.world_size;
  impl->opts = opts;
  impl->store = store;
  impl->link = std::move(link);
  try {
    // Connecting is bounded more tightly than collectives: a member that
    // died after the decision must not hold the others for dist.timeout.
    impl->pg = gloo_group(store, world.rank, world.world_size, spec, opts, std::min(opts.timeout, milliseconds(15000)));
    // CUDA tensors: a NCCL communicator of this generation's own (its store
    // is the generation's), aborted when the generation ends. Control
    // traffic and heartbeats stay on Gloo and the store.
    if (wants_nccl(world, opts)) impl->cuda_pg = nccl_group(store, world.rank, world.world_size, opts, world.device);
  } catch (const std::exception& e) {
    std::string why = detail::cat("could not form the process group of ", world.world_size, " ranks: ",
                                  detail::first_line(e.what()));
    if (!impl->link) throw DistError(detail::cat("rank ", world.rank, ": ", why));  // a fixed world (tests)
    impl->link->announce(why);
    throw MembershipChanged(detail::cat("rank ", world.rank, ": ", why));
  }
  c->impl_ = std::move(impl);
  return c;
}

std::vector<int> Comm::global_ranks() const {
  if (!members_.empty()) return members_;
  std::vector<int> all(static_cast<size_t>(size()));
  for (int r = 0; r < size(); ++r) all[static_cast<size_t>(r)] = r;
  return all;
}

std::unique_ptr<Comm> Comm::split(const std::vector<int>& members, const std::string& name) {
  auto at = std::find(members.begin(), members.end(), rank());
  COHORT_CHECK(at != members.end(), Error, "rank ", rank(), ": splitting group '", name,
               "' whose members do not include this rank");
  std::unique_ptr<Comm> c(new Comm());
  c->world_ = world_;
  c->world_.rank = static_cast<int>(at - members.begin());
  c->world_.world_size = static_cast<int>(members.size());
  const std::vector<int> global = global_ranks();
  for (int m : members) c->members_.push_back(global.at(static_cast<size_t>(m)));
  // An elastic world's group lives in its generation (the store is the
  // generation's) and ends with it: its collectives consult the same link.
  c->link_ = link_;
  if (members.size() == 1 || !impl_) return c;  // a group of one: no network
  auto impl = std::make_unique<Impl>();
  impl->spec = impl_->spec;  // the world's: errors and heartbeats name global ranks
  impl->opts = impl_->opts;
  impl->store = c10::make_intrusive<c10d::PrefixStore>("group/" + name, impl_->store);
  impl->beats_store = impl_->store;
  impl->members = members;
  impl->link = impl_->link;
  // As the world's formation is: a member lost after the decision must not
  // hold the others for dist.timeout.
  const milliseconds bound = link_ ? std::min(impl_->opts.timeout, milliseconds(15000)) : impl_->opts.timeout;
  try {
    impl->pg = gloo_group(c10::make_intrusive<c10d::PrefixStore>("gloo", impl->store), c->world_.rank,
                          c->world_.world_size, impl_->spec, impl_->opts, bound);
    if (impl_->cuda_pg) {
      impl->cuda_pg = link_ ? nccl_group(impl->store, c->world_.rank, c->world_.world_size, impl_->opts,
                                         world_.device)
                            : nccl_group(impl->store, c->world_.rank, c->world_.world_size, impl_->opts);
    }
  } catch (const std::exception& e) {
    std::string why = detail::cat("could not form group '", name, "' of ", members.size(), " ranks within ",
                                  bound.count() / 1000.0, " s: ", detail::first_line(e.what()));
    if (link_) {
      link_->announce(why);
      throw MembershipChanged(detail::cat("rank ", rank(), ": ", why));
    }
    throw DistError(detail::cat("rank ", rank(), ": ", why));
  }
  c->impl_ = std::move(impl);
  return c;
}

void Comm::all_reduce_sum(torch::Tensor& t, const char* what) {
  if (!impl_) return;
  std::vector<torch::Tensor> v{t};
  impl_->wait(what, impl_->backend_for(t).allreduce(v), impl_->on_stream(t));
}

std::function<void()> Comm::all_reduce_sum_async(torch::Tensor& t, const char* what) {
  if (!impl_) return [] {};
  std::vector<torch::Tensor> v{t};
  auto work = impl_->backend_for(t).allreduce(v);
  Impl* impl = impl_.get();
  bool on_stream = impl->on_stream(t);
  return [impl, work, what, on_stream] { impl->wait(what, work, on_stream); };
}

std::vector<double> Comm::all_reduce_sum(const std::vector<double>& values, const char* what) {
  if (!impl_ || values.empty()) return values;
  auto t = torch::tensor(values, torch::kFloat64);
  all_reduce_sum(t, what);
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

void Comm::broadcast(torch::Tensor& t, int root, const char* what) {
  if (!impl_) return;
  std::vector<torch::Tensor> v{t};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  impl_->wait(what, impl_->backend_for(t).broadcast(v, o), impl_->on_stream(t));
}

void Comm::broadcast_bytes(std::string& bytes, int root, const char* what) {
  if (!impl_) return;
  auto length = torch::tensor({static_cast<int64_t>(bytes.size())}, torch::kInt64);
  broadcast(length, root, what);
  auto data = torch::empty({length.item<int64_t>()}, torch::kUInt8);
  if (rank() == root) std::memcpy(data.data_ptr(), bytes.data(), bytes.size());
  broadcast(data, root, what);
  bytes.assign(reinterpret_cast<const char*>(data.data_ptr()), static_cast<size_t>(data.numel()));
}

std::vector<torch::Tensor> Comm::all_gather(const torch::Tensor& t, const char* what) {
  if (!impl_) return {t};
  // Sizes first, then pad every tensor to the longest and trim afterwards.
  auto sizes = all_gather_fixed(torch::tensor({t.dim() ? t.size(0) : 1}, torch::kInt64), what);
  int64_t longest = 0;
  for (auto& s : sizes) longest = std::max(longest, s.item<int64_t>());
  torch::Tensor flat = t.dim() ? t : t.reshape({1});
  std::vector<int64_t> shape{longest};
  for (int64_t d = 1; d < flat.dim(); ++d) shape.push_back(flat.size(d));
  auto padded = torch::zeros(shape, t.options());
  if (flat.size(0) > 0) padded.narrow(0, 0, flat.size(0)).copy_(flat);
  auto parts = all_gather_fixed(padded, what);
  for (size_t r = 0; r < parts.size(); ++r) parts[r] = parts[r].narrow(0, 0, sizes[r].item<int64_t>());
  return parts;
}

std::vector<torch::Tensor> Comm::gather(const torch::Tensor& t, int root, const char* what) {
  if (!impl_) return {t};
  // As all_gather: sizes first (to every rank: a few bytes), then every
  // tensor padded to the longest, to the root alone; on the host (Gloo).
  auto sizes = all_gather_fixed(torch::tensor({t.dim() ? t.size(0) : 1}, torch::kInt64), what);
  int64_t longest = 0;
  for (auto& s : sizes) longest = std::max(longest, s.item<int64_t>());
  torch::Tensor flat = (t.dim() ? t : t.reshape({1})).to(torch::kCPU);
  std::vector<int64_t> shape{longest};
  for (int64_t d = 1; d < flat.dim(); ++d) shape.push_back(flat.size(d));
  auto padded = torch::zeros(shape, flat.options());
  if (flat.size(0) > 0) padded.narrow(0, 0, flat.size(0)).copy_(flat);
  std::vector<std::vector<torch::Tensor>> out;
  if (rank() == root) {
    out.emplace_back();
    for (int r = 0; r < size(); ++r) out[0].push_back(torch::empty_like(padded));
  }
  std::vector<torch::Tensor> in{padded};
  c10d::GatherOptions o;
  o.rootRank = root;
  impl_->wait(what, impl_->pg->gather(out, in, o));
  if (rank() != root) return {};
  for (size_t r = 0; r < out[0].size(); ++r) {
    out[0][r] = out[0][r].narrow(0, 0, sizes[r].item<int64_t>()).to(t.device());
  }
  return out[0];
}

std::vector<torch::Tensor> Comm::all_gather_fixed(const torch::Tensor& t, const char* what) {
  std::vector<std::vector<torch::Tensor>> out(1);
  for (int r = 0; r < size(); ++r) out[0].push_back(torch::empty_like(t));
  // On the host (Gloo): gathered values are read there.
  std::vector<torch::Tensor> in{t.to(torch::kCPU).contiguous()};
  for (auto& o : out[0]) o = o.to(torch::kCPU);
  impl_->wait(what, impl_->pg->allgather(out, in));
  if (t.is_cuda()) {
    for (auto& o : out[0]) o = o.to(t.device());
  }
  return out[0];
}

std::function<std::vector<torch::Tensor>()> Comm::all_gather_async(const torch::Tensor& t, const char* what) {
  if (!impl_) return [t] { return std::vector<torch::Tensor>{t}; };
  auto out = std::make_shared<std::vector<std::vector<torch::Tensor>>>(1);
  torch::Tensor in = t.to(torch::kCPU).contiguous();
  for (int r = 0; r < size(); ++r) (*out)[0].push_back(torch::empty_like(in));
  std::vector<torch::Tensor> inputs{in};
  auto work = impl_->pg->allgather(*out, inputs);
  Impl* impl = impl_.get();
  return [impl, work, what, out, in] {
    impl->wait(what, work);
    return (*out)[0];
  };
}

void Comm::barrier(const char* what) {
  if (!impl_) return;
  impl_->wait(what, impl_->pg->barrier());
}

void Comm::agree(const std::vector<int64_t>& values, const std::vector<std::string>& names, const char* what,
                 const std::string& hint) {
  COHORT_CHECK(values.size() == names.size(), Error, "agree: ", values.size(), " values for ", names.size(), " names");
  if (!impl_) return;
  auto parts = all_gather_fixed(torch::tensor(values, torch::kInt64), what);
  std::string diff;
  for (int r = 1; r < size(); ++r) {
    for (size_t i = 0; i < values.size(); ++i) {
      int64_t theirs = parts[r][i].item<int64_t>(), base = parts[0][i].item<int64_t>();
      if (theirs != base) {
        diff += detail::cat(diff.empty() ? "" : "; ", "rank ", r, " has ", names[i], " ", theirs, " but rank 0 has ", base);
      }
    }
  }
  if (diff.empty()) return;
  if (!hint.empty()) throw UsageError(detail::cat("ranks differ at ", what, ": ", diff, ". ", hint));
  throw DistError(detail::cat("ranks diverged at ", what, ": ", diff));
}

}  // namespace cohort
