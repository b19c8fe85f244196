#include "cohort/model/sliding_window.hpp"

#include <torch/torch.h>

namespace cohort {

torch::Tensor band_keep(const torch::Tensor& input_mask, const torch::Tensor& positions, const torch::Tensor& seq_ids,
                        int64_t w) {
  const int64_t r = input_mask.size(0), l = input_mask.size(1), blocks = (l + w - 1) / w, lp = blocks * w;
  auto opts = positions.options();
  // A token's values at its query place [R or 1, blocks, w, 1] and at its
  // key places [R or 1, blocks, 1, 3w] (past either end: zeros).
  auto query = [&](const torch::Tensor& t) {
    return at::constant_pad_nd(t, {0, lp - l}).view({t.size(0), blocks, w, 1});
  };
  auto key = [&](const torch::Tensor& t) {
    auto tb = at::constant_pad_nd(t, {w, lp - l + w}).view({t.size(0), blocks + 2, w});
    return torch::cat({tb.slice(1, 0, blocks), tb.slice(1, 1, blocks + 1), tb.slice(1, 2, blocks + 2)}, 2)
        .view({t.size(0), blocks, 1, 3 * w});
  };
  auto qi = torch::arange(lp, opts).view({1, blocks, w, 1});
  auto kb = torch::arange(-w, lp + w, opts).view({blocks + 2, w});
  auto kj = torch::cat({kb.slice(0, 0, blocks), kb.slice(0, 1, blocks + 1), kb.slice(0, 2, blocks + 2)}, 1)
                .view({1, blocks, 1, 3 * w});
  auto in_row = qi.lt(l), key_in_row = kj.ge(0).logical_and(kj.lt(l));
  torch::Tensor seen;
  if (seq_ids.defined()) {
    seen = query(seq_ids).eq(key(seq_ids));
  } else {
    auto real = input_mask.ne(0).to(torch::kLong);
    seen = key(real).ne(0).logical_or(query(real).eq(0));
  }
  seen = seen.logical_and((query(positions) - key(positions)).abs().le(w)).logical_and(key_in_row);
  auto keep = seen.logical_and(in_row).logical_or(in_row.logical_not().logical_and(kj.eq(qi)));
  return keep.expand({r, blocks, w, 3 * w}).reshape({r * blocks, 1, w, 3 * w});
}

torch::Tensor banded_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& keep, int64_t w) {
  const int64_t b = q.size(0), a = q.size(1), l = q.size(2), d = q.size(3), blocks = (l + w - 1) / w,
                lp = blocks * w;
  auto qb = at::constant_pad_nd(q, {0, 0, 0, lp - l}).view({b, a, blocks, w, d}).permute({0, 2, 1, 3, 4});
  auto windows = [&](const torch::Tensor& t) {
    auto tb = at::constant_pad_nd(t, {0, 0, w, lp - l + w}).view({b, a, blocks + 2, w, d});
    return torch::cat({tb.slice(2, 0, blocks), tb.slice(2, 1, blocks + 1), tb.slice(2, 2, blocks + 2)}, 3)
        .permute({0, 2, 1, 3, 4})
        .reshape({b * blocks, a, 3 * w, d});
  };
  auto out = at::scaled_dot_product_attention(qb.reshape({b * blocks, a, w, d}), windows(k), windows(v), keep);
  return out.view({b, blocks, a, w, d}).permute({0, 1, 3, 2, 4}).reshape({b, lp, a * d}).slice(1, 0, l);
}

}  // namespace cohort
