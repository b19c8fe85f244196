// defines: Hidden, dropout_add_layer_norm
//
// BERT's sublayer output, LayerNorm(dropout(x) + residual) (Hugging Face's
// BertSelfOutput and BertOutput after their dense), as one pass forward and
// one backward on the CPU. Unfused, it is four passes each way: dropout, the
// residual add, LayerNorm and, under autocast, the cast of the result back
// to bf16 for the next layer's matrices, with their backward casts and the
// sum of the two gradients that reach the result.
//
// Under autocast x is the bf16 output of a matrix product and the residual
// stream stays fp32, as autocast leaves it (CUDA's autocast runs LayerNorm in
// fp32; the CPU's promotes bf16 + fp32). The fused pass then writes the
// result twice: in fp32 for the residual path and rounded to bf16 for the
// next products, which autocast would otherwise cast in a pass of its own.
// The dtypes and roundings are those of the unfused ops: x dropped and
// scaled in its own dtype, the sum and the normalisation in fp32, x's
// gradient rounded to its dtype before dropout's scaling. The LayerNorm
// arithmetic itself (two-pass moments, the backward's algebraic form) differs
// from libtorch's in the last fp32 bits. There is no double backward.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace cohort {

// The hidden states between layers: `full` in the residual stream's dtype,
// and `low`, the same values rounded to the dtype of the products that read
// them (undefined when that is full's own). Two tensors: changing one in
// place does not change the other.
struct Hidden {
  torch::Tensor full;
  torch::Tensor low;
  // What a matrix product reads.
  const torch::Tensor& for_products() const { return low.defined() ? low : full; }
};

// LayerNorm over the last dimension of dropout(x) + residual, with x's
// per-sample dropout masks at `site` (model/dropout.hpp) while training and
// p > 0. x and residual are [.., H] of one shape; weight and bias are [H].
// Fused on the CPU for fp32 or bf16 x [B, L, H] with an fp32 residual,
// weight and bias, under DropoutRows or with no dropout; elsewhere (a GPU,
// torch's generator's masks, other dtypes) the unfused ops, with the same
// result. Without autograd (evaluating) nothing is kept for a backward.
Hidden dropout_add_layer_norm(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& weight,
                              const torch::Tensor& bias, double eps, double p, uint64_t site, bool training);

// The unfused ops, which the fused pass must match (tests and benches).
Hidden dropout_add_layer_norm_unfused(const torch::Tensor& x, const torch::Tensor& residual,
                                      const torch::Tensor& weight, const torch::Tensor& bias, double eps, double p,
                                      uint64_t site, bool training);

}  // namespace cohort
