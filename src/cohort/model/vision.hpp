// defines: ImageModelSpec, make_image_model
//
// Small classifiers for single-channel images (Fashion-MNIST's 28x28):
//   mlp: flatten -> Linear(hidden) -> ReLU -> Dropout -> Linear(hidden) -> ReLU -> Linear(classes)
//   cnn: two conv(3x3)+ReLU+maxpool(2) blocks (32, 64 channels) -> Linear(hidden) -> Linear(classes)
// Both map [B,1,H,W] float to [B,classes] logits.
#pragma once

#include <torch/nn/module.h>

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

// Builds model.name. Throws ConfigError listing the known names.
ImageModel make_image_model(const ModelOptions& opts, const ImageModelSpec& spec);

// Names make_image_model accepts.
std::vector<std::string> image_model_names();

}  // namespace cohort
