#include "cohort/train/run_dir.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "cohort/core/error.hpp"
#include "cohort/core/files.hpp"

namespace cohort {

namespace fs = std::filesystem;

std::string RunDir::metrics_file() const { return (fs::path(path_) / "metrics.jsonl").string(); }
std::string RunDir::tensorboard_dir() const { return (fs::path(path_) / "tensorboard").string(); }
std::string RunDir::sample_ids_file(int rank) const {
  return (fs::path(path_) / "sample-ids" / ("rank-" + std::to_string(rank) + ".jsonl")).string();
}

std::vector<std::string> RunDir::prepare(RunMode mode, const std::string& config_toml, int64_t resumed_step) const {
  COHORT_CHECK(!path_.empty(), UsageError, "--out RUN_DIR is required");
  fs::path dir(path_);
  COHORT_CHECK(mode != RunMode::kFresh || !(fs::exists(dir / "metrics.jsonl") || fs::exists(dir / "checkpoints")),
               UsageError, path_, " already holds a run (metrics.jsonl or checkpoints/); choose a new --out, continue it with --resume ", path_,
               ", or pass --overwrite");
  std::error_code ec;
  fs::create_directories(dir, ec);
  COHORT_CHECK(!ec, Error, path_, ": cannot create directory (", ec.message(), ")");
  std::vector<std::string> notes;
  if (mode == RunMode::kOverwrite) {
    fs::remove(dir / "metrics.jsonl", ec);
    fs::remove_all(dir / "checkpoints", ec);
    fs::remove_all(dir / "sample-ids", ec);
  } else if (mode == RunMode::kResume) {
    notes = set_aside_checkpoints_after(resumed_step);
    drop_lines_after(metrics_file(), resumed_step);
    // The steps after the checkpoint are trained again: a crash must not
    // leave their sample ids logged twice.
    for (const auto& e : fs::directory_iterator(dir / "sample-ids", ec)) {
      if (e.path().extension() == ".jsonl") drop_lines_after(e.path().string(), resumed_step);
    }
  }
  write_file_atomically((dir / "config.toml").string(), config_toml);
  return notes;
}

void RunDir::drop_lines_after(const std::string& file, int64_t step) {
  std::ifstream in(file);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    try {
      if (nlohmann::json::parse(line).value("step", int64_t{0}) > step) continue;
    } catch (const std::exception&) {
      continue;  // a torn last line from a crash
    }
    kept += line + "\n";
  }
  write_file_atomically(file, kept);
}

std::vector<std::string> RunDir::set_aside_checkpoints_after(int64_t step) const {
  // So that `latest` and pruning follow the resumed line.
  std::vector<std::string> notes;
  fs::path root = fs::path(path_) / "checkpoints";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::string n = e.path().filename().string();
    if (Checkpoints::step_of(n) <= step) continue;
    fs::path target = root / ("abandoned-" + n);
    for (int k = 2; fs::exists(target); ++k) target = root / ("abandoned-" + n + "-" + std::to_string(k));
    fs::rename(e.path(), target, ec);
    COHORT_CHECK(!ec, Error, "cannot move aside newer checkpoint ", e.path().string(), ": ", ec.message());
    notes.push_back("moved aside newer checkpoint " + n + " (now " + target.filename().string() + ")");
  }
  return notes;
}

}  // namespace cohort
