#include "cohort/model/cross_entropy.hpp"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <cmath>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/model/dropout_lines.hpp"
#include "cohort/model/fast_math.hpp"

namespace cohort {

namespace cross_entropy_detail {

using dropout_detail::bf16_bits;
using dropout_detail::bf16_value;

// Partial sums and maxima over a row, in lanes, so that the reductions
// vectorise without reordering what the compiler may not.
constexpr int64_t kLanes = 16;

using fast_math::exp_nonpositive;

// One row of v bf16 logits against `label`: its log-sum-exp, and whether
// the label's logit is the row's first largest.
struct RowForward {
  float lse;
  bool hit;
};
COHORT_VECTOR_CLONES RowForward forward_row(const uint16_t* __restrict__ x, int64_t v, int64_t label) {
  const int64_t body = v - v % kLanes;
  float top[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) top[j] = -INFINITY;
  for (int64_t c0 = 0; c0 < body; c0 += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) {
      const float e = bf16_value(x[c0 + j]);
      top[j] = e > top[j] ? e : top[j];
    }
  }
  float m = -INFINITY;
  for (int64_t j = 0; j < kLanes; ++j) m = top[j] > m ? top[j] : m;
  for (int64_t c = body; c < v; ++c) m = bf16_value(x[c]) > m ? bf16_value(x[c]) : m;
  float acc[kLanes] = {};
  for (int64_t c0 = 0; c0 < body; c0 += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) acc[j] += exp_nonpositive(bf16_value(x[c0 + j]) - m);
  }
  float sum = 0;
  for (int64_t j = 0; j < kLanes; ++j) sum += acc[j];
  for (int64_t c = body; c < v; ++c) sum += exp_nonpositive(bf16_value(x[c]) - m);
  RowForward out{m + std::log(sum), false};
  if (bf16_value(x[label]) == m) {  // argmax's: the first largest
    out.hit = true;
    for (int64_t c = 0; c < label && out.hit; ++c) out.hit = bf16_value(x[c]) != m;
  }
  return out;
}

// The row's gradient, g (softmax - one-hot), rounded to bf16 as the unfused
// cast of the fp32 gradient rounds it.
COHORT_VECTOR_CLONES void backward_row(const uint16_t* __restrict__ x, int64_t v, int64_t label, float lse, float g,
                                       uint16_t* __restrict__ dx) {
  for (int64_t c = 0; c < v; ++c) dx[c] = bf16_bits(g * exp_nonpositive(bf16_value(x[c]) - lse));
  dx[label] = bf16_bits(g * exp_nonpositive(bf16_value(x[label]) - lse) + -g);
}

const uint16_t* bits(const torch::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.const_data_ptr()); }

int64_t grain(int64_t v) { return std::max<int64_t>(1, 65536 / std::max<int64_t>(v, 1)); }

// The forward over logits [N, V] bf16: each row's log-sum-exp (fp32 [N]),
// the summed loss (fp32 scalar, its rows summed in double in row order) and
// the hits (int64 scalar).
struct Forward {
  torch::Tensor lse, loss, hits;
};
Forward fused_forward(const torch::Tensor& logits, const torch::Tensor& labels) {
  const int64_t n = logits.size(0), v = logits.size(1);
  const uint16_t* x = bits(logits);
  const int64_t* y = labels.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    COHORT_CHECK(y[i] >= 0 && y[i] < v, Error, "cross_entropy_sum: row ", i, "'s label ", y[i], " is outside [0, ",
                 v, ")");
  }
  Forward f;
  f.lse = torch::empty({n}, logits.options().dtype(torch::kFloat));
  float* lse = f.lse.data_ptr<float>();
  std::vector<uint8_t> hit(static_cast<size_t>(n));
  at::parallel_for(0, n, grain(v), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      RowForward r = forward_row(x + i * v, v, y[i]);
      lse[i] = r.lse;
      hit[static_cast<size_t>(i)] = r.hit;
    }
  });
  double loss = 0;
  int64_t hits = 0;
  for (int64_t i = 0; i < n; ++i) {
    loss += static_cast<double>(lse[i]) - static_cast<double>(bf16_value(x[i * v + y[i]]));
    hits += hit[static_cast<size_t>(i)];
  }
  f.loss = torch::tensor(static_cast<float>(loss), logits.options().dtype(torch::kFloat));
  f.hits = torch::tensor(hits, torch::kInt64);
  return f;
}

struct CrossEntropyFunction : torch::autograd::Function<CrossEntropyFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                                                const torch::Tensor& labels) {
    Forward f = fused_forward(logits, labels);
    ctx->save_for_backward({logits, labels, f.lse});
    ctx->mark_non_differentiable({f.hits});
    return {f.loss, f.hits};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    COHORT_CHECK(!torch::GradMode::is_enabled(), Error, "the fused cross-entropy has no double backward");
    auto saved = ctx->get_saved_variables();
    const torch::Tensor &logits = saved[0], &labels = saved[1], &lse_t = saved[2];
    if (!grads[0].defined()) return {torch::Tensor(), torch::Tensor()};
    const float g = grads[0].to(torch::kFloat).item<float>();
    const int64_t n = logits.size(0), v = logits.size(1);
    auto dx = torch::empty({n, v}, logits.options());
    const uint16_t* x = bits(logits);
    const int64_t* y = labels.const_data_ptr<int64_t>();
    const float* lse = lse_t.const_data_ptr<float>();
    auto* d = reinterpret_cast<uint16_t*>(dx.data_ptr());
    at::parallel_for(0, n, grain(v), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) backward_row(x + i * v, v, y[i], lse[i], g, d + i * v);
    });
    return {dx, torch::Tensor()};
  }
};

}  // namespace cross_entropy_detail

CrossEntropySum cross_entropy_sum_unfused(const torch::Tensor& logits, const torch::Tensor& labels) {
  auto x = logits.to(torch::kFloat32);
  CrossEntropySum out;
  out.loss = torch::nn::functional::cross_entropy(
      x, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  // On the CPU argmax is a scalar loop over every logit; only rows whose
  // label's logit reaches the row's largest (a vectorised reduction) can
  // count, so argmax searches those alone.
  if (!x.is_cpu()) {
    out.hits = x.argmax(1).eq(labels).sum();
  } else {
    auto rows = x.gather(1, labels.unsqueeze(1)).squeeze(1).ge(x.amax(1)).nonzero().squeeze(1);
    out.hits = x.index_select(0, rows).argmax(1).eq(labels.index_select(0, rows)).sum();
  }
  return out;
}

CrossEntropySum cross_entropy_sum(const torch::Tensor& logits, const torch::Tensor& labels) {
  const bool fusable = logits.is_cpu() && labels.is_cpu() && logits.scalar_type() == torch::kBFloat16 &&
                       labels.scalar_type() == torch::kInt64 && logits.dim() == 2 && labels.dim() == 1 &&
                       labels.size(0) == logits.size(0) && logits.size(1) > 0;
  if (!fusable) return cross_entropy_sum_unfused(logits, labels);
  auto x = logits.contiguous();
  auto y = labels.contiguous();
  if (!(torch::GradMode::is_enabled() && x.requires_grad())) {  // evaluating: nothing kept for a backward
    auto f = cross_entropy_detail::fused_forward(x, y);
    return {f.loss, f.hits};
  }
  auto outs = cross_entropy_detail::CrossEntropyFunction::apply(x, y);
  return {outs[0], outs[1]};
}

}  // namespace cohort
