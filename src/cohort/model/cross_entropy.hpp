// defines: CrossEntropySum, cross_entropy_sum, cross_entropy_sum_unfused
//
// The masked-LM loss over the vocabulary: the summed cross-entropy of rows
// of logits against their labels, and how many rows' first largest logit is
// their label's (the accuracy's hits, argmax's tie rule). Under autocast the
// decoder's logits are bf16 and the loss is taken in fp32: unfused, that is
// a cast of the logits to fp32, log-softmax, the picked terms, and for the
// hits a row maximum, a gather and an argmax, then backward log-softmax's
// backward and a cast of the gradient back to bf16, each a pass over rows x
// vocabulary (8% of a ModernBERT step at 8,192 tokens of vocabulary). On the
// CPU, for bf16 logits, it is one pass forward and one backward, in fp32,
// keeping only the logits and one log-sum-exp a row. Its exp is a
// polynomial of its own (model/fast_math.hpp), so the loss agrees with
// the unfused ops to about 1e-6 relative and the gradient to bf16's
// rounding, not bit for bit; fp32 logits (the oracles' precision) and other
// devices take the unfused ops.
#pragma once

#include <torch/types.h>

namespace cohort {

struct CrossEntropySum {
  torch::Tensor loss;  // fp32 scalar, differentiable in the logits
  torch::Tensor hits;  // int64 scalar
};

// logits [N, V], labels int64 [N], each in [0, V).
CrossEntropySum cross_entropy_sum(const torch::Tensor& logits, const torch::Tensor& labels);

// The unfused ops (logits cast to fp32), which the fused passes must match.
CrossEntropySum cross_entropy_sum_unfused(const torch::Tensor& logits, const torch::Tensor& labels);

}  // namespace cohort
