// Cohort extended from outside its tree: a model and a task of this
// program's own, registered before the command line runs. Everything else,
// from the launcher to checkpoints and metrics, is Cohort's:
//
//   cohort-footwear train --train.task footwear --model.name linear \
//       --nproc-per-node 2 --train.max-steps 60 --out runs/footwear
//
// The task asks of Fashion-MNIST whether an item is footwear (sandal,
// sneaker, ankle boot: 3 of its 10 classes; its own config key
// data.footwear-classes says which). The model is a linear map from pixels
// to logits; it serves the built-in image-classify task too.
#include <cohort/cli.hpp>
#include <cohort/config/config.hpp>
#include <cohort/data/idx.hpp>
#include <cohort/distributed/world.hpp>
#include <cohort/model/vision.hpp>
#include <cohort/train/task.hpp>
#include <torch/torch.h>

#include <sstream>

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

// Fashion-MNIST with label 1 for footwear (`classes`), else 0.
class FootwearData : public cohort::Dataset {
 public:
  FootwearData(cohort::ImageDataset images, std::vector<int64_t> classes)
      : images_(std::move(images)), classes_(std::move(classes)) {}
  int64_t size() const override { return images_.size(); }
  cohort::Example get(int64_t i) const override { return relabel(images_.get(i)); }
  cohort::Example get_batch(const std::vector<int64_t>& ids) const override {
    return relabel(images_.get_batch(ids));
  }
  std::string describe() const override { return "footwear or not: " + images_.describe(); }

 private:
  cohort::Example relabel(cohort::Example e) const {
    const auto& l = e.at("label");
    auto footwear = torch::zeros_like(l, torch::kBool);
    for (int64_t c : classes_) footwear |= l.eq(c);
    e["label"] = footwear.to(torch::kInt64);
    return e;
  }
  cohort::ImageDataset images_;
  std::vector<int64_t> classes_;
};

// data.footwear-classes: "5,7,9" -> {5, 7, 9}.
std::vector<int64_t> footwear_classes(const cohort::Config& cfg) {
  std::vector<int64_t> out;
  std::stringstream list(cfg.task_key<std::string>("data.footwear-classes"));
  for (std::string item; std::getline(list, item, ',');) out.push_back(std::stoll(item));
  return out;
}

class FootwearTask : public cohort::Task {
 public:
  FootwearTask(const cohort::Config& cfg, const cohort::World& world)
      : dir_(cfg.data.path),
        classes_(footwear_classes(cfg)),
        train_(std::make_shared<FootwearData>(cohort::ImageDataset::load(cfg.data.path, "train"), classes_)),
        device_(world.device) {
    auto probe = cohort::ImageDataset::load(cfg.data.path, "test");
    model_ = cohort::make_image_model(cfg.model, {probe.height(), probe.width(), 2});
    model_.module->to(device_);
  }

  std::shared_ptr<torch::nn::Module> module() override { return model_.module; }
  const cohort::Dataset& train_set() const override { return *train_; }
  std::shared_ptr<const cohort::Dataset> eval_set(const std::string& split) const override {
    if (split == "train") return train_;
    return std::make_shared<FootwearData>(cohort::ImageDataset::load(dir_, split), classes_);
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
    // Sums stay tensors: the trainer reads them once per log line, so that a
    // step never waits for the GPU.
    out.tally.add("loss", loss, n);
    out.tally.add("accuracy", predicted.eq(labels).sum(), n);
    // Of the footwear, the share found: the metric a 70% "never footwear"
    // classifier would fail.
    out.tally.add("recall", predicted.eq(1).logical_and(footwear).sum(), footwear.sum());
    return out;
  }

 private:
  std::string dir_;
  std::vector<int64_t> classes_;
  std::shared_ptr<FootwearData> train_;
  c10::Device device_;
  cohort::ImageModel model_;
};

}  // namespace

int main(int argc, char** argv) {
  cohort::register_image_model("linear", make_linear);
  cohort::register_task(
      "footwear", [](const cohort::Config& cfg, const cohort::World& world) {
        return std::make_unique<FootwearTask>(cfg, world);
      },
      {{"data.footwear-classes", std::string("5,7,9"), "footwear: the Fashion-MNIST classes that are footwear"}});
  return cohort::cli_main(argc, argv);
}
