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

torch::Tensor sample_dropout_mask(const torch::Tensor& x, double p, uint64_t site) {
  const DropoutRows* rows = DropoutRows::current();
  COHORT_CHECK(rows != nullptr, Error, "sample_dropout_mask needs a DropoutRows scope");
  COHORT_CHECK(x.dim() >= 1 && x.size(0) == static_cast<int64_t>(rows->keys().size()), Error,
               "sample dropout: a batch of ", x.dim() ? x.size(0) : 0, " rows under ", rows->keys().size(),
               " row keys");
  auto mask = torch::empty(x.sizes(), x.options().device(torch::kCPU).memory_format(c10::MemoryFormat::Contiguous));
  if (mask.numel() == 0) return mask.to(x.device());
  const int64_t cols = x.dim() >= 2 ? x.size(-1) : 1;
  const int64_t lines = mask.numel() / cols;
  const int64_t per_row = lines / x.size(0);
  // The coordinates of every dimension between the row and the last.
  std::vector<int64_t> middle;
  for (int64_t d = 1; d + 1 < x.dim(); ++d) middle.push_back(x.size(d));
  // Keep when the top 24 bits are >= p * 2^24.
  const uint64_t threshold = static_cast<uint64_t>(p * 16777216.0 + 0.5);
  const double scale = 1.0 / (1.0 - p);
  const uint64_t* keys = rows->keys().data();
  const uint64_t site_key = splitmix64(site + 0x5173ull);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, mask.scalar_type(), "sample_dropout_mask", [&] {
    scalar_t* out = mask.data_ptr<scalar_t>();
    const scalar_t keep = static_cast<scalar_t>(scale), drop = static_cast<scalar_t>(0);
    at::parallel_for(0, lines, std::max<int64_t>(1, 16384 / cols), [&](int64_t begin, int64_t end) {
      for (int64_t line = begin; line < end; ++line) {
        int64_t row = line / per_row, rest = line % per_row;
        uint64_t h = splitmix64(keys[row] ^ site_key);
        for (size_t d = middle.size(); d-- > 0;) {  // innermost-but-one first; any fixed order works
          h = splitmix64(h + static_cast<uint64_t>(rest % middle[d]));
          rest /= middle[d];
        }
        scalar_t* o = out + line * cols;
        for (int64_t c = 0; c < cols; ++c) o[c] = (splitmix64(h + static_cast<uint64_t>(c)) >> 40) >= threshold ? keep : drop;
      }
    });
  });
  return mask.to(x.device());
}

torch::Tensor sample_dropout(const torch::Tensor& x, double p, uint64_t site, bool training) {
  if (!training || p <= 0) return x;
  if (DropoutRows::current() == nullptr) return torch::dropout(x, p, /*train=*/true);
  return x * sample_dropout_mask(x, p, site);
}

}  // namespace cohort
