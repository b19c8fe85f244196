// defines: band_keep, banded_attention
//
// Sliding-window attention by blocks: the row cut into blocks of w =
// local_attention / 2 queries, each attending to the 3w keys of its block
// and the two beside it (all that a query within w places of a key can
// reach), rather than to the whole row under a mask: 3w keys a query instead
// of L, so a sliding layer's cost grows with L, not L². Hugging Face's
// ModernBERT on the CPU masks the whole row; FlashAttention's window on a
// GPU skips the blocks the same way.
//
// That every key a query may see lies within w places of it holds because
// positions count up by one within a sequence, in packed rows as in padded
// ones. The result equals masked attention over the whole row up to the
// rounding of the softmax's blocked sums.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace cohort {

// Which of its block's 3w keys each query sees, [R * blocks, 1, w, 3w] with
// blocks = ceil(L / w): a padded row's real keys (a padding query sees every
// key in reach) or a packed row's own sequence's (seq_ids defined), within w
// positions. Queries past the row's end (the last block's padding) see only
// themselves, so that no softmax is empty; their outputs are dropped.
// input_mask [R, L]; positions [R or 1, L]; seq_ids [R, L] or undefined.
torch::Tensor band_keep(const torch::Tensor& input_mask, const torch::Tensor& positions, const torch::Tensor& seq_ids,
                        int64_t w);

// q, k, v [B, A, L, D] and keep from band_keep: the attention's output, [B,
// L, A * D] (the heads side by side, as the output projection reads them).
torch::Tensor banded_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& keep, int64_t w);

}  // namespace cohort
