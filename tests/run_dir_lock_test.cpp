// Contract 9, first half: a live job locks its run directory (RUN_DIR/.lock)
// and another job is refused, --overwrite or not; a dead job's lock is taken
// over and the log says so; the processes of one job (restarts) keep it.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <thread>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/sha256.hpp"
#include "cohort/train/lifecycle/run_dir.hpp"
#include "helpers.hpp"

using namespace std::chrono_literals;
using cohort::test::Background;
using cohort::test::children_of;
using cohort::test::read_file;
using cohort::test::run_cohort;
using cohort::test::TempDir;
namespace fs = std::filesystem;

namespace {

const std::string kTiny = " --model.name mlp --model.hidden 16 --optim.schedule constant --log.tensorboard=false "
                          "--log.every-steps 1 --eval.every-steps 1000000 --eval.max-samples 8 ";

// A cap for a broken build, not a guess at how fast the machine is.
bool wait_until(const std::function<bool()>& ready, std::chrono::seconds limit = 180s) {
  return cohort::test::wait_until(ready, limit);
}

nlohmann::json lock_of(const std::string& run) {
  try {
    return nlohmann::json::parse(read_file(run + "/.lock"));
  } catch (const std::exception&) {
    return nullptr;
  }
}

std::string host_name() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return host;
}

// /proc/PID/stat field 22: when the process started, in clock ticks.
int64_t start_ticks(pid_t pid) {
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  std::istringstream fields(stat.substr(stat.rfind(')') + 1));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 22) return std::stoll(field);
  }
  return -1;
}

// A job that trains until stopped, into `run`; waits until it holds the
// lock and wrote a checkpoint.
std::string long_job(const TempDir& tmp, const std::string& run, const std::string& extra) {
  // Rank 0 sleeps 50 ms a step (COHORT_DEBUG_DELAY), to spare the machine.
  return "env COHORT_DEBUG_DELAY=0:50 " + std::string(COHORT_BIN) + " train" + kTiny + "--quiet --train.max-steps 1000000 --ckpt.every-steps 20 " +
         extra + " --data.path " + tmp.path() + " --out " + run;
}

bool holds_lock_and_checkpoint(const std::string& run) {
  return fs::exists(run + "/.lock") && fs::exists(run + "/checkpoints/latest");
}

}  // namespace

// The case: a second job with --overwrite wiped a live 2-rank job.
// Now it is refused (exit 2) naming the live job's host, pid and start time;
// so are a fresh run and a resume; the live job is untouched and ends well.
TEST(RunDirLock, ALiveJobIsRefusedWithOrWithoutOverwrite) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 40);
  const std::string run = tmp / "run";
  Background job(long_job(tmp, run, "--nproc-per-node 2"), tmp, "live");
  ASSERT_TRUE(wait_until([&] { return holds_lock_and_checkpoint(run); })) << job.err();
  auto lock = lock_of(run);
  ASSERT_TRUE(lock.is_object()) << read_file(run + "/.lock");
  const auto workers = children_of(job.pid());
  const pid_t holder = lock["pid"].get<pid_t>();
  EXPECT_NE(std::find(workers.begin(), workers.end(), holder), workers.end()) << "the lock names a worker: rank 0";

  const std::string again = "train" + kTiny + "--train.max-steps 2 --data.path " + tmp.path() + " --out " + run;
  for (const std::string& how : {std::string(" --overwrite"), std::string(""), std::string(" --nproc-per-node 2 --overwrite")}) {
    auto r = run_cohort(again + how);
    EXPECT_EQ(r.code, 2) << how << "\n" << r.err;
    EXPECT_NE(r.err.find(run + " is in use by job " + lock["job"].get<std::string>()),
              std::string::npos) << r.err;
    EXPECT_NE(r.err.find("host " + host_name() + ", pid " + std::to_string(holder) + ", started " +
                         lock["started"].get<std::string>()), std::string::npos) << r.err;
  }
  auto resumed = run_cohort("train --resume " + run + " --train.max-steps 5");
  EXPECT_EQ(resumed.code, 2) << resumed.err;
  EXPECT_NE(resumed.err.find("is in use by job"), std::string::npos) << resumed.err;

  // The live job went on: it checkpoints again, and stops cleanly.
  std::string before = read_file(run + "/checkpoints/latest");
  ASSERT_TRUE(wait_until([&] { return read_file(run + "/checkpoints/latest") != before; })) << job.err();
  EXPECT_EQ(job.wait(100ms), -1) << "the live job died: " << job.err();
  kill(job.pid(), SIGTERM);
  EXPECT_EQ(job.wait(300s), 128 + SIGTERM) << job.err();
  EXPECT_NE(job.err().find("after every rank checkpointed"), std::string::npos) << job.err();
  std::vector<std::string> warnings;
  auto latest = cohort::Checkpoints::resolve(run, &warnings);
  EXPECT_TRUE(warnings.empty());
  EXPECT_GE(latest.state.step, 20);
  EXPECT_FALSE(fs::exists(run + "/.lock")) << "a clean end releases the lock";
}

// A job killed with -9 leaves its lock; the next job takes it over and says
// whose it was and why.
TEST(RunDirLock, ADeadJobsLockIsTakenOverAndTheLogSaysSo) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 40);
  const std::string run = tmp / "run";
  Background job(long_job(tmp, run, ""), tmp, "dead");
  ASSERT_TRUE(wait_until([&] { return holds_lock_and_checkpoint(run); })) << job.err();
  auto lock = lock_of(run);
  ASSERT_TRUE(lock.is_object());
  kill(job.pid(), SIGKILL);
  ASSERT_EQ(job.wait(60s), 128 + SIGKILL);
  ASSERT_TRUE(fs::exists(run + "/.lock"));

  auto r = run_cohort("train --resume " + run + " --train.max-steps " +
                      std::to_string(cohort::Checkpoints::resolve(run, nullptr).state.step + 2));
  ASSERT_EQ(r.code, 0) << r.err;
  std::string log = r.out + r.err;
  EXPECT_NE(log.find("took over the lock of " + run + " from job " + lock["job"].get<std::string>() + " on host " +
                     host_name() + " pid " + std::to_string(lock["pid"].get<int>()) + " (started " +
                     lock["started"].get<std::string>() + "), which is no longer running"),
            std::string::npos) << log;
  EXPECT_FALSE(fs::exists(run + "/.lock"));
}

// A lock from another host: its holder is alive while it renews the lease
// (the file's time stamp), and dead once the lease is older than
// max(dist.timeout, 2 min).
TEST(RunDirLock, AnotherHostsLockHoldsUntilItsLeaseExpires) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 16);
  const std::string run = tmp / "run";
  fs::create_directories(run);
  cohort::test::write_file(run + "/.lock", nlohmann::json({{"job", "far-job"}, {"host", "cohort-test-elsewhere"},
                                                           {"pid", 4242}, {"pid_start", 1}, {"boot_id", "x"},
                                                           {"started", "2026-01-02 03:04:05 UTC"}, {"nonce", "n1"}})
                                               .dump());
  const std::string train = "train" + kTiny + "--train.max-steps 2 --overwrite --dist.timeout 30 --data.path " +
                            tmp.path() + " --out " + run;
  auto fresh = run_cohort(train);
  EXPECT_EQ(fresh.code, 2) << fresh.err;
  EXPECT_NE(fresh.err.find("is in use by job far-job (host cohort-test-elsewhere, pid 4242, started 2026-01-02 "
                           "03:04:05 UTC); lease renewed"), std::string::npos) << fresh.err;

  // Not renewed for an hour: expired.
  timespec old[2];
  clock_gettime(CLOCK_REALTIME, &old[0]);
  old[0].tv_sec -= 3600;
  old[1] = old[0];
  ASSERT_EQ(utimensat(AT_FDCWD, (run + "/.lock").c_str(), old, 0), 0);
  auto stale = run_cohort(train);
  ASSERT_EQ(stale.code, 0) << stale.err;
  EXPECT_NE((stale.out + stale.err).find("from job far-job on host cohort-test-elsewhere pid 4242 (started "
                                         "2026-01-02 03:04:05 UTC), whose lease expired"),
            std::string::npos) << stale.out << stale.err;
}

// The job id, not the process, owns the lock: a process of the same job
// (COHORT_JOB_ID, as the launcher sets it for every worker) takes a lock
// whose holder still runs; another job is refused.
TEST(RunDirLock, TheSameJobsProcessesShareTheLock) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 16);
  const std::string run = tmp / "run";
  fs::create_directories(run);
  // Held by this (live) test process, as a worker of job "job-7" would.
  cohort::test::write_file(run + "/.lock",
                           nlohmann::json({{"job", "job-7"}, {"host", host_name()}, {"pid", getpid()},
                                           {"pid_start", start_ticks(getpid())},
                                           {"boot_id", read_file("/proc/sys/kernel/random/boot_id").substr(0, 36)},
                                           {"started", "2026-01-02 03:04:05 UTC"}, {"nonce", "n1"}})
                               .dump());
  const std::string train = "train" + kTiny + "--train.max-steps 2 --overwrite --data.path " + tmp.path() + " --out " + run;
  auto other = run_cohort(train);
  EXPECT_EQ(other.code, 2) << other.err;
  EXPECT_NE(other.err.find("is in use by job job-7 (host " + host_name() + ", pid " + std::to_string(getpid())),
            std::string::npos) << other.err;
  auto same = run_cohort(train, "COHORT_JOB_ID=job-7");
  EXPECT_EQ(same.code, 0) << same.err;
  EXPECT_FALSE(fs::exists(run + "/.lock"));
}

// A restart by the launcher (--max-restarts) is the same job: its new rank
// 0 takes the lock over from the killed one, under the same job id.
TEST(RunDirLock, ALauncherRestartKeepsTheJobsLock) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 40);
  const std::string run = tmp / "run";
  Background job(long_job(tmp, run, "--nproc-per-node 2 --max-restarts 1"), tmp, "restart");
  ASSERT_TRUE(wait_until([&] { return holds_lock_and_checkpoint(run); })) << job.err();
  auto first = lock_of(run);
  ASSERT_TRUE(first.is_object());
  kill(first["pid"].get<pid_t>(), SIGKILL);  // rank 0, the holder
  ASSERT_TRUE(wait_until([&] {
    auto now = lock_of(run);
    return now.is_object() && now["pid"] != first["pid"];
  })) << job.err();
  auto second = lock_of(run);
  EXPECT_EQ(second["job"], first["job"]);
  EXPECT_EQ(second["started"], first["started"]) << "the job's start, kept across its restarts";
  EXPECT_NE(job.err().find("restarting all 2 local rank(s)"), std::string::npos) << job.err();
  kill(job.pid(), SIGTERM);
  EXPECT_EQ(job.wait(300s), 128 + SIGTERM) << job.err();
  EXPECT_EQ(job.err().find("is in use by"), std::string::npos) << job.err();
}

// Without --overwrite, an existing run is refused with exit 2 however many
// ranks the new job has (rank 1 used to exit 1 saying only that rank 0
// failed, and the launcher passed that on).
TEST(RunDirLock, RefusingAnExistingRunExitsTwoOnEveryRank) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 16);
  const std::string train = "train" + kTiny + "--quiet --train.max-steps 1 --data.path " + tmp.path() + " --out " + (tmp / "run");
  ASSERT_EQ(run_cohort(train).code, 0);
  for (int ranks : {1, 2, 3}) {
    auto r = run_cohort(train + " --oversubscribe --nproc-per-node " + std::to_string(ranks));
    EXPECT_EQ(r.code, 2) << ranks << " rank(s):\n" << r.err;
    EXPECT_NE(r.err.find("already holds a run"), std::string::npos) << r.err;
  }
  EXPECT_FALSE(fs::exists(tmp / "run/.lock")) << "a refused job leaves no lock";
}

// Issue 46: a resume of a live run that rotates its checkpoints (keep 1,
// one every other step) lost the race with the rotation: "step-N/
// model.safetensors: cannot open", exit 1. A process that begins a job
// refuses a live holder before it reads any checkpoint: exit 2, every time.
// A reader (eval) holds the checkpoint it verified, so the rotation cannot
// take its files away: it evaluates, every time.
TEST(RunDirLock, ALiveRotatingRunIsRefusedToAResumeAndReadByAnEval) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 40);
  const std::string run = tmp / "run";
  Background job("env COHORT_DEBUG_DELAY=0:20 " + std::string(COHORT_BIN) + " train" + kTiny +
                     "--quiet --train.max-steps 1000000 --ckpt.every-steps 2 --ckpt.keep 1 --data.path " + tmp.path() +
                     " --out " + run,
                 tmp, "rotating");
  ASSERT_TRUE(wait_until([&] { return holds_lock_and_checkpoint(run); })) << job.err();
  const std::string job_id = lock_of(run)["job"].get<std::string>();
  for (int i = 0; i < 5; ++i) {
    auto resumed = run_cohort("train --resume " + run + " --train.max-steps 1000");
    EXPECT_EQ(resumed.code, 2) << resumed.err;
    EXPECT_NE(resumed.err.find(run + " is in use by job " + job_id), std::string::npos) << resumed.err;
    auto lines = cohort::test::lines_of(resumed.err);
    EXPECT_EQ(lines.size(), 1u) << resumed.err;
  }
  for (int i = 0; i < 3; ++i) {
    auto eval = run_cohort("eval " + run + " --max-samples 8");
    EXPECT_EQ(eval.code, 0) << eval.err;
  }
  EXPECT_EQ(job.wait(100ms), -1) << "the live job died: " << job.err();
  kill(job.pid(), SIGTERM);
  EXPECT_EQ(job.wait(300s), 128 + SIGTERM) << job.err();
}

// Issue 46: the job's own lock was rewritten in place through
// write_file_durably, which truncates and removes the file when a write
// fails. Now a failed rewrite keeps the lock as it was. Writes past 64
// bytes fail here (RLIMIT_FSIZE: EFBIG), as they would on a failing disk.
TEST(RunDirLock, AFailedRewriteOfTheJobsOwnLockKeepsIt) {
  TempDir tmp;
  const std::string run = tmp / "run";
  std::vector<std::string> notes;
  auto held = cohort::RunDir(run).lock("job-a", 60, cohort::RunMode::kFresh, notes);
  const std::string before = read_file(run + "/.lock");
  struct rlimit old {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto previous = signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 64;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string error;
  try {
    cohort::RunDir(run).lock("job-a", 60, cohort::RunMode::kResume, notes);  // a restart of the same job
  } catch (const cohort::Error& e) {
    error = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, previous);
  EXPECT_NE(error.find("cannot rewrite this job's lock"), std::string::npos) << error;
  ASSERT_TRUE(fs::exists(run + "/.lock"));
  EXPECT_EQ(read_file(run + "/.lock"), before);
  held->release();
}

namespace {

// A process that takes `run`'s lock for `job` and dies holding it.
void die_holding(const std::string& run, const std::string& job) {
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<std::string> notes;
    try {
      auto held = cohort::RunDir(run).lock(job, 60, cohort::RunMode::kFresh, notes);
      (void)held.release();  // leaked, never released: this process dies holding the lock
    } catch (...) {
      _exit(1);
    }
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace

// Issue 46: two jobs that both found a stale takeover file could each
// remove it, the second removing the first's fresh one, and both take over.
// Here a dead job's lock and the claim of a job that died taking it over
// wait for three jobs started at once: exactly one takes the lock, the
// others are refused as in use, and no claim is left behind.
TEST(RunDirLock, OfThreeJobsThatFindADeadLockExactlyOneTakesItOver) {
  TempDir tmp;
  const std::string run = tmp / "run";
  die_holding(run, "dead-job");
  // The dead claimant: a claim on this very lock, held by a dead process.
  const std::string lock_text = read_file(run + "/.lock");
  const std::string claim = run + "/.lock.takeover-" + cohort::sha256_hex(lock_text).substr(0, 16);
  {
    const std::string other = tmp / "other";
    die_holding(other, "dead-claimant");
    fs::copy_file(other + "/.lock", claim);
  }
  int go[2], results[2], hold[2];
  ASSERT_EQ(pipe(go), 0);
  ASSERT_EQ(pipe(results), 0);
  ASSERT_EQ(pipe(hold), 0);
  std::vector<pid_t> contenders;
  for (int i = 0; i < 3; ++i) {
    pid_t pid = fork();
    if (pid == 0) {
      close(go[1]);
      close(results[0]);
      close(hold[1]);
      char c;
      if (read(go[0], &c, 1) < 0) _exit(3);  // all start when the parent closes it
      char outcome = 'E';
      std::unique_ptr<cohort::RunDirLock> held;
      try {
        std::vector<std::string> notes;
        held = cohort::RunDir(run).lock("contender-" + std::to_string(i), 60, cohort::RunMode::kResume, notes);
        outcome = 'H';
      } catch (const cohort::UsageError&) {
        outcome = 'R';
      } catch (...) {
      }
      if (write(results[1], &outcome, 1) != 1) _exit(3);
      if (held && read(hold[0], &c, 1) < 0) _exit(3);  // holds it while the others look
      _exit(0);
    }
    contenders.push_back(pid);
  }
  close(go[0]);
  close(results[1]);
  close(hold[0]);
  close(go[1]);
  std::string outcomes;
  char c;
  while (outcomes.size() < 3 && read(results[0], &c, 1) == 1) outcomes += c;
  close(hold[1]);
  for (pid_t pid : contenders) waitpid(pid, nullptr, 0);
  close(results[0]);
  std::sort(outcomes.begin(), outcomes.end());
  EXPECT_EQ(outcomes, "HRR") << "H: took the lock, R: refused as in use, E: another error";
  auto lock = lock_of(run);
  ASSERT_TRUE(lock.is_object());
  EXPECT_EQ(lock["job"].get<std::string>().rfind("contender-", 0), 0u) << lock.dump();
  for (const auto& e : fs::directory_iterator(run)) {
    EXPECT_NE(e.path().filename().string().rfind(".lock.takeover", 0), 0u) << e.path();
  }
}
