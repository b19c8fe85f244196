#include "cohort/launch/launcher.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "cohort/core/error.hpp"
#include "cohort/distributed/membership.hpp"
#include "cohort/distributed/rendezvous.hpp"
#include "cohort/distributed/store.hpp"
#include "cohort/train/run_dir.hpp"

namespace cohort {

namespace {

using Clock = std::chrono::steady_clock;

struct Plan {
  int first_rank = 0;
  int world_size = 1;
  std::string init;  // what workers connect to
};

struct Worker {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
};

std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

std::string describe_status(int status) {
  if (WIFEXITED(status)) return detail::cat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    return detail::cat("was killed by signal ", sig, " (", strsignal(sig), ")");
  }
  return "stopped";
}

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

// The job's id, the same for every worker on every node and in every
// restart (RUN_DIR/.lock belongs to the job, train/run_dir.hpp): one given
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
  const bool elastic = o.min_nodes > 0;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));

  // Block the signals we supervise before any thread exists (the store's
  // server thread inherits the mask); sigtimedwait collects them below.
  sigset_t watched, old;
  sigemptyset(&watched);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&watched, s);
  pthread_sigmask(SIG_BLOCK, &watched, &old);
  struct RestoreMask {
    sigset_t mask;
    ~RestoreMask() { pthread_sigmask(SIG_SETMASK, &mask, nullptr); }
  } restore{old};

  // Resolve the ranks of this node and the store workers meet at.
  Plan plan;
  InitMethod init = parse_init_method(o.init_method);
  COHORT_CHECK(init.kind != InitMethod::Kind::kTcp || resolves(init.host), UsageError, "init method ", init.text,
               ": host '", init.host, "' does not resolve to an address");
  c10::intrusive_ptr<c10d::Store> store;  // held until the workers are done
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
    store = tcp;
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
  bool node_zero = o.first_rank >= 0 ? o.first_rank == 0 : o.node_rank == 0;

  if (init.kind == InitMethod::Kind::kTcp && node_zero) {
    // Node 0's launcher hosts the store for the whole job: it outlives any
    // single worker.
    try {
      store = open_tcp_store(init.host, init.port, /*server=*/true, timeout);
    } catch (const std::exception& e) {
      throw DistError(detail::cat("cannot host the rendezvous store at ", init.text, ": ",
                                  detail::first_line(e.what()), ". Is the port in use? Pick another port."));
    }
  }

  if (elastic) {
    COHORT_CHECK(init.kind == InitMethod::Kind::kTcp && o.first_rank < 0, UsageError,
                 "elastic training (--min-nodes) needs --init-method tcp://HOST:PORT and --node-rank, not ",
                 o.first_rank >= 0 ? "--distributed-rank" : init.kind == InitMethod::Kind::kNone ? "no init method" : init.text);
    // Ranks are the workers' to agree on, world by world; these are
    // provisional (the environment needs some).
    plan.first_rank = o.node_rank * o.nproc_per_node;
    plan.world_size = plan.first_rank + o.nproc_per_node;
  } else if (o.first_rank < 0 && o.nnodes > 1) {
    // Heterogeneous nodes: every launcher publishes its rank count, and each
    // node's range starts after the ranks of the nodes before it.
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
            return 128 + sig;
          }
          COHORT_CHECK(Clock::now() < deadline, DistError, "node ", o.node_rank, ": the ", o.nnodes,
                       " nodes did not all meet at ", init.text, " within ", o.timeout_s, " s: node ", n,
                       " never arrived (check --nnodes and --node-rank on every node)");
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        auto theirs = store->get(detail::cat("launch/nnodes/", n));
        int their_nnodes = std::stoi(std::string(theirs.begin(), theirs.end()));
        if (their_nnodes != o.nnodes) {
          // The store's host lingers until another node has seen the
          // mismatch too (or the meeting's deadline), so that it is told
          // and not cut off, however slow it is to look.
          int64_t seen = store->add("launch/nnodes-mismatch", 1);
          while (init.kind == InitMethod::Kind::kTcp && node_zero && seen < 2 && Clock::now() < deadline &&
                 !pending_stop(watched)) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            seen = store->add("launch/nnodes-mismatch", 0);
          }
          throw UsageError(detail::cat("node ", o.node_rank, ": --nnodes differs between nodes: this node has --nnodes ",
                                       o.nnodes, " but node ", n, " has --nnodes ", their_nnodes,
                                       "; start every node with the same --nnodes"));
        }
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
  }
  if (!store && init.kind == InitMethod::Kind::kTcp) {
    // HetSeq's explicit ranks: this launcher still needs the job's store
    // for the restart generation.
    try {
      store = open_tcp_store(init.host, init.port, /*server=*/false, timeout);
    } catch (const std::exception& e) {
      throw DistError(detail::cat("node ", o.node_rank, ": cannot reach the rendezvous store at ", init.text,
                                  " within ", o.timeout_s, " s: ", detail::first_line(e.what())));
    }
  }
  Generation job_generation(store);
  if (elastic) {
    std::fprintf(stderr, "cohort: node %d: %d local rank(s), elastic (--nnodes %d, --min-nodes %d%s), rendezvous %s\n",
                 o.node_rank, o.nproc_per_node, o.nnodes, o.min_nodes,
                 o.max_nodes > 0 ? detail::cat(", --max-nodes ", o.max_nodes).c_str() : "", plan.init.c_str());
  } else {
    std::fprintf(stderr, "cohort: node %d: ranks %d..%d of %d, rendezvous %s\n", o.node_rank, plan.first_rank,
                 plan.first_rank + o.nproc_per_node - 1, plan.world_size, plan.init.c_str());
  }


  // Everything a child touches between fork and exec is prepared here:
  // only async-signal-safe calls happen in the child.
  std::vector<char*> args;
  std::vector<std::string> argv_copy = argv;
  for (auto& a : argv_copy) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t launcher_pid = getpid();

  const Env base_env = process_env();
  const std::string job_id = agree_job_id(store.get(), base_env);
  int interrupted = 0;
  int stopped_rank = -1;  // a worker found stopped when another failed
  int superseded_by = -1;  // a newer generation another node started
  int incarnation = 0;     // elastic: this node's joins, for its node key
  Clock::time_point done_seen = Clock::time_point::max();  // elastic: when the job was seen finished
  auto run_generation = [&](int generation, std::vector<Worker>& workers) -> const Worker* {
    ++incarnation;
    int started = 0;
    for (int local = 0; local < o.nproc_per_node; ++local) {
      if (int sig = pending_stop(watched)) {  // the loop below stops those started
        interrupted = sig;
        break;
      }
      Worker& w = workers[static_cast<size_t>(local)];
      w.local_rank = local;
      w.rank = plan.first_rank + local;
      Env env = base_env;
      env["COHORT_RANK"] = std::to_string(w.rank);
      env["COHORT_WORLD_SIZE"] = std::to_string(plan.world_size);
      env["COHORT_LOCAL_RANK"] = std::to_string(local);
      env["COHORT_LOCAL_WORLD_SIZE"] = std::to_string(o.nproc_per_node);
      env["COHORT_NODE_RANK"] = std::to_string(o.node_rank);
      env["COHORT_INIT_METHOD"] = plan.init;
      env["COHORT_GENERATION"] = std::to_string(generation);
      env["COHORT_JOB_ID"] = job_id;
      if (elastic) {
        ElasticOptions eo;
        eo.nnodes = o.nnodes;
        eo.min_nodes = o.min_nodes;
        eo.max_nodes = o.max_nodes;
        env["COHORT_ELASTIC"] = elastic_env(eo);
        env["COHORT_NODE_KEY"] = detail::cat(o.node_rank, "-", launcher_pid, "-", incarnation);
      }
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
        if (getppid() != launcher_pid) _exit(1);  // the launcher died already
        pthread_sigmask(SIG_SETMASK, &old, nullptr);
        execve("/proc/self/exe", args.data(), envp.data());
        _exit(127);
      }
      w.pid = pid;
      w.running = true;
      ++started;
    }

    auto signal_all = [&](int sig) {
      for (auto& w : workers) {
        if (!w.running) continue;
        kill(w.pid, sig);
        if (sig == SIGTERM) kill(w.pid, SIGCONT);  // a stopped worker must wake to die
      }
    };
    const Worker* failed = nullptr;
    Clock::time_point kill_at = Clock::time_point::max();
    Clock::time_point next_poll = Clock::now() + std::chrono::seconds(1);
    int running = started;
    if (interrupted && running > 0) {
      std::fprintf(stderr, "cohort: node %d: %s received while starting the workers; stopping the %d started\n",
                   o.node_rank, strsignal(interrupted), running);
      signal_all(SIGTERM);
      kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.stop_grace_s * 1000));
    }
    while (running > 0) {
      timespec tick{0, 200 * 1000 * 1000};
      siginfo_t info;
      int sig = sigtimedwait(&watched, &info, &tick);
      if ((sig == SIGINT || sig == SIGTERM || sig == SIGHUP) && interrupted) {
        std::fprintf(stderr, "cohort: node %d: second %s: killing the workers now\n", o.node_rank, strsignal(sig));
        signal_all(SIGKILL);
      } else if ((sig == SIGINT || sig == SIGTERM || sig == SIGHUP) && !interrupted) {
        interrupted = sig;
        std::fprintf(stderr, "cohort: node %d: %s received; %d worker(s) checkpoint and stop\n", o.node_rank,
                     strsignal(sig), running);
        signal_all(SIGTERM);
        kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.stop_grace_s * 1000));
      }
      for (;;) {
        int status = 0;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) break;
        for (auto& w : workers) {
          if (w.pid != pid || !w.running) continue;
          w.running = false;
          w.status = status;
          --running;
          bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
          if (!ok && !failed && !interrupted && superseded_by < 0) {
            failed = &w;
            // A rank that fails because another was stopped (SIGSTOP, a
            // debugger) is not the culprit: name the stopped one.
            for (auto& other : workers) {
              char state = other.running ? process_state(other.pid) : 0;
              if (state == 'T' || state == 't') stopped_rank = other.rank;  // t: stopped by a debugger
            }
            // The others may be blocked in a collective with the dead rank;
            // their state is in the last checkpoint, so stop them at once.
            if (running > 0) signal_all(SIGKILL);
          }
        }
      }
      if (running > 0 && Clock::now() >= kill_at) {
        signal_all(SIGKILL);
        kill_at = Clock::time_point::max();
      }
      if (running > 0 && !interrupted && !failed && superseded_by < 0 && Clock::now() >= next_poll) {
        // Another node restarted the job: its ranks wait in the newer
        // generation, so these leave the old one at once.
        next_poll = Clock::now() + std::chrono::seconds(1);
        if (elastic && job_finished(store.get())) {
          // Ranks the finished job left behind (stopped, or never admitted)
          // get 10 s to notice, then go.
          if (done_seen == Clock::time_point::max()) done_seen = Clock::now();
          if (Clock::now() - done_seen > std::chrono::seconds(10)) {
            std::fprintf(stderr, "cohort: node %d: the job finished without %d rank(s) of this node; stopping them\n",
                         o.node_rank, running);
            signal_all(SIGKILL);
          }
        }
        int newest = job_generation.current();
        if (newest > generation) {
          superseded_by = newest;
          signal_all(SIGKILL);
        }
      }
    }

    return failed;
  };

  const Worker* failed = nullptr;
  std::vector<Worker> workers;
  int rejoins = 0;  // elastic: times this node joined again after its rank failed
  for (int generation = 0;;) {
    workers.assign(static_cast<size_t>(o.nproc_per_node), Worker{});
    superseded_by = -1;
    failed = run_generation(generation, workers);
    if (superseded_by > generation && !interrupted) {
      if (superseded_by > o.max_restarts) {
        std::fprintf(stderr, "cohort: error: node %d: another node restarted the job a %d%s time, past "
                     "--max-restarts %d; stopped\n", o.node_rank, superseded_by, ordinal_suffix(superseded_by),
                     o.max_restarts);
        return 1;
      }
      std::fprintf(stderr, "cohort: node %d: another node restarted the job (generation %d); restarting all %d "
                   "local rank(s) to join it\n", o.node_rank, superseded_by, o.nproc_per_node);
      generation = superseded_by;
      continue;
    }
    bool usage_error = failed && WIFEXITED(failed->status) && WEXITSTATUS(failed->status) == 2;
    bool below_min = failed && WIFEXITED(failed->status) && WEXITSTATUS(failed->status) == 3;
    if (elastic && failed && !interrupted && !usage_error && !below_min) {
      // This node left the job; the others go on without it. It joins again
      // as a newcomer while restarts are left.
      if (++rejoins > o.max_restarts) break;
      std::fprintf(stderr, "cohort: node %d: rank %d %s; this node left the job and joins it again (%d of %d)\n",
                   o.node_rank, failed->rank, describe_status(failed->status).c_str(), rejoins, o.max_restarts);
      stopped_rank = -1;
      continue;
    }
    if (!failed || interrupted || usage_error || generation >= o.max_restarts) break;
    int next = job_generation.advance_past(generation);
    if (next > o.max_restarts) break;
    std::fprintf(stderr, "cohort: node %d: rank %d %s%s; restarting all %d local rank(s) from the latest checkpoint "
                 "(restart %d of %d)\n", o.node_rank, failed->rank, describe_status(failed->status).c_str(),
                 below_min ? " (fewer than --min-nodes remain)" : "", o.nproc_per_node, next, o.max_restarts);
    generation = next;
    stopped_rank = -1;
  }
  // Elastic: exit 2 or 3 ends the job everywhere; any other failure is this node's alone.
  const bool job_wide = failed && WIFEXITED(failed->status) &&
                        (WEXITSTATUS(failed->status) == 2 || WEXITSTATUS(failed->status) == 3);
  if (failed && !job_wide && !interrupted && elastic && node_zero && store) {
    // The others may go on without this node, but they need its store.
    std::fprintf(stderr, "cohort: node %d: this node's rank(s) left the job; hosting the rendezvous store until "
                 "the others finish\n", o.node_rank);
    keep_hosting(*store, watched, o.node_rank);
  }
  if (failed) {
    if (stopped_rank >= 0) {
      std::fprintf(stderr, "cohort: error: rank %d (node %d) was stopped (SIGSTOP or a debugger) and stopped "
                   "responding; rank %d then %s; stopped the rank(s) on this node\n", stopped_rank, o.node_rank,
                   failed->rank, describe_status(failed->status).c_str());
      return 1;
    }
    std::fprintf(stderr, "cohort: error: rank %d (node %d, local rank %d, pid %d) %s; stopped the other %d rank(s) "
                 "on this node\n", failed->rank, o.node_rank, failed->local_rank, static_cast<int>(failed->pid),
                 describe_status(failed->status).c_str(), o.nproc_per_node - 1);
    return WIFEXITED(failed->status) && WEXITSTATUS(failed->status) == 2 ? 2 : 1;
  }
  if (interrupted) {
    bool clean = true, before_training = true, any_started = false;
    for (const auto& w : workers) {
      any_started = any_started || w.pid >= 0;
      if (w.pid < 0) continue;  // the signal came before it was started
      clean = clean && WIFEXITED(w.status) && WEXITSTATUS(w.status) == 0;
      before_training = before_training && WIFEXITED(w.status) && WEXITSTATUS(w.status) == 128 + interrupted;
    }
    if (!any_started || (!clean && before_training)) {
      std::fprintf(stderr, "cohort: node %d: stopped by %s before training began\n", o.node_rank,
                   strsignal(interrupted));
    } else if (clean) {
      std::fprintf(stderr, "cohort: node %d: stopped by %s after every rank checkpointed; continue with --resume\n",
                   o.node_rank, strsignal(interrupted));
    } else {
      std::fprintf(stderr, "cohort: error: node %d: interrupted by %s and not every rank stopped cleanly\n",
                   o.node_rank, strsignal(interrupted));
    }
    return 128 + interrupted;
  }
  return 0;
}

}  // namespace cohort
