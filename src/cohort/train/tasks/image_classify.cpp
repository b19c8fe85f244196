// The image-classify task: an IDX image dataset (Fashion-MNIST) and a small
// classifier from model/vision.hpp. Metrics: loss, accuracy.
#include <torch/nn/functional.h>

#include "cohort/config/config.hpp"
#include "cohort/data/idx.hpp"
#include "cohort/distributed/world.hpp"
#include "cohort/model/vision.hpp"
#include "cohort/train/tasks/registry.hpp"

namespace cohort {

namespace {

class ImageClassifyTask : public Task {
 public:
  ImageClassifyTask(const Config& cfg, const World& world)
      : dir_(cfg.data.path),
        train_(std::make_shared<ImageDataset>(ImageDataset::load(cfg.data.path, "train"))),
        device_(world.device) {
    model_ = make_image_model(cfg.model, {train_->height(), train_->width(), train_->num_classes()});
    model_.module->to(device_);
  }

  std::shared_ptr<torch::nn::Module> module() override { return model_.module; }
  const Dataset& train_set() const override { return *train_; }
  std::string unit_name() const override { return "images"; }
  std::vector<std::string> metric_names() const override { return {"accuracy", "loss"}; }

  std::shared_ptr<const Dataset> eval_set(const std::string& split) const override {
    if (split == "train") return train_;
    auto set = std::make_shared<ImageDataset>(ImageDataset::load(dir_, split));
    COHORT_CHECK(set->height() == train_->height() && set->width() == train_->width(), DataError, set->describe(),
                 ": images of ", set->height(), "x", set->width(), " but the training set's are ", train_->height(),
                 "x", train_->width(), "; the model takes one shape (is data.path a mix of two datasets?)");
    COHORT_CHECK(set->num_classes() <= train_->num_classes(), DataError, set->describe(), ": a label of ",
                 set->num_classes() - 1, " is outside the training set's ", train_->num_classes(), " classes");
    return set;
  }

  Units count_units(const Example& batch) const override {
    int64_t n = batch.at("label").size(0);
    return {{n}, n};
  }
  bool units_are_samples() const override { return true; }

  TaskOutput forward(const Example& batch) override {
    const auto& images = batch.at("image");
    const auto& labels = batch.at("label");
    auto logits = model_.forward(images).to(torch::kFloat32);
    TaskOutput out;
    auto loss_sum = torch::nn::functional::cross_entropy(
        logits, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
    out.loss_sums = {loss_sum};
    double n = static_cast<double>(labels.size(0));
    out.tally.add("loss", loss_sum, n);
    out.tally.add("accuracy", logits.argmax(1).eq(labels).sum(), n);
    return out;
  }

 private:
  std::string dir_;
  std::shared_ptr<ImageDataset> train_;
  c10::Device device_;
  ImageModel model_;
};

}  // namespace

std::unique_ptr<Task> make_image_classify_task(const Config& cfg, const World& world) {
  return std::make_unique<ImageClassifyTask>(cfg, world);
}

}  // namespace cohort
