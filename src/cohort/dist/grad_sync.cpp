#include "cohort/dist/grad_sync.hpp"

#include <torch/torch.h>

#include "cohort/dist/comm.hpp"

namespace cohort {

void broadcast_module(Comm& comm, torch::nn::Module& module) {
  if (comm.size() == 1) return;
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters()) {
    auto t = p.detach();
    comm.broadcast(t, 0, "initial parameter broadcast");
  }
  for (auto& b : module.buffers()) {
    auto t = b.detach();
    comm.broadcast(t, 0, "initial buffer broadcast");
  }
}

void all_reduce_gradients(Comm& comm, torch::nn::Module& module) {
  if (comm.size() == 1) return;
  std::vector<torch::Tensor> grads;
  for (auto& p : module.parameters()) {
    if (!p.requires_grad()) continue;
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    grads.push_back(p.grad());
  }
  if (grads.empty()) return;
  std::vector<torch::Tensor> flat_parts;
  for (auto& g : grads) flat_parts.push_back(g.reshape({-1}));
  auto flat = torch::cat(flat_parts);
  comm.all_reduce_sum(flat, "gradient all-reduce");
  int64_t offset = 0;
  for (auto& g : grads) {
    g.copy_(flat.narrow(0, offset, g.numel()).view_as(g));
    offset += g.numel();
  }
}

}  // namespace cohort
