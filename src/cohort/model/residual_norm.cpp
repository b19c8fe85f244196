#include "cohort/model/residual_norm.hpp"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <cmath>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/model/dropout.hpp"
#include "cohort/model/dropout_lines.hpp"

namespace cohort {

using namespace dropout_detail;

namespace {

// Rows per block of the weight and bias gradients: each block sums its rows
// into partial sums of its own, and the blocks are added in order, so the
// result does not depend on the number of threads.
constexpr int64_t kBlockRows = 32;
// Partial sums over a row, in lanes.
constexpr int64_t kLanes = 16;

// One row's dropout: element c of x is kept (and scaled) when the hash
// clears the threshold; with no dropout every element is kept unscaled.
struct RowDrop {
  bool on = false;
  uint64_t seed = 0, threshold = 0;
  float scale = 1.0f;
};

// x's elements as the unfused ops see them: dropout in x's own dtype (for
// bf16, the product rounded back to bf16, as SampleDropout writes it).
inline float dropped(float x, float f) { return x * f; }
inline float dropped(uint16_t x, float f) { return bf16_value(bf16_bits(bf16_value(x) * f)); }
// The gradient of x from the sum's gradient g: autograd rounds g to x's
// dtype, and dropout's backward scales it there.
inline void store_grad(float* dx, int64_t c, float g, float f) { dx[c] = g * f; }
inline void store_grad(uint16_t* dx, int64_t c, float g, float f) { dx[c] = bf16_bits(bf16_value(bf16_bits(g)) * f); }

inline float lane_sum(const float* acc) {
  float total = 0;
  for (int64_t j = 0; j < kLanes; ++j) total += acc[j];
  return total;
}

// The row's dropout factors: 0 or the scale, or all 1 with no dropout.
[[gnu::always_inline]] inline void row_factors(const RowDrop& drop, int64_t h, float* __restrict__ f) {
  const uint64_t seed = drop.seed, threshold = drop.threshold;
  const float scale = drop.scale;
  if (drop.on) {
    for (int64_t c = 0; c < h; ++c) f[c] = kept(seed, c, threshold) ? scale : 0.0f;
  } else {
    for (int64_t c = 0; c < h; ++c) f[c] = 1.0f;
  }
}

// Forward of one row of h elements, f its dropout factors: s = dropout(x) +
// r, kept for the backward; y = (s - mean) * rstd * w + b, and its bf16
// rounding in y_low.
template <class X>
[[gnu::always_inline]] inline void forward_row_body(const X* __restrict__ x, const float* __restrict__ r, const float* __restrict__ w,
                             const float* __restrict__ b, int64_t h, const float* __restrict__ f, float eps,
                             float* __restrict__ s, float* __restrict__ y, uint16_t* __restrict__ y_low,
                             float* mean_out, float* rstd_out) {
  float acc[kLanes] = {};
  const int64_t body = h - h % kLanes;
  for (int64_t c0 = 0; c0 < body; c0 += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) {
      const int64_t c = c0 + j;
      s[c] = dropped(x[c], f[c]) + r[c];
      acc[j] += s[c];
    }
  }
  for (int64_t c = body; c < h; ++c) {
    s[c] = dropped(x[c], f[c]) + r[c];
    acc[0] += s[c];
  }
  const float mean = lane_sum(acc) / static_cast<float>(h);
  float sq[kLanes] = {};
  for (int64_t c0 = 0; c0 < body; c0 += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) {
      const float d = s[c0 + j] - mean;
      sq[j] += d * d;
    }
  }
  for (int64_t c = body; c < h; ++c) sq[0] += (s[c] - mean) * (s[c] - mean);
  const float rstd = 1.0f / std::sqrt(lane_sum(sq) / static_cast<float>(h) + eps);
  for (int64_t c = 0; c < h; ++c) y[c] = (s[c] - mean) * rstd * w[c] + b[c];
  if (y_low != nullptr) {
    for (int64_t c = 0; c < h; ++c) y_low[c] = bf16_bits(y[c]);
  }
  *mean_out = mean;
  *rstd_out = rstd;
}

// Backward of one row, f its dropout factors: g is the gradient of y (dy,
// plus dy_low where the bf16 copy was read); ds = rstd * (g w - mean(g w) -
// xhat mean(g w xhat)); dr = ds, dx = dropout's backward of ds in x's dtype;
// dw += g xhat, db += g.
template <class X>
[[gnu::always_inline]] inline void backward_row_body(const float* __restrict__ dy, const uint16_t* __restrict__ dy_low,
                              const float* __restrict__ s, const float* __restrict__ w, int64_t h, float mean,
                              float rstd, const float* __restrict__ f, float* __restrict__ g, float* __restrict__ dr,
                              X* __restrict__ dx, float* __restrict__ dw, float* __restrict__ db) {
  if (dy != nullptr && dy_low != nullptr) {
    for (int64_t c = 0; c < h; ++c) g[c] = dy[c] + bf16_value(dy_low[c]);
  } else if (dy != nullptr) {
    for (int64_t c = 0; c < h; ++c) g[c] = dy[c];
  } else {
    for (int64_t c = 0; c < h; ++c) g[c] = bf16_value(dy_low[c]);
  }
  float a1[kLanes] = {}, a2[kLanes] = {};
  const int64_t body = h - h % kLanes;
  for (int64_t c0 = 0; c0 < body; c0 += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) {
      const int64_t c = c0 + j;
      const float xhat = (s[c] - mean) * rstd, gw = g[c] * w[c];
      a1[j] += gw;
      a2[j] += gw * xhat;
      dw[c] += g[c] * xhat;
      db[c] += g[c];
    }
  }
  for (int64_t c = body; c < h; ++c) {
    const float xhat = (s[c] - mean) * rstd, gw = g[c] * w[c];
    a1[0] += gw;
    a2[0] += gw * xhat;
    dw[c] += g[c] * xhat;
    db[c] += g[c];
  }
  const float m1 = lane_sum(a1) / static_cast<float>(h), m2 = lane_sum(a2) / static_cast<float>(h);
  for (int64_t c = 0; c < h; ++c) {
    const float xhat = (s[c] - mean) * rstd;
    const float ds = rstd * (g[c] * w[c] - m1 - xhat * m2);
    dr[c] = ds;
    store_grad(dx, c, ds, f[c]);
  }
}

// The bodies compiled for each x dtype, and for each vector width (target
// clones cannot be templates; the bodies are always inlined, or they would
// be compiled once, for the baseline ISA).
// f is scratch for the row's factors.
COHORT_VECTOR_CLONES void forward_row(const float* x, const float* r, const float* w, const float* b, int64_t h,
                                      const RowDrop& drop, float eps, float* f, float* s, float* y, uint16_t* y_low,
                                      float* mean, float* rstd) {
  row_factors(drop, h, f);
  forward_row_body(x, r, w, b, h, f, eps, s, y, y_low, mean, rstd);
}
COHORT_VECTOR_CLONES void forward_row(const uint16_t* x, const float* r, const float* w, const float* b, int64_t h,
                                      const RowDrop& drop, float eps, float* f, float* s, float* y, uint16_t* y_low,
                                      float* mean, float* rstd) {
  row_factors(drop, h, f);
  forward_row_body(x, r, w, b, h, f, eps, s, y, y_low, mean, rstd);
}
COHORT_VECTOR_CLONES void backward_row(const float* dy, const uint16_t* dy_low, const float* s, const float* w,
                                       int64_t h, float mean, float rstd, const RowDrop& drop, float* f, float* g,
                                       float* dr, float* dx, float* dw, float* db) {
  row_factors(drop, h, f);
  backward_row_body(dy, dy_low, s, w, h, mean, rstd, f, g, dr, dx, dw, db);
}
COHORT_VECTOR_CLONES void backward_row(const float* dy, const uint16_t* dy_low, const float* s, const float* w,
                                       int64_t h, float mean, float rstd, const RowDrop& drop, float* f, float* g,
                                       float* dr, uint16_t* dx, float* dw, float* db) {
  row_factors(drop, h, f);
  backward_row_body(dy, dy_low, s, w, h, mean, rstd, f, g, dr, dx, dw, db);
}

// Row `row`'s dropout from the lines' seeds (nullptr: no dropout).
RowDrop row_drop(const uint64_t* seeds, int64_t row, uint64_t threshold, float scale) {
  RowDrop d;
  if (seeds == nullptr) return d;
  d.on = true;
  d.seed = seeds[row];
  d.threshold = threshold;
  d.scale = scale;
  return d;
}
const uint64_t* seeds_of(const torch::Tensor& seeds) {
  return seeds.numel() == 0 ? nullptr : reinterpret_cast<const uint64_t*>(seeds.const_data_ptr<int64_t>());
}

// x dtype dispatch: fp32, or bf16 as its bits.
template <class F>
void with_x_type(const torch::Tensor& x, F&& f) {
  if (x.scalar_type() == torch::kFloat) {
    f(static_cast<float*>(nullptr));
  } else {
    f(static_cast<uint16_t*>(nullptr));
  }
}
template <class X>
const X* bits_of(const torch::Tensor& t) {
  return static_cast<const X*>(t.const_data_ptr());
}

// The forward pass over x [N, H] (fp32 or bf16), r [N, H] fp32, w and b
// [H] fp32, with the dropout lines' seeds [N] (empty: no dropout): y [N, H]
// fp32 and, with `low`, y rounded to bf16. With `keep`, also the sums s and
// the rows' mean and rstd ([2, N]) that the backward reads; without, they
// stay in per-thread scratch.
struct Forward {
  torch::Tensor y, y_low, s, stats;
};
Forward fused_forward(const torch::Tensor& x, const torch::Tensor& r, const torch::Tensor& w, const torch::Tensor& b,
                      const torch::Tensor& seeds, double p, double eps, bool low, bool keep) {
  const int64_t n = x.size(0), h = x.size(1);
  Forward out;
  out.y = torch::empty({n, h}, r.options());
  if (low) out.y_low = torch::empty({n, h}, r.options().dtype(torch::kBFloat16));
  if (keep) {
    out.s = torch::empty({n, h}, r.options());
    out.stats = torch::empty({2, n}, r.options());
  }
  const uint64_t threshold = keep_threshold(p);
  const auto scale = static_cast<float>(1.0 / (1.0 - p));
  const float* rp = r.const_data_ptr<float>();
  const float* wp = w.const_data_ptr<float>();
  const float* bp = b.const_data_ptr<float>();
  float* sp = keep ? out.s.data_ptr<float>() : nullptr;
  float* yp = out.y.data_ptr<float>();
  auto* lp = low ? reinterpret_cast<uint16_t*>(out.y_low.data_ptr<c10::BFloat16>()) : nullptr;
  float* mean = keep ? out.stats.data_ptr<float>() : nullptr;
  const uint64_t* seed = seeds_of(seeds);
  with_x_type(x, [&](auto* tag) {
    using X = std::remove_pointer_t<decltype(tag)>;
    const X* xp = bits_of<X>(x);
    at::parallel_for(0, n, std::max<int64_t>(1, 8192 / std::max<int64_t>(h, 1)), [&](int64_t begin, int64_t end) {
      std::vector<float> f(static_cast<size_t>(h)), scratch(keep ? 0 : static_cast<size_t>(h));
      float row_mean = 0, row_rstd = 0;
      for (int64_t i = begin; i < end; ++i) {
        forward_row(xp + i * h, rp + i * h, wp, bp, h, row_drop(seed, i, threshold, scale), static_cast<float>(eps),
                    f.data(), keep ? sp + i * h : scratch.data(), yp + i * h, lp != nullptr ? lp + i * h : nullptr,
                    keep ? mean + i : &row_mean, keep ? mean + n + i : &row_rstd);
      }
    });
  });
  return out;
}

// Autograd for the fused pass (fused_forward's arguments).
struct DropoutAddNormFunction : torch::autograd::Function<DropoutAddNormFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& r, const torch::Tensor& w,
                                                const torch::Tensor& b, const torch::Tensor& seeds, double p,
                                                double eps, bool low) {
    Forward f = fused_forward(x, r, w, b, seeds, p, eps, low, /*keep=*/true);
    ctx->save_for_backward({f.s, f.stats, w, seeds});
    ctx->saved_data["p"] = p;
    ctx->saved_data["x_bf16"] = x.scalar_type() == torch::kBFloat16;
    // An output nothing read gets an undefined gradient, not zeros to add.
    ctx->set_materialize_grads(false);
    if (low) return {f.y, f.y_low};
    return {f.y};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    COHORT_CHECK(!torch::GradMode::is_enabled(), Error,
                 "the fused dropout + residual + LayerNorm has no double backward");
    auto saved = ctx->get_saved_variables();
    const torch::Tensor &s = saved[0], &stats = saved[1], &w = saved[2], &seeds = saved[3];
    const double p = ctx->saved_data["p"].toDouble();
    const bool x_bf16 = ctx->saved_data["x_bf16"].toBool();
    const int64_t n = s.size(0), h = s.size(1);
    torch::Tensor dy = grads[0].defined() ? grads[0].contiguous() : torch::Tensor();
    torch::Tensor dy_low = grads.size() > 1 && grads[1].defined() ? grads[1].contiguous() : torch::Tensor();
    if (!dy.defined() && !dy_low.defined()) {  // neither result is read
      return {torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
              torch::Tensor(), torch::Tensor()};
    }
    auto dr = torch::empty({n, h}, s.options());
    auto dx = torch::empty({n, h}, s.options().dtype(x_bf16 ? torch::kBFloat16 : torch::kFloat));
    const int64_t blocks = (n + kBlockRows - 1) / kBlockRows;
    auto partial = torch::zeros({2, blocks, h}, s.options());  // dw, db per block
    const uint64_t threshold = keep_threshold(p);
    const auto scale = static_cast<float>(1.0 / (1.0 - p));
    const float* dyp = dy.defined() ? dy.const_data_ptr<float>() : nullptr;
    const uint16_t* dlp = dy_low.defined() ? bits_of<uint16_t>(dy_low) : nullptr;
    const float* sp = s.const_data_ptr<float>();
    const float* wp = w.const_data_ptr<float>();
    const float* mean = stats.const_data_ptr<float>();
    const float* rstd = mean + n;
    float* drp = dr.data_ptr<float>();
    float* dwp = partial.data_ptr<float>();
    float* dbp = dwp + blocks * h;
    const uint64_t* seed = seeds_of(seeds);
    with_x_type(dx, [&](auto* tag) {
      using X = std::remove_pointer_t<decltype(tag)>;
      X* dxp = static_cast<X*>(dx.data_ptr());
      at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> f(static_cast<size_t>(h)), g(static_cast<size_t>(h));
        for (int64_t blk = begin; blk < end; ++blk) {
          for (int64_t i = blk * kBlockRows; i < std::min(n, (blk + 1) * kBlockRows); ++i) {
            backward_row(dyp != nullptr ? dyp + i * h : nullptr, dlp != nullptr ? dlp + i * h : nullptr, sp + i * h, wp,
                         h, mean[i], rstd[i], row_drop(seed, i, threshold, scale), f.data(), g.data(), drp + i * h,
                         dxp + i * h, dwp + blk * h, dbp + blk * h);
          }
        }
      });
    });
    auto sums = partial.sum(1);  // [2, H], the blocks in order
    return {dx, dr, sums[0], sums[1], torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

bool fusable(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& weight,
             const torch::Tensor& bias, bool dropping) {
  const bool on_cpu = x.is_cpu() && residual.is_cpu() && weight.is_cpu() && bias.is_cpu();
  const bool types = (x.scalar_type() == torch::kFloat || x.scalar_type() == torch::kBFloat16) &&
                     residual.scalar_type() == torch::kFloat && weight.scalar_type() == torch::kFloat &&
                     bias.scalar_type() == torch::kFloat;
  const bool shapes = x.dim() >= 2 && x.sizes() == residual.sizes() && weight.dim() == 1 && bias.dim() == 1 &&
                      weight.size(0) == x.size(-1) && bias.size(0) == x.size(-1);
  // Fused masks are the per-sample ones of hidden states ([B, L, H], packed
  // or not); torch's generator's, and other shapes under DropoutRows, go unfused.
  const DropoutRows* rows = DropoutRows::current();
  return on_cpu && types && shapes && (!dropping || (rows != nullptr && x.dim() == 3));
}

}  // namespace

Hidden dropout_add_layer_norm_unfused(const torch::Tensor& x, const torch::Tensor& residual,
                                      const torch::Tensor& weight, const torch::Tensor& bias, double eps, double p,
                                      uint64_t site, bool training) {
  Hidden out;
  out.full = torch::layer_norm(sample_dropout(x, p, site, training) + residual, {x.size(-1)}, weight, bias, eps);
  return out;
}

Hidden dropout_add_layer_norm(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& weight,
                              const torch::Tensor& bias, double eps, double p, uint64_t site, bool training) {
  const bool dropping = training && p > 0;
  if (!fusable(x, residual, weight, bias, dropping)) {
    return dropout_add_layer_norm_unfused(x, residual, weight, bias, eps, p, site, training);
  }
  // Autograd's apply takes no undefined tensors: no dropout is no seeds.
  torch::Tensor seeds = dropping ? lines_of(x, rows_for(x), site).seeds : torch::empty({0}, torch::kInt64);
  const int64_t h = x.size(-1);
  const bool low = x.scalar_type() != residual.scalar_type();
  auto x2 = x.contiguous().view({-1, h}), r2 = residual.contiguous().view({-1, h});
  auto w1 = weight.contiguous(), b1 = bias.contiguous();
  const double kept_p = dropping ? p : 0.0;
  const bool grad = torch::GradMode::is_enabled() &&
                    (x.requires_grad() || residual.requires_grad() || weight.requires_grad() || bias.requires_grad());
  if (!grad) {  // evaluating: nothing kept for a backward
    Forward f = fused_forward(x2, r2, w1, b1, seeds, kept_p, eps, low, /*keep=*/false);
    return {f.y.view(x.sizes()), low ? f.y_low.view(x.sizes()) : torch::Tensor()};
  }
  auto outs = DropoutAddNormFunction::apply(x2, r2, w1, b1, seeds, kept_p, eps, low);
  Hidden out;
  out.full = outs[0].view(x.sizes());
  if (low) out.low = outs[1].view(x.sizes());
  return out;
}

}  // namespace cohort
