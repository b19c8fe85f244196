#include "cohort/model/vision.hpp"

#include <torch/nn.h>

#include <functional>
#include <map>

#include "cohort/config/config.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/registry.hpp"
#include "cohort/model/dropout.hpp"
#include "cohort/model/model_size.hpp"

namespace cohort {

namespace {

struct MlpImpl : torch::nn::Module {
  MlpImpl(const ModelOptions& o, const ImageModelSpec& s)
      : fc1(register_module("fc1", torch::nn::Linear(s.height * s.width, o.hidden))),
        fc2(register_module("fc2", torch::nn::Linear(o.hidden, o.hidden))),
        out(register_module("out", torch::nn::Linear(o.hidden, s.classes))),
        dropout1(register_module("dropout1", SampleDropout(o.dropout, 0))),
        dropout2(register_module("dropout2", SampleDropout(o.dropout, 1))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(fc1(x.flatten(1)));
    h = torch::relu(fc2(dropout1(h)));
    return out(dropout2(h));
  }

  torch::nn::Linear fc1, fc2, out;
  SampleDropout dropout1, dropout2;
};

struct CnnImpl : torch::nn::Module {
  CnnImpl(const ModelOptions& o, const ImageModelSpec& s)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3).padding(1)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1)))),
        fc(register_module("fc", torch::nn::Linear(64 * (s.height / 4) * (s.width / 4), o.hidden))),
        out(register_module("out", torch::nn::Linear(o.hidden, s.classes))),
        dropout(register_module("dropout", SampleDropout(o.dropout, 0))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::max_pool2d(torch::relu(conv1(x)), 2);
    h = torch::max_pool2d(torch::relu(conv2(h)), 2);
    h = torch::relu(fc(h.flatten(1)));
    return out(dropout(h));
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc, out;
  SampleDropout dropout;
};

template <class Impl>
ImageModel wrap(std::shared_ptr<Impl> m) {
  return {m, [m](const torch::Tensor& x) { return m->forward(x); }};
}

// Adding a model here: write its Module above and list it below. A program
// built on the library calls register_image_model instead.
Registry<ImageModelFactory>& models() {
  static Registry<ImageModelFactory> r(
      "model.name", {{"mlp", [](auto& o, auto& s) { return wrap(std::make_shared<MlpImpl>(o, s)); }},
                     {"cnn", [](auto& o, auto& s) { return wrap(std::make_shared<CnnImpl>(o, s)); }}});
  return r;
}

}  // namespace

void register_image_model(const std::string& name, ImageModelFactory factory) {
  models().add(name, std::move(factory));
}

std::vector<std::string> image_model_names() { return models().names(); }

ImageModel make_image_model(const ModelOptions& opts, const ImageModelSpec& spec) {
  auto factory = models().get(opts.name, " for image tasks");
  COHORT_CHECK(spec.height >= 4 && spec.width >= 4, DataError, "images of ", spec.height, "x",
               spec.width, " are too small for model ", opts.name);
  // The built-in models' size, before any tensor is allocated.
  const double h = static_cast<double>(opts.hidden), c = static_cast<double>(spec.classes);
  const double pixels = static_cast<double>(spec.height) * static_cast<double>(spec.width);
  if (opts.name == "mlp") {
    check_model_fits(pixels * h + h * h + h * c + 2 * h + c, detail::cat("model.hidden ", opts.hidden), "mlp");
  } else if (opts.name == "cnn") {
    const double features = 64.0 * static_cast<double>(spec.height / 4) * static_cast<double>(spec.width / 4);
    check_model_fits(features * h + h * c + h + c + 18816 + 96, detail::cat("model.hidden ", opts.hidden), "cnn");
  }
  return factory(opts, spec);
}

}  // namespace cohort
