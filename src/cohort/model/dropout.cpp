#include "cohort/model/dropout.hpp"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include "cohort/core/error.hpp"
#include "cohort/core/random.hpp"

namespace cohort {

namespace {

thread_local const DropoutRows* innermost = nullptr;

}  // namespace

DropoutRows::DropoutRows(uint64_t seed, int64_t step, const std::vector<int64_t>& sample_ids) : outer_(innermost) {
  const uint64_t step_key = splitmix64(splitmix64(seed ^ 0xD4097E5EEDull) + static_cast<uint64_t>(step));
  keys_.reserve(sample_ids.size());
  for (int64_t id : sample_ids) keys_.push_back(splitmix64(step_key ^ splitmix64(static_cast<uint64_t>(id))));
  innermost = this;
}

DropoutRows::~DropoutRows() { innermost = outer_; }

const DropoutRows* DropoutRows::current() { return innermost; }

namespace {

void check_rows(const torch::Tensor& x, const DropoutRows* rows) {
  COHORT_CHECK(rows != nullptr, Error, "sample dropout needs a DropoutRows scope");
  COHORT_CHECK(x.dim() >= 1 && x.size(0) == static_cast<int64_t>(rows->keys().size()), Error,
               "sample dropout: a batch of ", x.dim() ? x.size(0) : 0, " rows under ", rows->keys().size(),
               " row keys");
}

// Keep when the top 24 bits are >= p * 2^24.
uint64_t keep_threshold(double p) { return static_cast<uint64_t>(p * 16777216.0 + 0.5); }
uint64_t site_key(uint64_t site) { return splitmix64(site + 0x5173ull); }

// The CPU kernel: one pass, rows in parallel.
torch::Tensor keep_mask_cpu(const torch::Tensor& x, const DropoutRows& rows, double p, uint64_t site) {
  auto mask = torch::empty(x.sizes(), torch::TensorOptions().dtype(torch::kBool));
  if (mask.numel() == 0) return mask;
  const int64_t cols = x.dim() >= 2 ? x.size(-1) : 1;
  const int64_t lines = mask.numel() / cols;
  const int64_t per_row = lines / x.size(0);
  // The coordinates of every dimension between the row and the last.
  std::vector<int64_t> middle;
  for (int64_t d = 1; d + 1 < x.dim(); ++d) middle.push_back(x.size(d));
  const uint64_t threshold = keep_threshold(p), salt = site_key(site);
  const uint64_t* keys = rows.keys().data();
  bool* out = mask.data_ptr<bool>();
  at::parallel_for(0, lines, std::max<int64_t>(1, 16384 / cols), [&](int64_t begin, int64_t end) {
    for (int64_t line = begin; line < end; ++line) {
      int64_t row = line / per_row, rest = line % per_row;
      uint64_t h = splitmix64(keys[row] ^ salt);
      for (size_t d = middle.size(); d-- > 0;) {  // innermost-but-one first
        h = splitmix64(h + static_cast<uint64_t>(rest % middle[d]));
        rest /= middle[d];
      }
      bool* o = out + line * cols;
      for (int64_t c = 0; c < cols; ++c) o[c] = (splitmix64(h + static_cast<uint64_t>(c)) >> 40) >= threshold;
    }
  });
  return mask;
}

// splitmix64 on int64 tensors (wrapping arithmetic, logical shifts).
torch::Tensor shift_right(const torch::Tensor& x, int k) {
  return torch::bitwise_and(torch::bitwise_right_shift(x, k), static_cast<int64_t>((uint64_t{1} << (64 - k)) - 1));
}
torch::Tensor mix(torch::Tensor x) {
  x = x + static_cast<int64_t>(0x9E3779B97F4A7C15ull);
  x = torch::bitwise_xor(x, shift_right(x, 30)) * static_cast<int64_t>(0xBF58476D1CE4E5B9ull);
  x = torch::bitwise_xor(x, shift_right(x, 27)) * static_cast<int64_t>(0x94D049BB133111EBull);
  return torch::bitwise_xor(x, shift_right(x, 31));
}

}  // namespace

torch::Tensor sample_keep_mask_tensor_ops(const torch::Tensor& x, double p, uint64_t site) {
  const DropoutRows* rows = DropoutRows::current();
  check_rows(x, rows);
  auto opts = torch::TensorOptions().dtype(torch::kInt64).device(x.device());
  const int64_t dims = x.dim();
  std::vector<int64_t> shape(static_cast<size_t>(dims), 1);
  shape[0] = x.size(0);
  auto keys = torch::from_blob(const_cast<uint64_t*>(rows->keys().data()), {x.size(0)}, torch::kInt64).to(opts);
  auto h = mix(torch::bitwise_xor(keys.view(shape), static_cast<int64_t>(site_key(site))));
  auto along = [&](int64_t d) {  // 0..size-1 along dimension d
    std::vector<int64_t> s(static_cast<size_t>(dims), 1);
    s[static_cast<size_t>(d)] = x.size(d);
    return torch::arange(x.size(d), opts).view(s);
  };
  for (int64_t d = dims - 2; d >= 1; --d) h = mix(h + along(d));
  h = mix(dims >= 2 ? h + along(dims - 1) : h);
  return shift_right(h, 40).ge(static_cast<int64_t>(keep_threshold(p)));
}

torch::Tensor sample_keep_mask(const torch::Tensor& x, double p, uint64_t site) {
  if (!x.device().is_cpu()) return sample_keep_mask_tensor_ops(x, p, site);
  const DropoutRows* rows = DropoutRows::current();
  check_rows(x, rows);
  return keep_mask_cpu(x, *rows, p, site);
}

torch::Tensor sample_dropout(const torch::Tensor& x, double p, uint64_t site, bool training) {
  if (!training || p <= 0) return x;
  if (DropoutRows::current() == nullptr) return torch::dropout(x, p, /*train=*/true);
  return x * sample_keep_mask(x, p, site).to(x.scalar_type()) * (1.0 / (1.0 - p));
}

}  // namespace cohort
