// Contract 9, first half: a live job locks its run directory (RUN_DIR/.lock)
// and another job is refused, --overwrite or not; a dead job's lock is taken
// over and the log says so; the processes of one job (restarts) keep it.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <thread>

#include "cohort/ckpt/checkpoint.hpp"
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
