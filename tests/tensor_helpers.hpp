// defines: cohort::test::max_abs
#pragma once

#include <torch/types.h>

namespace cohort::test {

inline double max_abs(const torch::Tensor& t) { return t.abs().max().item<double>(); }

}  // namespace cohort::test
