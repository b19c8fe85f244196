#include "cohort/sync/powersgd.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <map>

#include "cohort/core/error.hpp"
#include "cohort/distributed/comm.hpp"

namespace cohort {

namespace {

constexpr char kQ[] = "powersgd.q.";
constexpr char kError[] = "powersgd.error.";

// Orthonormal columns spanning a's (a is rows x r with r < rows). Householder
// QR: unlike Gram-Schmidt, a zero or dependent column gives no NaN.
torch::Tensor orthogonalize(const torch::Tensor& a) { return std::get<0>(torch::linalg_qr(a, "reduced")); }

// Drawn on the CPU, so that every rank and device draws the same Q, then
// placed where the gradients are.
torch::Tensor first_q(int64_t cols, int64_t rank, uint64_t seed, const torch::TensorOptions& like) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randn({cols, rank}, gen, torch::kFloat32).to(like.device());
}

}  // namespace

bool powersgd_compresses(c10::IntArrayRef shape, int64_t rank) {
  if (shape.size() < 2) return false;
  int64_t rows = shape[0];
  int64_t cols = c10::multiply_integers(shape) / std::max<int64_t>(rows, 1);
  return (rows + cols) * rank * 2 < rows * cols;
}

PowerSgdBucket::PowerSgdBucket(const std::vector<torch::Tensor>& grads, const std::vector<std::string>& names,
                               int64_t rank, uint64_t seed)
    : rank_(rank), seed_(seed) {
  COHORT_CHECK(grads.size() == names.size(), Error, "powersgd: ", grads.size(), " gradients but ", names.size(),
               " names");
  if (!grads.empty()) options_ = grads[0].options().dtype(torch::kFloat32);
  for (size_t i = 0; i < grads.size(); ++i) {
    exact_floats_ += grads[i].numel();
    if (!powersgd_compresses(grads[i].sizes(), rank) || grads[i].scalar_type() != torch::kFloat32) {
      exact_.push_back(i);
      continue;
    }
    int64_t rows = grads[i].size(0);
    matrices_.push_back({i, names[i], rows, grads[i].numel() / rows, torch::Tensor(), torch::Tensor()});
  }
  reset();
}

void PowerSgdBucket::reset() {
  for (size_t j = 0; j < matrices_.size(); ++j) {
    auto& m = matrices_[j];
    m.q = first_q(m.cols, rank_, seed_ * 1000003 + m.index, options_);
    m.error = torch::Tensor();
  }
}

int64_t PowerSgdBucket::wire_floats() const {
  int64_t n = exact_floats_;
  for (const auto& m : matrices_) n -= m.rows * m.cols - (m.rows + m.cols) * rank_;
  return n;
}

void PowerSgdBucket::reduce(Comm& comm, const std::vector<torch::Tensor>& grads) {
  torch::NoGradGuard no_grad;
  // The exact part first: it travels while the matrices are multiplied.
  torch::Tensor exact;
  std::function<void()> exact_done;
  if (!exact_.empty()) {
    std::vector<torch::Tensor> parts;
    for (size_t i : exact_) parts.push_back(grads[i].reshape({-1}));
    exact = torch::cat(parts);
    exact_done = comm.all_reduce_sum_async(exact, "gradient all-reduce (exact part)");
  }
  if (!matrices_.empty()) {
    // M = gradient + remainder; P = M Q, all of the bucket's Ps in one buffer.
    std::vector<torch::Tensor> ms;
    int64_t p_size = 0, q_size = 0;
    for (auto& m : matrices_) {
      auto g = grads[m.index].reshape({m.rows, m.cols});
      ms.push_back(m.error.defined() ? g + m.error : g.clone());
      p_size += m.rows * rank_;
      q_size += m.cols * rank_;
    }
    auto p_flat = torch::empty({p_size}, options_);
    int64_t offset = 0;
    std::vector<torch::Tensor> ps;
    for (size_t j = 0; j < matrices_.size(); ++j) {
      auto p = p_flat.narrow(0, offset, matrices_[j].rows * rank_).view({matrices_[j].rows, rank_});
      torch::mm_out(p, ms[j], orthogonalize(matrices_[j].q));
      ps.push_back(p);
      offset += p.numel();
    }
    comm.all_reduce_sum(p_flat, "powersgd P all-reduce");
    // Q = M^T orth(P), summed: P Q^T is then the rank-r approximation of the sum of the Ms.
    auto q_flat = torch::empty({q_size}, options_);
    offset = 0;
    std::vector<torch::Tensor> qs;
    for (size_t j = 0; j < matrices_.size(); ++j) {
      ps[j] = orthogonalize(ps[j]);
      auto q = q_flat.narrow(0, offset, matrices_[j].cols * rank_).view({matrices_[j].cols, rank_});
      torch::mm_out(q, ms[j].t(), ps[j]);
      qs.push_back(q);
      offset += q.numel();
    }
    comm.all_reduce_sum(q_flat, "powersgd Q all-reduce");
    const double share = 1.0 / comm.size();
    for (size_t j = 0; j < matrices_.size(); ++j) {
      auto& m = matrices_[j];
      auto approx = torch::mm(ps[j], qs[j].t());
      // Each rank keeps what it put in beyond its share of what was sent:
      // summed over the ranks, sent + kept is exactly the sum of the Ms.
      m.error = ms[j].sub_(approx, share);
      grads[m.index].copy_(approx.view_as(grads[m.index]));
      m.q = qs[j].clone();
    }
  }
  if (exact_done) {
    exact_done();
    int64_t offset = 0;
    for (size_t i : exact_) {
      grads[i].copy_(exact.narrow(0, offset, grads[i].numel()).view_as(grads[i]));
      offset += grads[i].numel();
    }
  }
}

NamedTensors PowerSgdBucket::shared_state() const {
  NamedTensors out;
  for (const auto& m : matrices_) out.emplace_back(kQ + m.name, m.q);
  return out;
}

NamedTensors PowerSgdBucket::own_state() const {
  NamedTensors out;
  for (const auto& m : matrices_) {
    out.emplace_back(kError + m.name, m.error.defined() ? m.error : torch::zeros({m.rows, m.cols}, options_));
  }
  return out;
}

void PowerSgdBucket::load_shared_state(const NamedTensors& tensors) {
  std::map<std::string, torch::Tensor> by_name(tensors.begin(), tensors.end());
  for (auto& m : matrices_) {
    auto it = by_name.find(kQ + m.name);
    // Another dist.powersgd-rank than the writer's: this rank's Qs start afresh.
    if (it == by_name.end() || it->second.numel() != m.cols * rank_) continue;
    m.q = it->second.to(options_).reshape({m.cols, rank_}).clone();
  }
}

void PowerSgdBucket::load_own_state(const NamedTensors& tensors) {
  std::map<std::string, torch::Tensor> by_name(tensors.begin(), tensors.end());
  for (auto& m : matrices_) {
    auto it = by_name.find(kError + m.name);
    if (it == by_name.end()) {
      m.error = torch::Tensor();
      continue;
    }
    COHORT_CHECK(it->second.numel() == m.rows * m.cols, DataError, "powersgd: ", it->first, " holds ",
                 it->second.numel(), " values, expected ", m.rows * m.cols);
    m.error = it->second.to(options_).reshape({m.rows, m.cols}).clone();
  }
}

}  // namespace cohort
