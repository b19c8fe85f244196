#include "cohort/train/task.hpp"


#include "cohort/config/config.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/registry.hpp"
#include "cohort/train/tasks/registry.hpp"

namespace cohort {

namespace {

Registry<TaskFactory>& tasks() {
  static Registry<TaskFactory> r("train.task", {{"bert-classify", make_bert_classify_task},
                                                {"bert-pretrain", make_bert_pretrain_task},
                                                {"image-classify", make_image_classify_task}});
  return r;
}

}  // namespace

void register_task(const std::string& name, TaskFactory factory, const std::vector<TaskKey>& keys) {
  tasks().add(name, std::move(factory));
  std::vector<TaskKey> owned = keys;
  for (auto& k : owned) {
    if (k.task.empty()) k.task = name;
  }
  declare_task_keys(owned);
}

std::vector<std::string> task_names() { return tasks().names(); }

std::unique_ptr<Task> make_task(const Config& cfg, const World& world) {
  return tasks().get(cfg.train.task)(cfg, world);
}

Tally Task::empty_tally() const {
  Tally t;
  for (const auto& name : metric_names()) t.add(name, 0, 0);
  return t;
}

double mean_or_zero(const Tally& tally, const std::string& name) {
  return tally.count(name) > 0 ? tally.mean(name) : 0.0;
}

std::vector<std::pair<std::string, double>> Task::report(const Tally& tally) const {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& name : tally.names()) out.emplace_back(name, mean_or_zero(tally, name));
  return out;
}

std::shared_ptr<const Dataset> Task::input_set(const std::string& path) const {
  throw UsageError(detail::cat("this train.task cannot predict (", path, "); bert-classify can"));
}

torch::Tensor Task::probabilities(const Example& /*batch*/) {
  throw UsageError("this train.task cannot predict; bert-classify can");
}

Example to_device(const Example& batch, const c10::Device& device) {
  Example out;
  for (const auto& [name, t] : batch) out[name] = t.to(device, /*non_blocking=*/true);
  return out;
}

}  // namespace cohort
