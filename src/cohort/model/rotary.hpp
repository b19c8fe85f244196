// defines: Qkv, rotary_qkv, rotary_qkv_unfused
//
// ModernBERT's attention inputs from its fused projection: q, k and v split
// out of Wqkv's output, with q and k rotated by the rotary positions in fp32
// (Hugging Face's apply_rotary_pos_emb). Unfused, that is a cast to fp32, two
// products, a negated half, a concatenation, a sum and a cast back, for q and
// for k, each way, plus the copy of the three into heads; on the CPU, for an
// fp32 or bf16 projection, it is one pass forward and one backward. The
// arithmetic and its rounding are the unfused ops' (products and sums in
// fp32, not contracted, rounded once to the projection's dtype), so both
// give the same bits.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace cohort {

// Each [B, heads, L, D], contiguous.
struct Qkv {
  torch::Tensor q, k, v;
};

// qkv [B, L, 3 * heads * D] (q, k, v, each heads x D); cos and sin [B or 1,
// L, D] fp32, the angles' cosines and sines for each row's positions.
Qkv rotary_qkv(const torch::Tensor& qkv, int64_t heads, const torch::Tensor& cos, const torch::Tensor& sin);

// The unfused ops, which the fused passes must match (tests), and what runs
// off the CPU or for other dtypes.
Qkv rotary_qkv_unfused(const torch::Tensor& qkv, int64_t heads, const torch::Tensor& cos, const torch::Tensor& sin);

}  // namespace cohort
