// The Trainer's parts on their own: the run directory, the open registries,
// atomic files, the phase timer, and a reporter a library user supplies.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>

#include "cohort/core/error.hpp"
#include "cohort/core/files.hpp"
#include "cohort/core/registry.hpp"
#include "cohort/core/sha256.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/obs/reporter.hpp"
#include "cohort/train/lifecycle/run_dir.hpp"
#include "cohort/train/loop/phase_timer.hpp"
#include "cohort/train/loop/trainer.hpp"
#include "cohort/train/task.hpp"
#include "helpers.hpp"

using namespace cohort;
using cohort::test::error_of;
using cohort::test::TempDir;
using cohort::test::write_file;
namespace fs = std::filesystem;

TEST(RunDir, FreshRefusesARunOverwriteClearsItResumeTrimsIt) {
  TempDir tmp;
  RunDir dir(tmp / "run");
  EXPECT_TRUE(dir.prepare(RunMode::kFresh, "a = 1\n", 0).empty());
  EXPECT_EQ(cohort::read_file(tmp / "run/config.toml"), "a = 1\n");
  write_file(dir.metrics_file(), "{\"kind\":\"train\",\"step\":10}\n{\"kind\":\"train\",\"step\":20}\n{\"step\":3");
  std::string e = error_of([&] { dir.prepare(RunMode::kFresh, "", 0); });
  EXPECT_NE(e.find("already holds a run"), std::string::npos) << e;

  for (int step : {10, 20, 30}) fs::create_directories(fs::path(tmp / "run/checkpoints") / ("step-" + std::to_string(step)));
  auto notes = dir.prepare(RunMode::kResume, "a = 2\n", 10);
  EXPECT_EQ(cohort::read_file(dir.metrics_file()), "{\"kind\":\"train\",\"step\":10}\n");  // later and torn lines go
  EXPECT_EQ(notes.size(), 2u);
  EXPECT_TRUE(fs::exists(tmp / "run/checkpoints/step-10"));
  EXPECT_TRUE(fs::exists(tmp / "run/checkpoints/abandoned-step-20"));  // moved aside, never deleted
  EXPECT_TRUE(fs::exists(tmp / "run/checkpoints/abandoned-step-30"));

  fs::remove(dir.metrics_file());  // checkpoints alone still make a run
  EXPECT_THROW(dir.prepare(RunMode::kFresh, "", 0), UsageError);

  dir.prepare(RunMode::kOverwrite, "a = 3\n", 0);
  EXPECT_FALSE(fs::exists(dir.metrics_file()));
  EXPECT_FALSE(fs::exists(tmp / "run/checkpoints"));
  EXPECT_EQ(cohort::read_file(tmp / "run/config.toml"), "a = 3\n");
}

TEST(Files, AtomicWriteReplacesWholeAndLeavesNoTemporary) {
  TempDir tmp;
  write_file_atomically(tmp / "f", "old");
  write_file_atomically(tmp / "f", "new contents");
  EXPECT_EQ(cohort::read_file(tmp / "f"), "new contents");
  EXPECT_FALSE(fs::exists(tmp / "f.tmp"));
  EXPECT_THROW(write_file_atomically(tmp / "no/such/dir/f", "x"), Error);
  EXPECT_THROW(cohort::read_file(tmp / "missing"), DataError);
}

TEST(Registry, ListsEveryNameAndRefusesATakenOne) {
  Registry<std::function<int()>> r("thing.name", {{"b", [] { return 2; }}, {"a", [] { return 1; }}});
  r.add("c", [] { return 3; });
  EXPECT_EQ(r.get("c")(), 3);
  EXPECT_EQ(r.names(), (std::vector<std::string>{"a", "b", "c"}));
  std::string e = error_of([&] { r.get("d", " here"); });
  EXPECT_NE(e.find("thing.name must be one of a | b | c here (got 'd')"), std::string::npos) << e;
  EXPECT_THROW(r.add("a", [] { return 9; }), UsageError);
  EXPECT_THROW(r.add("e", {}), UsageError);
  EXPECT_EQ(r.get("a")(), 1);
}

TEST(Registry, TasksAreOpenToThePrograms) {
  register_task("test-task", [](const Config&, const World&) -> std::unique_ptr<Task> {
    throw DataError("test-task was built");
  });
  auto names = task_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "test-task"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "image-classify"), names.end());
  Config cfg;
  cfg.train.task = "test-task";
  EXPECT_EQ(error_of([&] { make_task(cfg, World{}); }), "test-task was built");
  EXPECT_THROW(register_task("image-classify", nullptr), UsageError);
}

TEST(PhaseTimer, MeansPerStepInPhaseOrder) {
  PhaseTimer t;
  t.add(Phase::kForward, 0.3);
  t.add(Phase::kComm, 0.1);
  t.end_step();
  t.add(Phase::kForward, 0.1);
  t.end_step();
  auto m = t.per_step();
  ASSERT_EQ(m.size(), static_cast<size_t>(kPhaseCount));
  EXPECT_DOUBLE_EQ(m[static_cast<int>(Phase::kForward)], 0.2);
  EXPECT_DOUBLE_EQ(m[static_cast<int>(Phase::kComm)], 0.05);
  EXPECT_STREQ(phase_name(Phase::kOptim), "optim");
  t.reset();
  EXPECT_DOUBLE_EQ(t.per_step()[1], 0.0);
  EXPECT_DOUBLE_EQ(eta_seconds(10.0, 5, 20), 40.0);
}

namespace {

// What a library user's reporter sees.
struct Recorder : Reporter {
  std::vector<TrainReport> trains;
  std::vector<EvalReport> evals;
  int64_t progress_steps = 0;
  std::vector<std::string> messages;
  void message(const std::string& line) override { messages.push_back(line); }
  void progress(const StepProgress& p) override { progress_steps = p.step; }
  void train(const TrainReport& r) override { trains.push_back(r); }
  void eval(const EvalReport& r) override { evals.push_back(r); }
};

}  // namespace

TEST(Trainer, ReportsToTheReporterItIsGiven) {
  if (!cohort::test::have_fashion_mnist()) GTEST_SKIP() << "SKIPPED: dataset-fashion-mnist is not installed";
  TempDir tmp;
  Config cfg = cohort::test::small_mlp_run();
  cfg.train.max_steps = 6;
  cfg.data.global_batch = 16;
  cfg.log.every_steps = 3;
  cfg.eval.max_samples = 100;
  RunOptions run;
  run.out_dir = tmp / "run";
  run.config_toml = "# test\n";
  auto recorder = std::make_shared<Recorder>();
  run.reporter = recorder;
  auto comm = Comm::single();
  Trainer(cfg, *comm, run).run();
  ASSERT_EQ(recorder->trains.size(), 2u);
  EXPECT_EQ(recorder->trains[1].step, 6);
  EXPECT_EQ(recorder->trains[1].samples, 6 * 16);
  EXPECT_EQ(recorder->trains[1].phase_ms.size(), static_cast<size_t>(kPhaseCount));
  EXPECT_GT(metric_value(recorder->trains[1].metrics, "loss"), 0.0);
  ASSERT_EQ(recorder->evals.size(), 1u);
  EXPECT_EQ(recorder->evals[0].count, 100);
  EXPECT_EQ(recorder->progress_steps, 6);
  EXPECT_NE(recorder->messages.back().find("cohort: done: 6 steps"), std::string::npos);
  // Replaced, the default reporters write nothing.
  EXPECT_FALSE(fs::exists(tmp / "run/metrics.jsonl"));
  EXPECT_TRUE(fs::exists(tmp / "run/checkpoints/step-6"));

  // data.path may change on resume, the data may not: the checkpoint
  // records the training set's size.
  std::string state = cohort::read_file(tmp / "run/checkpoints/step-6/state.json");
  ASSERT_NE(state.find("\"train_samples\": 60000"), std::string::npos) << state;
  // Edited as a user with another data set would have it, re-signed.
  auto edited = nlohmann::json::parse(state);
  edited["train_samples"] = 59999;
  edited.erase("state_sha256");
  edited["state_sha256"] = cohort::sha256_hex(edited.dump());
  write_file(tmp / "run/checkpoints/step-6/state.json", edited.dump(2));
  cfg.train.max_steps = 8;
  run.start = cohort::StartFromCheckpoint{Checkpoints::resolve(tmp / "run", nullptr)};
  std::string e = error_of([&] { Trainer(cfg, *comm, run); });
  EXPECT_NE(e.find("was trained on 59999 samples but /usr/share/datasets/fashion-mnist holds 60000"),
            std::string::npos) << e;
}
