// defines: broadcast_module, GradSync
//
// Keeps replicas equal: parameters and buffers start as rank 0's, and after
// every backward the gradients are summed over ranks (each rank's loss is
// already divided by the global unit count, so the sum is the global mean).
//
// Cross-rank contract: every rank calls these in the same order with modules
// of identical structure; tensors are visited in registration order.
#pragma once

#include <torch/nn/module.h>

namespace cohort {

class Comm;

// Copies rank 0's parameters and buffers to every rank.
void broadcast_module(Comm& comm, torch::nn::Module& module);

// Sums gradients over ranks with one flat, coalesced all-reduce. A parameter
// without a gradient this step contributes zeros, so no rank waits on a
// tensor another rank never sends.
void all_reduce_gradients(Comm& comm, torch::nn::Module& module);

}  // namespace cohort
