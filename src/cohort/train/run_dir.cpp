#include "cohort/train/run_dir.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>

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

bool RunDir::has_train_line(int64_t step) const {
  std::ifstream in(metrics_file());
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("kind", "") == "train" && j.value("step", int64_t{-1}) == step) return true;
  }
  return false;
}

size_t RunDir::complete_sample_ids(int64_t step, int64_t epoch, const std::vector<int64_t>& step_ids, int rank) const {
  std::set<int64_t> missing(step_ids.begin(), step_ids.end());
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(path_) / "sample-ids", ec)) {
    std::ifstream in(e.path());
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object() || j.value("step", int64_t{-1}) != step || !j.contains("ids")) continue;
      for (const auto& id : j["ids"]) missing.erase(id.get<int64_t>());
    }
  }
  if (missing.empty()) return 0;
  std::string file = sample_ids_file(rank);
  fs::create_directories(fs::path(file).parent_path(), ec);
  // Ids in the step's own order, as its ranks would have logged them.
  std::vector<int64_t> ids;
  for (int64_t id : step_ids) {
    if (missing.count(id)) ids.push_back(id);
  }
  std::ofstream out(file, std::ios::app);
  out << nlohmann::json({{"step", step}, {"epoch", epoch}, {"ids", ids}, {"recovered", true}}).dump() << '\n'
      << std::flush;
  COHORT_CHECK(out.good(), Error, file, ": cannot write the recovered sample ids of step ", step);
  return ids.size();
}

}  // namespace cohort
