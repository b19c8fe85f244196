// defines: RunDir
//
// RUN_DIR's layout and what may happen to it:
//   config.toml     the resolved config
//   metrics.jsonl   one line per log interval and evaluation (rank 0)
//   checkpoints/    step-N/, latest (ckpt/checkpoint.hpp)
//   tensorboard/    events.out.tfevents.* (log.tensorboard)
//   sample-ids/     rank-R.jsonl (log.sample-ids)
// Only rank 0 changes it, and only after config, model and data were
// accepted on every rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cohort/train/run.hpp"

namespace cohort {

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
  std::vector<std::string> prepare(RunMode mode, const std::string& config_toml, int64_t resumed_step) const;

  // Elastic: a world that lost a member right after step `step` (its update
  // applied everywhere) may have left the step's records incomplete. These
  // complete them, for the next world's rank 0.
  // Whether metrics.jsonl has a train line for `step`.
  bool has_train_line(int64_t step) const;
  // Writes the ids of `step_ids` (the step's whole global batch) that no
  // sample-ids file holds for `step` to rank `rank`'s file, as one line
  // marked "recovered". Returns how many.
  size_t complete_sample_ids(int64_t step, int64_t epoch, const std::vector<int64_t>& step_ids, int rank) const;

 private:
  // Keeps the JSON lines of `file` whose "step" is at most `step` (and drops
  // a torn last line).
  static void drop_lines_after(const std::string& file, int64_t step);
  std::vector<std::string> set_aside_checkpoints_after(int64_t step) const;
  std::string path_;
};

}  // namespace cohort
