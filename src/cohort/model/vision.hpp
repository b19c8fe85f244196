// defines: ImageModelSpec, ImageModel, ImageModelFactory, register_image_model,
//          make_image_model, image_model_names
//
// Small classifiers for single-channel images (Fashion-MNIST's 28x28):
//   mlp: flatten -> Linear(hidden) -> ReLU -> Dropout -> Linear(hidden) -> ReLU -> Linear(classes)
//   cnn: two conv(3x3)+ReLU+maxpool(2) blocks (32, 64 channels) -> Linear(hidden) -> Linear(classes)
// Both map [B,1,H,W] float to [B,classes] logits.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace cohort {

struct ModelOptions;

struct ImageModelSpec {
  int64_t height = 28;
  int64_t width = 28;
  int64_t classes = 10;
};

// A model is any Module whose forward is reachable through this callable.
struct ImageModel {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
};

using ImageModelFactory = std::function<ImageModel(const ModelOptions& opts, const ImageModelSpec& spec)>;

// Makes `name` a model.name for image tasks. Call it before the config is
// used. UsageError when the name is taken.
void register_image_model(const std::string& name, ImageModelFactory factory);

// Builds model.name. Throws ConfigError listing the registered names.
ImageModel make_image_model(const ModelOptions& opts, const ImageModelSpec& spec);

// Names make_image_model accepts.
std::vector<std::string> image_model_names();

}  // namespace cohort
