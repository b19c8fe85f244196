#include "cohort/train/lifecycle/run.hpp"

#include <filesystem>

#include "cohort/core/error.hpp"
#include "cohort/core/files.hpp"
#include "cohort/train/lifecycle/run_dir.hpp"

namespace cohort {

namespace fs = std::filesystem;

namespace {

ResolvedCheckpoint resolve_checkpoint(const std::string& path, std::vector<std::string>& notes) {
  std::vector<std::string> warnings;
  ResolvedCheckpoint c = Checkpoints::resolve(path, &warnings);
  for (auto& w : warnings) notes.push_back("warning: " + w);
  return c;
}

}  // namespace

RunOptions plan_training(const TrainRequest& request, ConfigBinding& binding, Config& cfg) {
  RunOptions run;
  run.out_dir = request.out_dir;
  run.start = StartFresh{request.overwrite};
  run.job_id = request.job_id;
  std::string resume_path = request.resume_path;
  if (!resume_path.empty() && run.out_dir.empty()) {
    // The run dir comes from --resume before a restart looks in it, so a
    // restart without --out continues from the run's newest checkpoint too.
    // Not verified here: by a restart, the checkpoint named may be pruned.
    fs::path p(resume_path);
    run.out_dir = fs::exists(p / "checkpoints") ? p.string() : Checkpoints::run_dir_of(resume_path);
  }
  if (request.generation > 0 && !run.out_dir.empty()) {
    // A restart continues from the run's own newest checkpoint (not an older
    // one named by --resume); without one it repeats the original start:
    // the --resume given, or a fresh run over what the failed one wrote.
    if (fs::exists(fs::path(run.out_dir) / "checkpoints" / "latest")) resume_path = run.out_dir;
    else if (resume_path.empty()) run.start = StartFresh{/*overwrite=*/true};
  }
  // Another live job's directory is refused before its checkpoints are read
  // (its keep rotation may prune them under a resume): by a worker of a job
  // (it knows its job id), and by a process that begins a job. Not by the
  // launcher of a node that may be joining the job that holds the lock:
  // rank 0's lock() decides for it.
  if (fs::is_directory(run.out_dir)) {
    if (!run.job_id.empty()) RunDir(run.out_dir).refuse_if_held(run.job_id);
    else if (request.starts_job) RunDir(run.out_dir).refuse_if_held(RunDirLock::new_job_id());
  }
  if (!resume_path.empty()) run.start = StartFromCheckpoint{resolve_checkpoint(resume_path, run.notes)};
  COHORT_CHECK(!run.out_dir.empty(), UsageError, "--out RUN_DIR is required (or --resume RUN_DIR)");
  COHORT_CHECK(!fs::exists(run.out_dir) || fs::is_directory(run.out_dir), UsageError, "--out ", run.out_dir,
               " is an existing file, not a run directory; choose another --out");
  if (!request.config_path.empty()) binding.apply_file(request.config_path);
  std::string saved_config;
  if (const ResolvedCheckpoint* from = run.checkpoint()) {
    const std::set<std::string> given = binding.given();
    std::string path = from->file("config.toml");
    binding.apply_file(path);  // the base under --config and flags
    saved_config = read_file(path);
    for (auto& note : reset_inert_keys(cfg, given)) run.notes.push_back(note);
  }
  validate(cfg);
  run.config_toml = binding.to_toml();
  if (run.checkpoint()) {
    for (auto& change : check_resume_config(saved_config, run.config_toml)) {
      run.notes.push_back("config change accepted on resume: " + change);
    }
  }
  return run;
}

EvalPlan plan_evaluation(const EvalRequest& request) {
  EvalPlan plan;
  plan.run.start = StartFromCheckpoint{resolve_checkpoint(request.checkpoint, plan.run.notes)};
  const ResolvedCheckpoint& from = *plan.run.checkpoint();
  plan.run.out_dir = Checkpoints::run_dir_of(from.dir);
  plan.run.evaluation = true;
  plan.cfg = load_config(from.file("config.toml"));
  plan.cfg.eval.split = request.split;
  plan.cfg.eval.max_samples = request.max_samples;
  // The run's own label names (bert-classify), so that eval and predict
  // need not read the train split and map ids as training did.
  if (auto labels = fs::path(plan.run.out_dir) / "labels.json"; plan.cfg.data.labels.empty() && fs::exists(labels)) {
    plan.cfg.data.labels = labels.string();
  }
  validate(plan.cfg);
  return plan;
}

}  // namespace cohort
