// Cohort extended from outside its tree: a model and a task of this
// program's own, registered before the command line runs. Everything else,
// from the launcher to checkpoints and metrics, is Cohort's:
//
//   cohort-footwear train --train.task footwear --model.name linear \
//       --nproc-per-node 2 --train.max-steps 60 --out runs/footwear
//
// The task asks of Fashion-MNIST whether an item is footwear (sandal,
// sneaker, ankle boot: 3 of its 10 classes). The model is a linear map from
// pixels to logits; it serves the built-in image-classify task too.
#include <cohort/cli.hpp>
#include <cohort/config/config.hpp>
#include <cohort/data/idx.hpp>
#include <cohort/distributed/world.hpp>
#include <cohort/model/vision.hpp>
#include <cohort/train/task.hpp>
#include <torch/torch.h>

namespace {

// model.name = linear: [B,1,H,W] -> [B,classes].
struct LinearImpl : torch::nn::Module {
  LinearImpl(int64_t pixels, int64_t classes) : fc(register_module("fc", torch::nn::Linear(pixels, classes))) {}
  torch::Tensor forward(const torch::Tensor& images) { return fc->forward(images.flatten(1)); }
  torch::nn::Linear fc;
};

cohort::ImageModel make_linear(const cohort::ModelOptions&, const cohort::ImageModelSpec& spec) {
  auto m = std::make_shared<LinearImpl>(spec.height * spec.width, spec.classes);
  return {m, [m](const torch::Tensor& x) { return m->forward(x); }};
}

// Fashion-MNIST with label 1 for footwear (classes 5, 7, 9), else 0.
class FootwearData : public cohort::Dataset {
 public:
  explicit FootwearData(cohort::ImageDataset images) : images_(std::move(images)) {}
  int64_t size() const override { return images_.size(); }
  cohort::Example get(int64_t i) const override { return relabel(images_.get(i)); }
  cohort::Example get_batch(const std::vector<int64_t>& ids) const override {
    return relabel(images_.get_batch(ids));
  }
  std::string describe() const override { return "footwear or not: " + images_.describe(); }

 private:
  static cohort::Example relabel(cohort::Example e) {
    const auto& l = e.at("label");
    e["label"] = (l.eq(5) | l.eq(7) | l.eq(9)).to(torch::kInt64);
    return e;
  }
  cohort::ImageDataset images_;
};

class FootwearTask : public cohort::Task {
 public:
  FootwearTask(const cohort::Config& cfg, const cohort::World& world)
      : dir_(cfg.data.path),
        train_(std::make_shared<FootwearData>(cohort::ImageDataset::load(cfg.data.path, "train"))),
        device_(world.device) {
    auto probe = cohort::ImageDataset::load(cfg.data.path, "test");
    model_ = cohort::make_image_model(cfg.model, {probe.height(), probe.width(), 2});
    model_.module->to(device_);
  }

  std::shared_ptr<torch::nn::Module> module() override { return model_.module; }
  const cohort::Dataset& train_set() const override { return *train_; }
  std::shared_ptr<const cohort::Dataset> eval_set(const std::string& split) const override {
    if (split == "train") return train_;
    return std::make_shared<FootwearData>(cohort::ImageDataset::load(dir_, split));
  }
  std::string unit_name() const override { return "images"; }
  std::vector<std::string> metric_names() const override { return {"accuracy", "loss", "recall"}; }
  cohort::Units count_units(const cohort::Example& batch) const override {
    int64_t n = batch.at("label").size(0);
    return {{n}, n};
  }
  bool units_are_samples() const override { return true; }

  cohort::TaskOutput forward(const cohort::Example& batch) override {
    const auto& labels = batch.at("label");
    auto logits = model_.forward(batch.at("image")).to(torch::kFloat32);
    auto loss = torch::nn::functional::cross_entropy(
        logits, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
    auto predicted = logits.argmax(1);
    auto footwear = labels.eq(1);
    cohort::TaskOutput out;
    out.loss_sums = {loss};
    double n = static_cast<double>(labels.size(0));
    out.tally.add("loss", loss.detach().item<double>(), n);
    out.tally.add("accuracy", predicted.eq(labels).sum().item<double>(), n);
    // Of the footwear, the share found: the metric a 70% "never footwear"
    // classifier would fail.
    out.tally.add("recall", predicted.eq(1).logical_and(footwear).sum().item<double>(),
                  footwear.sum().item<double>());
    return out;
  }

 private:
  std::string dir_;
  std::shared_ptr<FootwearData> train_;
  c10::Device device_;
  cohort::ImageModel model_;
};

}  // namespace

int main(int argc, char** argv) {
  cohort::register_image_model("linear", make_linear);
  cohort::register_task("footwear", [](const cohort::Config& cfg, const cohort::World& world) {
    return std::make_unique<FootwearTask>(cfg, world);
  });
  return cohort::cli_main(argc, argv);
}
