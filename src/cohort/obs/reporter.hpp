// defines: Metrics, metric_value, format_metrics, StepProgress, TrainReport, EvalReport, report_json,
//          Reporter, ReporterFanOut, ConsoleReporter, MetricsFileReporter,
//          TensorBoardReporter, eta_seconds
//
// What a run tells the world, and where it goes. Rank 0's trainer reports
// events to one Reporter; the default fans out to the console (log lines
// and, on a terminal, a live progress bar), RUN_DIR/metrics.jsonl and
// TensorBoard. A program built on the library passes its own in
// RunOptions::reporter, alone or fanned out beside the defaults.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "cohort/obs/metrics_log.hpp"
#include "cohort/obs/tensorboard.hpp"

namespace cohort {

// A task's reported metrics, in print order ("loss", "accuracy", ...).
using Metrics = std::vector<std::pair<std::string, double>>;
// The value named `name`, 0 when absent.
double metric_value(const Metrics& metrics, const std::string& name);
// "  loss 0.4213  accuracy 0.8410", as the console prints them. Names with a
// '/' (per-class details, "f1/noun.animal") are left to metrics.jsonl.
std::string format_metrics(const Metrics& metrics);

// Seconds left at the rate so far: `elapsed` seconds for `done` steps,
// `remaining` to go.
double eta_seconds(double elapsed, int64_t done, int64_t remaining);

// After every step: this rank's loss, the rate since the last log line.
struct StepProgress {
  int64_t step = 0, total_steps = 0, epoch = 0;
  // The last train line's loss (NaN before the first): between lines a
  // step does not wait for the device to show its own.
  double loss = 0, lr = 0;
  double units_per_s = 0;  // 0 before anything was counted
  std::string unit;        // "images", "tokens"
  double eta_s = 0;
};

// Every log.every-steps steps: the interval's metrics over all ranks.
struct TrainReport {
  int64_t step = 0, total_steps = 0, epoch = 0;
  double lr = 0;
  int64_t samples = 0;     // samples trained on so far, all ranks
  double units_per_s = 0;
  std::string unit;
  double eta_s = 0;
  Metrics metrics;
  // Per phase, the slowest rank's mean milliseconds per step ("data",
  // "forward", ...), and the rank with the most compute.
  std::vector<std::pair<std::string, double>> phase_ms;
  int slowest_rank = 0;
  // Mean ms per step the ranks waited for the one with the most compute:
  // what data.balance removes.
  double idle_ms = 0;
  std::vector<int64_t> balance;  // data.balance: each rank's samples of a full global batch; empty when equal
};

struct EvalReport {
  int64_t step = 0;
  std::string split;
  int64_t count = 0;  // samples evaluated
  Metrics metrics;
  double seconds = 0;
  std::string source;  // "" during training; "cohort eval" for the command (metrics.jsonl's "source")
};

// A report as its metrics.jsonl line ({"kind":"train", "step":..., ...}):
// what the file, TensorBoard and MLflow record.
nlohmann::json report_json(const TrainReport& r);
nlohmann::json report_json(const EvalReport& r);

// Elastic training: a new world formed (members left or joined). Reported
// by the new world's rank 0 after its first step.
struct MembershipReport {
  int64_t step = 0;      // the step the new world continued from
  int generation = 0;    // the elastic generation
  int world_size = 0, nodes = 0;
  std::vector<std::string> left, joined;  // "rank 2 (node 2, local rank 0)"
  std::string cause;     // why the previous world ended
  std::string state;     // "memory" (rank 0's) or "checkpoint" or "start"
  double formed_s = 0;   // the new world's formation
  double recovery_s = 0;  // from the change being noticed to the new world's first step
  int64_t unix_ms = 0;   // wall clock at the first step
  std::chrono::steady_clock::time_point noticed{};  // when this process noticed the change
};

class Reporter {
 public:
  virtual ~Reporter() = default;
  // A line for people: the plan, resume notes, checkpoints, the end.
  virtual void message(const std::string& /*line*/) {}
  virtual void progress(const StepProgress& /*p*/) {}
  virtual void train(const TrainReport& /*r*/) {}
  virtual void eval(const EvalReport& /*r*/) {}
  virtual void membership(const MembershipReport& /*r*/) {}
  // The run ended (`ok`: it completed; false: it failed). Not called when
  // an elastic world ends and the next goes on.
  virtual void finish(bool /*ok*/) {}
};

class ReporterFanOut : public Reporter {
 public:
  void add(std::shared_ptr<Reporter> r) { to_.push_back(std::move(r)); }
  void message(const std::string& line) override;
  void progress(const StepProgress& p) override;
  void train(const TrainReport& r) override;
  void eval(const EvalReport& r) override;
  void membership(const MembershipReport& r) override;
  void finish(bool ok) override;

 private:
  std::vector<std::shared_ptr<Reporter>> to_;
};

// stdout. With `live` (a terminal), a one-line progress bar is redrawn in
// place (ANSI erase-line; at most ten times a second) and other lines
// scroll above it; without, plain lines only.
class ConsoleReporter : public Reporter {
 public:
  explicit ConsoleReporter(bool live) : live_(live) {}
  void message(const std::string& line) override;
  void progress(const StepProgress& p) override;
  void train(const TrainReport& r) override;
  void eval(const EvalReport& r) override;
  void membership(const MembershipReport& r) override;

 private:
  void print(const std::string& line);
  bool live_;
  bool bar_shown_ = false;
  std::chrono::steady_clock::time_point last_bar_{};
  double last_rate_ = 0;
};

// RUN_DIR/metrics.jsonl: {"kind":"train",...}, {"kind":"eval",...} and
// {"kind":"membership",...}.
class MetricsFileReporter : public Reporter {
 public:
  explicit MetricsFileReporter(const std::string& path) : log_(path) {}
  void train(const TrainReport& r) override;
  void eval(const EvalReport& r) override;
  void membership(const MembershipReport& r) override;

 private:
  MetricsLog log_;
};

// Every number of every metrics line as a scalar: train/loss, test/accuracy, ...
class TensorBoardReporter : public Reporter {
 public:
  explicit TensorBoardReporter(const std::string& dir) : writer_(dir) {}
  void train(const TrainReport& r) override;
  void eval(const EvalReport& r) override;

 private:
  TensorBoardWriter writer_;
};

}  // namespace cohort
