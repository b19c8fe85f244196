#include "cohort/launch/launcher.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cohort/core/error.hpp"
#include "cohort/distributed/membership.hpp"
#include "cohort/distributed/rendezvous.hpp"
#include "cohort/distributed/store.hpp"
#include "cohort/train/lifecycle/run_dir.hpp"

// launch_node runs in three stages, each with one job:
//   planning     plan_node     what this node starts: its ranks, where its workers meet
//   meeting      meet_nodes,   what the nodes' launchers settle together: the ranks the
//                agree_job_id  flags leave open, the job's store and the job's id
//   supervising  Supervisor    starting the workers, watching them, restarts, the exit code

namespace cohort {

namespace {

using Clock = std::chrono::steady_clock;

std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

// A stop signal waiting in `watched` (blocked, so it waits), taken off;
// 0 when none. SIGCHLD stays pending for the supervision loop.
int pending_stop(const sigset_t& watched) {
  sigset_t pending;
  sigpending(&pending);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    if (!sigismember(&pending, sig) || !sigismember(&watched, sig)) continue;
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    timespec now{0, 0};
    sigtimedwait(&one, nullptr, &now);
    return sig;
  }
  return 0;
}

// The signals the launcher supervises, blocked while it lives (sigtimedwait
// collects them); the mask before is restored when it ends.
class BlockedSignals {
 public:
  BlockedSignals() {
    sigemptyset(&watched_);
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&watched_, s);
    pthread_sigmask(SIG_BLOCK, &watched_, &old_);
  }
  ~BlockedSignals() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  BlockedSignals(const BlockedSignals&) = delete;
  BlockedSignals& operator=(const BlockedSignals&) = delete;

  const sigset_t& watched() const { return watched_; }
  const sigset_t& old() const { return old_; }  // the mask before: the workers'

 private:
  sigset_t watched_, old_;
};

// ---- Planning ---------------------------------------------------------------

// This node's part of the job. Planning fills it from the flags; meeting
// the other nodes completes the ranks and the store.
struct Plan {
  InitMethod method;  // --init-method, parsed
  int first_rank = 0;
  int world_size = 1;
  std::string init;  // what workers connect to
  bool node_zero = false;  // the first rank of the job is here
  c10::intrusive_ptr<c10d::Store> store;  // held until the workers are done
};

// What the flags alone say, before any other node is heard from. Without
// an init method (one node) the launcher hosts a private store on 127.0.0.1.
Plan plan_node(const LaunchOptions& o, std::chrono::milliseconds timeout) {
  // Resolve the ranks of this node and the store workers meet at.
  Plan plan;
  plan.method = parse_init_method(o.init_method);
  const InitMethod& init = plan.method;
  COHORT_CHECK(init.kind != InitMethod::Kind::kTcp || resolves(init.host), UsageError, "init method ", init.text,
               ": host '", init.host, "' does not resolve to an address");
  COHORT_CHECK(o.world_size == 0 || o.first_rank >= 0, UsageError,
               "--distributed-world-size needs --distributed-rank (the first global rank on this node)");
  COHORT_CHECK(o.first_rank < 0 || o.world_size > 0, UsageError,
               "--distributed-rank needs --distributed-world-size (the total number of ranks)");
  if (init.kind == InitMethod::Kind::kNone) {
    bool one_node = o.nnodes == 1 && o.first_rank <= 0 && (o.world_size == 0 || o.world_size == o.nproc_per_node);
    COHORT_CHECK(one_node, UsageError,
                 "a multi-node run needs --init-method tcp://HOST:PORT or file:///shared/path");
    auto tcp = open_tcp_store("127.0.0.1", /*port=*/0, /*server=*/true, timeout);
    plan.init = detail::cat("tcp://127.0.0.1:", tcp->getPort());
    plan.store = tcp;
  } else {
    COHORT_CHECK(init.kind != InitMethod::Kind::kEnv, UsageError,
                 "--init-method env:// is for processes started by another launcher; with --nproc-per-node use "
                 "tcp://HOST:PORT or file:///PATH");
    plan.init = init.text;
  }

  if (o.first_rank >= 0) {
    COHORT_CHECK(o.world_size >= o.first_rank + o.nproc_per_node, UsageError, "--distributed-rank ", o.first_rank,
                 " + ", o.nproc_per_node, " local rank(s) exceeds --distributed-world-size ", o.world_size);
    plan.first_rank = o.first_rank;
    plan.world_size = o.world_size;
  } else if (o.nnodes == 1) {
    plan.world_size = o.nproc_per_node;
  }
  plan.node_zero = o.first_rank >= 0 ? o.first_rank == 0 : o.node_rank == 0;
  return plan;
}

// ---- Meeting the other nodes ------------------------------------------------

// Node `n` published its rank count: refuses it when its --nnodes differs.
void check_same_nnodes(const LaunchOptions& o, const Plan& plan, const sigset_t& watched, int n,
                       Clock::time_point deadline) {
  const auto& store = plan.store;
  auto theirs = store->get(detail::cat("launch/nnodes/", n));
  int their_nnodes = std::stoi(std::string(theirs.begin(), theirs.end()));
  if (their_nnodes != o.nnodes) {
    // The store's host lingers until another node has seen the
    // mismatch too (or the meeting's deadline), so that it is told
    // and not cut off, however slow it is to look.
    int64_t seen = store->add("launch/nnodes-mismatch", 1);
    while (plan.method.kind == InitMethod::Kind::kTcp && plan.node_zero && seen < 2 && Clock::now() < deadline &&
           !pending_stop(watched)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      seen = store->add("launch/nnodes-mismatch", 0);
    }
    throw UsageError(detail::cat("node ", o.node_rank, ": --nnodes differs between nodes: this node has --nnodes ",
                                 o.nnodes, " but node ", n, " has --nnodes ", their_nnodes,
                                 "; start every node with the same --nnodes"));
  }
}

// Heterogeneous nodes: every launcher publishes its rank count, and each
// node's range starts after the ranks of the nodes before it. Returns the
// stop signal that ended the meeting, or 0.
int sum_node_ranks(const LaunchOptions& o, const sigset_t& watched, std::chrono::milliseconds timeout, Plan& plan) {
  const InitMethod& init = plan.method;
  auto& store = plan.store;
  try {
    if (!store && init.kind == InitMethod::Kind::kTcp) {
      store = open_tcp_store(init.host, init.port, /*server=*/false, timeout);
    } else if (!store) {
      store = c10::make_intrusive<c10d::FileStore>(init.path + ".nodes", o.nnodes);
      store->setTimeout(timeout);
    }
    // --nnodes first: a node that sees another's rank count sees its
    // --nnodes too, so that nodes started with different counts are told
    // at once instead of waiting dist.timeout for a node that never comes.
    store->set(detail::cat("launch/nnodes/", o.node_rank), bytes(std::to_string(o.nnodes)));
    store->set(detail::cat("launch/node/", o.node_rank), bytes(std::to_string(o.nproc_per_node)));
    plan.world_size = 0;
    const auto deadline = Clock::now() + timeout;
    for (int n = 0; n < o.nnodes; ++n) {
      std::string key = detail::cat("launch/node/", n);
      while (!store->check({key})) {
        if (int sig = pending_stop(watched)) {
          std::fprintf(stderr, "cohort: node %d: %s while the nodes were meeting; stopped\n", o.node_rank,
                       strsignal(sig));
          return sig;
        }
        COHORT_CHECK(Clock::now() < deadline, DistError, "node ", o.node_rank, ": the ", o.nnodes,
                     " nodes did not all meet at ", init.text, " within ", o.timeout_s, " s: node ", n,
                     " never arrived (check --nnodes and --node-rank on every node)");
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      check_same_nnodes(o, plan, watched, n, deadline);
      auto v = store->get(key);
      int count = std::stoi(std::string(v.begin(), v.end()));
      if (n < o.node_rank) plan.first_rank += count;
      plan.world_size += count;
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw DistError(detail::cat("node ", o.node_rank, ": the ", o.nnodes, " nodes did not all meet at ", init.text,
                                " within ", o.timeout_s, " s: ", detail::first_line(e.what())));
  }
  return 0;
}

// Completes the plan with the other nodes' launchers: node 0 hosts the
// job's store, the ranks the flags leave open are settled (provisionally
// when elastic: the workers settle them), and every launcher holds the
// store the restart generation is kept in. Returns the stop signal that
// ended the meeting, or 0.
int meet_nodes(const LaunchOptions& o, const sigset_t& watched, std::chrono::milliseconds timeout, Plan& plan) {
  const InitMethod& init = plan.method;
  if (init.kind == InitMethod::Kind::kTcp && plan.node_zero) {
    // Node 0's launcher hosts the store for the whole job: it outlives any
    // single worker.
    try {
      plan.store = open_tcp_store(init.host, init.port, /*server=*/true, timeout);
    } catch (const std::exception& e) {
      throw DistError(detail::cat("cannot host the rendezvous store at ", init.text, ": ",
                                  detail::first_line(e.what()), ". Is the port in use? Pick another port."));
    }
  }

  if (o.min_nodes > 0) {
    COHORT_CHECK(init.kind == InitMethod::Kind::kTcp && o.first_rank < 0, UsageError,
                 "elastic training (--min-nodes) needs --init-method tcp://HOST:PORT and --node-rank, not ",
                 o.first_rank >= 0 ? "--distributed-rank" : init.kind == InitMethod::Kind::kNone ? "no init method" : init.text);
    // Ranks are the workers' to agree on, world by world; these are
    // provisional (the environment needs some).
    plan.first_rank = o.node_rank * o.nproc_per_node;
    plan.world_size = plan.first_rank + o.nproc_per_node;
  } else if (o.first_rank < 0 && o.nnodes > 1) {
    if (int sig = sum_node_ranks(o, watched, timeout, plan)) return sig;
  }
  if (!plan.store && init.kind == InitMethod::Kind::kTcp) {
    // HetSeq's explicit ranks: this launcher still needs the job's store
    // for the restart generation.
    try {
      plan.store = open_tcp_store(init.host, init.port, /*server=*/false, timeout);
    } catch (const std::exception& e) {
      throw DistError(detail::cat("node ", o.node_rank, ": cannot reach the rendezvous store at ", init.text,
                                  " within ", o.timeout_s, " s: ", detail::first_line(e.what())));
    }
  }
  return 0;
}

// The line that says what this node runs and where its workers meet.
void announce(const LaunchOptions& o, const Plan& plan) {
  if (o.min_nodes > 0) {
    std::fprintf(stderr, "cohort: node %d: %d local rank(s), elastic (--nnodes %d, --min-nodes %d%s), rendezvous %s\n",
                 o.node_rank, o.nproc_per_node, o.nnodes, o.min_nodes,
                 o.max_nodes > 0 ? detail::cat(", --max-nodes ", o.max_nodes).c_str() : "", plan.init.c_str());
  } else {
    std::fprintf(stderr, "cohort: node %d: ranks %d..%d of %d, rendezvous %s\n", o.node_rank, plan.first_rank,
                 plan.first_rank + o.nproc_per_node - 1, plan.world_size, plan.init.c_str());
  }
}

// The job's id, the same for every worker on every node and in every
// restart (RUN_DIR/.lock belongs to the job, train/lifecycle/run_dir.hpp): one given
// in COHORT_JOB_ID, else the first launcher to reach the store sets it.
std::string agree_job_id(c10d::Store* store, const Env& env) {
  auto given = env.find("COHORT_JOB_ID");
  if (given != env.end() && !given->second.empty()) return given->second;
  std::string mine = RunDirLock::new_job_id();
  if (!store) return mine;  // HetSeq's ranks over file://: rank 0's node decides alone
  try {
    auto got = store->compareSet("launch/job-id", {}, bytes(mine));
    return got.empty() ? mine : std::string(got.begin(), got.end());
  } catch (const std::exception&) {
    return mine;  // the store's host is gone: the workers report it
  }
}

// ---- Supervising ------------------------------------------------------------

struct Worker {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
};

std::string describe_status(int status) {
  if (WIFEXITED(status)) return detail::cat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    return detail::cat("was killed by signal ", sig, " (", strsignal(sig), ")");
  }
  return "stopped";
}

// The state letter of /proc/PID/stat ('T': stopped), or 0.
char process_state(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : 0;
}

const char* ordinal_suffix(int n) {
  if (n % 100 >= 11 && n % 100 <= 13) return "th";
  return n % 10 == 1 ? "st" : n % 10 == 2 ? "nd" : n % 10 == 3 ? "rd" : "th";
}

// The job's restart generation, in the store every launcher shares (none
// for file:// with HetSeq's explicit ranks: then each node counts its own).
class Generation {
 public:
  explicit Generation(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  // The newest generation any node started; -1 when unknown.
  int current() {
    if (!store_) return -1;
    try {
      if (!store_->check({kKey})) return 0;
      auto v = store_->get(kKey);
      return std::stoi(std::string(v.begin(), v.end()));
    } catch (const std::exception&) {
      return -1;  // the store's host is gone: the workers report it
    }
  }

  // Moves the job past `generation`: to generation + 1, or to a newer one
  // another node started already. Returns the generation to start.
  int advance_past(int generation) {
    if (!store_) return generation + 1;
    try {
      for (;;) {
        int now = current();
        if (now < 0) return generation + 1;
        if (now > generation) return now;
        std::string expected = store_->check({kKey}) ? std::to_string(now) : "";
        std::string want = std::to_string(generation + 1);
        auto got = store_->compareSet(kKey, bytes(expected), bytes(want));
        if (std::string(got.begin(), got.end()) == want) return generation + 1;
      }
    } catch (const std::exception&) {
      return generation + 1;
    }
  }

 private:
  static constexpr const char* kKey = "launch/generation";
  c10::intrusive_ptr<c10d::Store> store_;
};

// Elastic: whether the job's ranks said they finished.
bool job_finished(c10d::Store* store) {
  try {
    return store && store->check({"launch/done"});
  } catch (const std::exception&) {
    return false;
  }
}

// Elastic, node 0: hosts the store while the other nodes' ranks work (their
// heartbeats move a counter), until they finish or a stop signal.
void keep_hosting(c10d::Store& store, const sigset_t& watched, int node_rank) {
  int64_t last = -1;
  Clock::time_point moved = Clock::now();
  for (;;) {
    if (pending_stop(watched) || job_finished(&store)) return;
    int64_t beats = store.add("launch/beat", 0);
    if (beats != last) {
      last = beats;
      moved = Clock::now();
    } else if (Clock::now() - moved > std::chrono::seconds(10)) {
      std::fprintf(stderr, "cohort: node %d: no rank of the job has beaten for 10 s; closing the store\n", node_rank);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

// Starts this node's workers, generation by generation, watches them and
// decides the exit code (launcher.hpp has the policy). Each generation
// starts every local rank afresh; a rank that fails takes the others on
// this node with it.
class Supervisor {
 public:
  Supervisor(const LaunchOptions& o, const Plan& plan, const BlockedSignals& signals,
             const std::vector<std::string>& argv, Env base_env, std::string job_id);
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;
  ~Supervisor();

  // Runs the workers to completion; returns the exit code for main.
  int run();

 private:
  // One generation's watch over its workers.
  struct Watch {
    int running = 0;
    const Worker* failed = nullptr;
    Clock::time_point kill_at = Clock::time_point::max();
    Clock::time_point next_poll;
  };

  bool run_generations();
  const Worker* run_generation(int generation);
  int start_workers(int generation);
  Env worker_env(int generation, const Worker& w) const;
  pid_t spawn(const Env& env);
  const Worker* watch_workers(int generation, int started);
  void forward_stop(int sig, Watch& watch);
  void reap_workers(Watch& watch);
  void poll_job(int generation, int running);
  void signal_all(int sig);
  int report_failure() const;
  int report_interrupt() const;
  std::string error_file(const Worker& w) const;

  const LaunchOptions& o_;
  const Plan& plan_;
  const sigset_t& watched_;
  const sigset_t& old_mask_;
  const bool elastic_;
  // Everything a child touches between fork and exec is prepared here:
  // only async-signal-safe calls happen in the child.
  std::vector<std::string> argv_copy_;
  std::vector<char*> args_;
  const pid_t launcher_pid_;
  const Env base_env_;
  const std::string job_id_;
  Generation job_generation_;

  std::vector<Worker> workers_;
  const Worker* failed_ = nullptr;  // in workers_
  int interrupted_ = 0;
  int stopped_rank_ = -1;   // a worker found stopped when another failed
  int superseded_by_ = -1;  // a newer generation another node started
  int incarnation_ = 0;     // elastic: this node's joins, for its node key
  Clock::time_point done_seen_ = Clock::time_point::max();  // elastic: when the job was seen finished
  // COHORT_ERROR_FILE: where each worker leaves its error line, so that the
  // launcher's last line can say what went wrong. Removed at the end.
  std::string error_dir_;
};

Supervisor::Supervisor(const LaunchOptions& o, const Plan& plan, const BlockedSignals& signals,
                       const std::vector<std::string>& argv, Env base_env, std::string job_id)
    : o_(o),
      plan_(plan),
      watched_(signals.watched()),
      old_mask_(signals.old()),
      elastic_(o.min_nodes > 0),
      argv_copy_(argv),
      launcher_pid_(getpid()),
      base_env_(std::move(base_env)),
      job_id_(std::move(job_id)),
      job_generation_(plan.store) {
  for (auto& a : argv_copy_) args_.push_back(a.data());
  args_.push_back(nullptr);
  char dir[] = "/tmp/cohort-errors-XXXXXX";
  if (mkdtemp(dir) != nullptr) error_dir_ = dir;  // else the last line goes without the cause
}

Supervisor::~Supervisor() {
  if (error_dir_.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(error_dir_, ec);
}

std::string Supervisor::error_file(const Worker& w) const {
  return error_dir_.empty() ? std::string() : detail::cat(error_dir_, "/rank-", w.rank);
}

int Supervisor::run() {
  if (!run_generations()) return 1;
  // Elastic: exit 2 or 3 ends the job everywhere; any other failure is this node's alone.
  const bool job_wide = failed_ && WIFEXITED(failed_->status) &&
                        (WEXITSTATUS(failed_->status) == 2 || WEXITSTATUS(failed_->status) == 3);
  if (failed_ && !job_wide && !interrupted_ && elastic_ && plan_.node_zero && plan_.store) {
    // The others may go on without this node, but they need its store.
    std::fprintf(stderr, "cohort: node %d: this node's rank(s) left the job; hosting the rendezvous store until "
                 "the others finish\n", o_.node_rank);
    keep_hosting(*plan_.store, watched_, o_.node_rank);
  }
  if (failed_) return report_failure();
  if (interrupted_) return report_interrupt();
  return 0;
}

// Runs generations until the job ends here: a stop signal, success, a
// failure with no restart left, or (returns false) another node restarting
// the job past --max-restarts.
bool Supervisor::run_generations() {
  int rejoins = 0;  // elastic: times this node joined again after its rank failed
  for (int generation = 0;;) {
    workers_.assign(static_cast<size_t>(o_.nproc_per_node), Worker{});
    superseded_by_ = -1;
    failed_ = run_generation(generation);
    if (superseded_by_ > generation && !interrupted_) {
      if (superseded_by_ > o_.max_restarts) {
        std::fprintf(stderr, "cohort: error: node %d: another node restarted the job a %d%s time, past "
                     "--max-restarts %d; stopped\n", o_.node_rank, superseded_by_, ordinal_suffix(superseded_by_),
                     o_.max_restarts);
        return false;
      }
      std::fprintf(stderr, "cohort: node %d: another node restarted the job (generation %d); restarting all %d "
                   "local rank(s) to join it\n", o_.node_rank, superseded_by_, o_.nproc_per_node);
      generation = superseded_by_;
      continue;
    }
    bool usage_error = failed_ && WIFEXITED(failed_->status) && WEXITSTATUS(failed_->status) == 2;
    bool below_min = failed_ && WIFEXITED(failed_->status) && WEXITSTATUS(failed_->status) == 3;
    if (elastic_ && failed_ && !interrupted_ && !usage_error && !below_min) {
      // This node left the job; the others go on without it. It joins again
      // as a newcomer while restarts are left.
      if (++rejoins > o_.max_restarts) break;
      std::fprintf(stderr, "cohort: node %d: rank %d %s; this node left the job and joins it again (%d of %d)\n",
                   o_.node_rank, failed_->rank, describe_status(failed_->status).c_str(), rejoins, o_.max_restarts);
      stopped_rank_ = -1;
      continue;
    }
    if (!failed_ || interrupted_ || usage_error || generation >= o_.max_restarts) break;
    int next = job_generation_.advance_past(generation);
    if (next > o_.max_restarts) break;
    std::fprintf(stderr, "cohort: node %d: rank %d %s%s; restarting all %d local rank(s) from the latest checkpoint "
                 "(restart %d of %d)\n", o_.node_rank, failed_->rank, describe_status(failed_->status).c_str(),
                 below_min ? " (fewer than --min-nodes remain)" : "", o_.nproc_per_node, next, o_.max_restarts);
    generation = next;
    stopped_rank_ = -1;
  }
  return true;
}

// Starts and watches the workers of `generation`; returns the first that
// failed, or nullptr.
const Worker* Supervisor::run_generation(int generation) {
  ++incarnation_;
  int started = start_workers(generation);
  return watch_workers(generation, started);
}

// Starts the local ranks, until a stop signal; returns how many started.
int Supervisor::start_workers(int generation) {
  int started = 0;
  for (int local = 0; local < o_.nproc_per_node; ++local) {
    if (int sig = pending_stop(watched_)) {  // watch_workers stops those started
      interrupted_ = sig;
      break;
    }
    Worker& w = workers_[static_cast<size_t>(local)];
    w.local_rank = local;
    w.rank = plan_.first_rank + local;
    w.pid = spawn(worker_env(generation, w));
    w.running = true;
    ++started;
  }
  return started;
}

// A worker's environment: the launcher's, and its place in the job.
Env Supervisor::worker_env(int generation, const Worker& w) const {
  Env env = base_env_;
  env["COHORT_RANK"] = std::to_string(w.rank);
  env["COHORT_WORLD_SIZE"] = std::to_string(plan_.world_size);
  env["COHORT_LOCAL_RANK"] = std::to_string(w.local_rank);
  env["COHORT_LOCAL_WORLD_SIZE"] = std::to_string(o_.nproc_per_node);
  env["COHORT_NODE_RANK"] = std::to_string(o_.node_rank);
  env["COHORT_INIT_METHOD"] = plan_.init;
  env["COHORT_GENERATION"] = std::to_string(generation);
  env["COHORT_JOB_ID"] = job_id_;
  if (!error_dir_.empty()) {
    env["COHORT_ERROR_FILE"] = error_file(w);
    ::unlink(error_file(w).c_str());  // a previous generation's
  }
  if (elastic_) {
    ElasticOptions eo;
    eo.nnodes = o_.nnodes;
    eo.min_nodes = o_.min_nodes;
    eo.max_nodes = o_.max_nodes;
    env["COHORT_ELASTIC"] = elastic_env(eo);
    env["COHORT_NODE_KEY"] = detail::cat(o_.node_rank, "-", launcher_pid_, "-", incarnation_);
  }
  return env;
}

// Forks and execs one worker: this binary again, with `env`.
pid_t Supervisor::spawn(const Env& env) {
  std::vector<std::string> env_strings;
  for (auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  pid_t pid = fork();
  COHORT_CHECK(pid >= 0, Error, "fork failed: ", std::strerror(errno));
  if (pid == 0) {
    setpgid(0, 0);  // signals reach workers only through the launcher
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher_pid_) _exit(1);  // the launcher died already
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
    execve("/proc/self/exe", args_.data(), envp.data());
    _exit(127);
  }
  return pid;
}

// Watches the `started` workers of `generation` until none runs; returns
// the first that failed, or nullptr.
const Worker* Supervisor::watch_workers(int generation, int started) {
  Watch watch;
  watch.next_poll = Clock::now() + std::chrono::seconds(1);
  watch.running = started;
  if (interrupted_ && watch.running > 0) {
    std::fprintf(stderr, "cohort: node %d: %s received while starting the workers; stopping the %d started\n",
                 o_.node_rank, strsignal(interrupted_), watch.running);
    signal_all(SIGTERM);
    watch.kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o_.stop_grace_s * 1000));
  }
  while (watch.running > 0) {
    timespec tick{0, 200 * 1000 * 1000};
    siginfo_t info;
    int sig = sigtimedwait(&watched_, &info, &tick);
    forward_stop(sig, watch);
    reap_workers(watch);
    if (watch.running > 0 && Clock::now() >= watch.kill_at) {
      signal_all(SIGKILL);
      watch.kill_at = Clock::time_point::max();
    }
    if (watch.running > 0 && !interrupted_ && !watch.failed && superseded_by_ < 0 && Clock::now() >= watch.next_poll) {
      // Another node restarted the job: its ranks wait in the newer
      // generation, so these leave the old one at once.
      watch.next_poll = Clock::now() + std::chrono::seconds(1);
      poll_job(generation, watch.running);
    }
  }

  return watch.failed;
}

// `sig` from sigtimedwait: a first stop signal lets the workers checkpoint
// and stop, a second kills them.
void Supervisor::forward_stop(int sig, Watch& watch) {
  if ((sig == SIGINT || sig == SIGTERM || sig == SIGHUP) && interrupted_) {
    std::fprintf(stderr, "cohort: node %d: second %s: killing the workers now\n", o_.node_rank, strsignal(sig));
    signal_all(SIGKILL);
  } else if ((sig == SIGINT || sig == SIGTERM || sig == SIGHUP) && !interrupted_) {
    interrupted_ = sig;
    std::fprintf(stderr, "cohort: node %d: %s received; %d worker(s) checkpoint and stop\n", o_.node_rank,
                 strsignal(sig), watch.running);
    signal_all(SIGTERM);
    watch.kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o_.stop_grace_s * 1000));
  }
}

// Collects the workers that exited. The first to fail (unless the node is
// stopping, or leaving for a newer generation) takes the others with it.
void Supervisor::reap_workers(Watch& watch) {
  for (;;) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;
    for (auto& w : workers_) {
      if (w.pid != pid || !w.running) continue;
      w.running = false;
      w.status = status;
      --watch.running;
      bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && !watch.failed && !interrupted_ && superseded_by_ < 0) {
        watch.failed = &w;
        // A rank that fails because another was stopped (SIGSTOP, a
        // debugger) is not the culprit: name the stopped one.
        for (auto& other : workers_) {
          char state = other.running ? process_state(other.pid) : 0;
          if (state == 'T' || state == 't') stopped_rank_ = other.rank;  // t: stopped by a debugger
        }
        // The others may be blocked in a collective with the dead rank;
        // their state is in the last checkpoint, so stop them at once.
        if (watch.running > 0) signal_all(SIGKILL);
      }
    }
  }
}

// Once a second while `generation` runs: leaves it when the elastic job
// finished without these ranks or another node started a newer one.
void Supervisor::poll_job(int generation, int running) {
  if (elastic_ && job_finished(plan_.store.get())) {
    // Ranks the finished job left behind (stopped, or never admitted)
    // get 10 s to notice, then go.
    if (done_seen_ == Clock::time_point::max()) done_seen_ = Clock::now();
    if (Clock::now() - done_seen_ > std::chrono::seconds(10)) {
      std::fprintf(stderr, "cohort: node %d: the job finished without %d rank(s) of this node; stopping them\n",
                   o_.node_rank, running);
      signal_all(SIGKILL);
    }
  }
  int newest = job_generation_.current();
  if (newest > generation) {
    superseded_by_ = newest;
    signal_all(SIGKILL);
  }
}

void Supervisor::signal_all(int sig) {
  for (auto& w : workers_) {
    if (!w.running) continue;
    kill(w.pid, sig);
    if (sig == SIGTERM) kill(w.pid, SIGCONT);  // a stopped worker must wake to die
  }
}

// The error line for the rank that failed; exit 2 when it refused its
// usage, else 1.
int Supervisor::report_failure() const {
  if (stopped_rank_ >= 0) {
    std::fprintf(stderr, "cohort: error: rank %d (node %d) was stopped (SIGSTOP or a debugger) and stopped "
                 "responding; rank %d then %s; stopped the rank(s) on this node\n", stopped_rank_, o_.node_rank,
                 failed_->rank, describe_status(failed_->status).c_str());
    return 1;
  }
  // The worker's own error line, when it left one: the cause, last.
  std::string cause;
  if (std::ifstream in(error_file(*failed_)); in && std::getline(in, cause) && !cause.empty()) {
    const std::string self = detail::cat("rank ", failed_->rank, ": ");
    if (cause.rfind(self, 0) == 0) cause.erase(0, self.size());  // named already
    cause = ": " + cause;
  }
  std::fprintf(stderr, "cohort: error: rank %d (node %d, local rank %d, pid %d) %s%s; stopped the other %d rank(s) "
               "on this node\n", failed_->rank, o_.node_rank, failed_->local_rank, static_cast<int>(failed_->pid),
               describe_status(failed_->status).c_str(), cause.c_str(), o_.nproc_per_node - 1);
  return WIFEXITED(failed_->status) && WEXITSTATUS(failed_->status) == 2 ? 2 : 1;
}

// After a stop signal: says whether every rank checkpointed; exit 128 + the signal.
int Supervisor::report_interrupt() const {
  bool clean = true, before_training = true, any_started = false;
  for (const auto& w : workers_) {
    any_started = any_started || w.pid >= 0;
    if (w.pid < 0) continue;  // the signal came before it was started
    clean = clean && WIFEXITED(w.status) && WEXITSTATUS(w.status) == 0;
    before_training = before_training && WIFEXITED(w.status) && WEXITSTATUS(w.status) == 128 + interrupted_;
  }
  if (!any_started || (!clean && before_training)) {
    std::fprintf(stderr, "cohort: node %d: stopped by %s before training began\n", o_.node_rank,
                 strsignal(interrupted_));
  } else if (clean) {
    std::fprintf(stderr, "cohort: node %d: stopped by %s after every rank checkpointed; continue with --resume\n",
                 o_.node_rank, strsignal(interrupted_));
  } else {
    std::fprintf(stderr, "cohort: error: node %d: interrupted by %s and not every rank stopped cleanly\n",
                 o_.node_rank, strsignal(interrupted_));
  }
  return 128 + interrupted_;
}

}  // namespace

bool wants_launcher(const LaunchOptions& o) {
  // Anything but one plain process goes through launch_node, which also
  // refuses the values that make no sense (0 ranks, negative restarts).
  return o.nproc_per_node != 1 || o.nnodes != 1 || o.first_rank >= 0 || o.world_size > 0 || o.max_restarts != 0 ||
         o.min_nodes != 0;
}

void validate(const LaunchOptions& o) {
  COHORT_CHECK(o.nproc_per_node >= 1, UsageError, "--nproc-per-node must be >= 1 (got ", o.nproc_per_node, ")");
  COHORT_CHECK(o.nnodes >= 1, UsageError, "--nnodes must be >= 1 (got ", o.nnodes, ")");
  COHORT_CHECK(o.max_restarts >= 0, UsageError, "--max-restarts must be >= 0 (got ", o.max_restarts, ")");
  const bool elastic = o.min_nodes > 0;
  COHORT_CHECK(o.min_nodes >= 0 && o.min_nodes <= o.nnodes, UsageError, "--min-nodes ", o.min_nodes,
               " must be between 1 and --nnodes ", o.nnodes, " (0: not elastic)");
  COHORT_CHECK(o.max_nodes == 0 || (elastic && o.max_nodes >= o.nnodes), UsageError, "--max-nodes ", o.max_nodes,
               elastic ? detail::cat(" is less than --nnodes ", o.nnodes) : std::string(" needs --min-nodes"));
  COHORT_CHECK(o.node_rank >= 0 && (o.node_rank < o.nnodes || (elastic && (o.max_nodes == 0 || o.node_rank < o.max_nodes))),
               UsageError, "--node-rank ", o.node_rank, " is outside --nnodes ", o.nnodes,
               elastic ? " and --max-nodes" : "");
  COHORT_CHECK(o.world_size == 0 || o.world_size >= 1, UsageError, "--distributed-world-size must be >= 1 (got ",
               o.world_size, ")");
  COHORT_CHECK(o.first_rank >= -1, UsageError, "--distributed-rank must be >= 0 (got ", o.first_rank, ")");
  COHORT_CHECK(o.oversubscribe || o.max_local_ranks <= 0 || o.nproc_per_node <= o.max_local_ranks, UsageError,
               "--nproc-per-node ", o.nproc_per_node, " is more than the ", o.max_local_ranks, " ", o.local_units,
               " of this node; pass --oversubscribe to start them anyway");
  parse_init_method(o.init_method);  // its form; UsageError naming it
}

int launch_node(const LaunchOptions& o, const std::vector<std::string>& argv) {
  validate(o);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));

  // Block the signals we supervise before any thread exists (the store's
  // server thread inherits the mask); the supervisor collects them with
  // sigtimedwait. Declared first, so the mask is restored last, after the
  // store is closed.
  const BlockedSignals signals;

  Plan plan = plan_node(o, timeout);
  if (int sig = meet_nodes(o, signals.watched(), timeout, plan)) return 128 + sig;
  announce(o, plan);

  const Env base_env = process_env();
  const std::string job_id = agree_job_id(plan.store.get(), base_env);
  Supervisor supervisor(o, plan, signals, argv, base_env, job_id);
  return supervisor.run();
}

}  // namespace cohort
