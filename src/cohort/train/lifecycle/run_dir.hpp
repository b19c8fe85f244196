// defines: RunDir, RunDirLock
//
// RUN_DIR's layout and what may happen to it:
//   .lock           the job that has it (RunDirLock), while that job lives
//   config.toml     the resolved config
//   metrics.jsonl   one line per log interval and evaluation (rank 0)
//   checkpoints/    step-N/, latest (ckpt/checkpoint.hpp)
//   tensorboard/    events.out.tfevents.* (log.tensorboard)
//   sample-ids/     rank-R.jsonl (log.sample-ids)
// Only rank 0 changes it, only after config, model and data were accepted
// on every rank, and only while its job holds RUN_DIR/.lock.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cohort/train/lifecycle/run.hpp"

namespace cohort {

class RunDirLock;

class RunDir {
 public:
  explicit RunDir(std::string path) : path_(std::move(path)) {}

  const std::string& path() const { return path_; }
  std::string metrics_file() const;
  std::string tensorboard_dir() const;
  std::string sample_ids_file(int rank) const;

  // Creates the directory and writes config.toml. kFresh refuses a directory
  // that holds a run, metrics.jsonl or checkpoints/ (UsageError naming the
  // ways on); kOverwrite first
  // removes the earlier run's metrics, checkpoints and sample ids; kResume
  // keeps them, drops the metrics and sample-id lines after `resumed_step`
  // (those steps are trained again) and moves aside (never deletes) checkpoints newer
  // than it, which belong to an abandoned future. Returns lines to report.
  // kResume first removes partial checkpoints (checkpoints/.tmp-*) and
  // temporaries a crash or a full disk left.
  std::vector<std::string> prepare(RunMode mode, const std::string& config_toml, int64_t resumed_step) const;
  // A task's files (Task::run_files: name relative to RUN_DIR, text), each
  // written atomically. A resume keeps the tokenizer the run started with,
  // whatever its data.path says now.
  void write_run_files(const std::vector<std::pair<std::string, std::string>>& files, RunMode mode) const;

  // Elastic: a world that lost a member right after step `step` (its update
  // applied everywhere) may have left the step's records incomplete. These
  // complete them, for the next world's rank 0.
  // Whether metrics.jsonl has a train line for `step`.
  bool has_train_line(int64_t step) const;
  // The eval lines of `split` at `step` in metrics.jsonl.
  int64_t eval_lines_at(const std::string& split, int64_t step) const;
  // The steps after `step` with an eval line of `split` in metrics.jsonl:
  // the evaluations without improvement since the best (early stopping
  // counts on across a resume).
  int64_t eval_steps_after(const std::string& split, int64_t step) const;
  // Writes the ids of `step_ids` (the step's whole global batch) that no
  // sample-ids file holds for `step` to rank `rank`'s file, as one line
  // marked "recovered". Returns how many.
  size_t complete_sample_ids(int64_t step, int64_t epoch, const std::vector<int64_t>& step_ids, int rank) const;

  // Takes RUN_DIR/.lock for job `job_id` (RunDirLock) before prepare():
  // refuses (UsageError) a directory another live job holds, whatever the
  // mode, and a fresh run over an earlier run (as prepare does, without
  // leaving a lock behind); takes over a dead job's lock with a line in
  // `notes`. `lease_s`: how long a holder on another host may go without
  // renewing before it counts as dead.
  std::unique_ptr<RunDirLock> lock(const std::string& job_id, double lease_s, RunMode mode,
                                   std::vector<std::string>& notes) const;
  // Refuses (UsageError) a directory that a live job other than `job_id`
  // (not empty) holds, reading only: before a resume reads its checkpoints.
  // lock() still decides, later.
  void refuse_if_held(const std::string& job_id) const;

 private:
  // Keeps the JSON lines of `file` whose "step" is at most `step` (and drops
  // a torn last line).
  void refuse_fresh_over_a_run(RunMode mode) const;
  static void drop_lines_after(const std::string& file, int64_t step);
  std::vector<std::string> set_aside_checkpoints_after(int64_t step) const;
  std::string path_;
};

// RUN_DIR/.lock: the job that has the directory. It belongs to the job, not
// to a process: a restart by the launcher, a later elastic world (whose rank
// 0 may be another process on another node) and every node of the job share
// its id (COHORT_JOB_ID, agreed through the launchers' store) and take the
// lock as their own; any other job is refused. flock/fcntl locks neither
// span nodes nor work reliably on NFS, so the lock is a file created with
// link() (atomic on NFS too) holding job id, host, pid, the pid's start
// time and the job's start time, and kept fresh by a thread that touches it
// every few seconds (a lease). Its holder counts as dead when, on the same
// host, its pid is gone or belongs to a newer process (or the host
// rebooted); on another host, when the lease was not renewed for `lease_s`,
// measured against the file system's own clock. Only rank 0 holds it.
class RunDirLock {
 public:
  // What a lock file says about its holder.
  struct Holder {
    std::string job, host, boot_id, pid_ns, started, nonce;
    int64_t pid = 0;
    int64_t pid_start = 0;  // the pid's start time, in clock ticks after boot (/proc/PID/stat)
    std::string describe() const;  // "job J (host H, pid P, started T)"
  };

  // A new job id: host, pid and random bits.
  static std::string new_job_id();
  // This process's job: COHORT_JOB_ID (set by the launcher for every worker
  // of a job), else SLURM's job and step ids under srun, else "" (a job of
  // one process: RunDir::lock makes one up).
  static std::string job_id_from(const std::map<std::string, std::string>& env);

  RunDirLock(std::string path, Holder me, double lease_s);
  ~RunDirLock();  // stops renewing; the file stays (the job may restart; else its holder is dead)
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

  // A clean end of the job: stops renewing and removes the file if it is
  // still this job's.
  void release();
  const std::string& path() const { return path_; }

 private:
  void renew_loop();
  struct Renewer;
  std::string path_;
  Holder me_;
  double lease_s_;
  std::unique_ptr<Renewer> renewer_;
};

}  // namespace cohort
