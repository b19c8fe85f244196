#include "cohort/launch/launcher.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include <chrono>
#include <cstring>

#include "cohort/core/error.hpp"
#include "cohort/distributed/rendezvous.hpp"
#include "cohort/distributed/store.hpp"

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

}  // namespace

bool wants_launcher(const LaunchOptions& o) {
  // Anything but one plain process goes through launch_node, which also
  // refuses the values that make no sense (0 ranks, negative restarts).
  return o.nproc_per_node != 1 || o.nnodes != 1 || o.first_rank >= 0 || o.world_size > 0 || o.max_restarts != 0;
}

int launch_node(const LaunchOptions& o, const std::vector<std::string>& argv) {
  COHORT_CHECK(o.nproc_per_node >= 1, UsageError, "--nproc-per-node must be >= 1 (got ", o.nproc_per_node, ")");
  COHORT_CHECK(o.nnodes >= 1, UsageError, "--nnodes must be >= 1 (got ", o.nnodes, ")");
  COHORT_CHECK(o.max_restarts >= 0, UsageError, "--max-restarts must be >= 0 (got ", o.max_restarts, ")");
  COHORT_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes, UsageError, "--node-rank ", o.node_rank,
               " is outside --nnodes ", o.nnodes);
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

  if (o.first_rank < 0 && o.nnodes > 1) {
    // Heterogeneous nodes: every launcher publishes its rank count, and each
    // node's range starts after the ranks of the nodes before it.
    try {
      if (!store && init.kind == InitMethod::Kind::kTcp) {
        store = open_tcp_store(init.host, init.port, /*server=*/false, timeout);
      } else if (!store) {
        store = c10::make_intrusive<c10d::FileStore>(init.path + ".nodes", o.nnodes);
        store->setTimeout(timeout);
      }
      store->set(detail::cat("launch/node/", o.node_rank), bytes(std::to_string(o.nproc_per_node)));
      plan.world_size = 0;
      for (int n = 0; n < o.nnodes; ++n) {
        std::string key = detail::cat("launch/node/", n);
        store->wait({key}, timeout);
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
  std::fprintf(stderr, "cohort: node %d: ranks %d..%d of %d, rendezvous %s\n", o.node_rank, plan.first_rank,
               plan.first_rank + o.nproc_per_node - 1, plan.world_size, plan.init.c_str());


  // Everything a child touches between fork and exec is prepared here:
  // only async-signal-safe calls happen in the child.
  std::vector<char*> args;
  std::vector<std::string> argv_copy = argv;
  for (auto& a : argv_copy) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t launcher_pid = getpid();

  const Env base_env = process_env();
  int interrupted = 0;
  auto run_generation = [&](int generation, std::vector<Worker>& workers) -> const Worker* {
    for (int local = 0; local < o.nproc_per_node; ++local) {
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
    int running = o.nproc_per_node;
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
          if (!ok && !failed && !interrupted) {
            failed = &w;
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
    }

    return failed;
  };

  const Worker* failed = nullptr;
  std::vector<Worker> workers;
  for (int generation = 0;; ++generation) {
    workers.assign(static_cast<size_t>(o.nproc_per_node), Worker{});
    failed = run_generation(generation, workers);
    bool usage_error = failed && WIFEXITED(failed->status) && WEXITSTATUS(failed->status) == 2;
    if (!failed || interrupted || usage_error || generation >= o.max_restarts) break;
    std::fprintf(stderr, "cohort: node %d: rank %d %s; restarting all %d local rank(s) from the latest checkpoint "
                 "(restart %d of %d)\n", o.node_rank, failed->rank, describe_status(failed->status).c_str(),
                 o.nproc_per_node, generation + 1, o.max_restarts);
  }
  if (failed) {
    std::fprintf(stderr, "cohort: error: rank %d (node %d, local rank %d, pid %d) %s; stopped the other %d rank(s) "
                 "on this node\n", failed->rank, o.node_rank, failed->local_rank, static_cast<int>(failed->pid),
                 describe_status(failed->status).c_str(), o.nproc_per_node - 1);
    return WIFEXITED(failed->status) && WEXITSTATUS(failed->status) == 2 ? 2 : 1;
  }
  if (interrupted) {
    bool clean = true;
    for (const auto& w : workers) clean = clean && WIFEXITED(w.status) && WEXITSTATUS(w.status) == 0;
    if (clean) {
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
