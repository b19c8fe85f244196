#include "cohort/model/dropout.hpp"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include "cohort/core/error.hpp"
#include "cohort/core/random.hpp"
#include "cohort/model/dropout_lines.hpp"

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

DropoutRows::DropoutRows(const DropoutRows& samples, const torch::Tensor& seq_ids, const torch::Tensor& position_ids)
    : keys_(samples.keys_), outer_(innermost) {
  COHORT_CHECK(seq_ids.defined() && position_ids.defined() && seq_ids.dim() == 2 &&
                   position_ids.sizes() == seq_ids.sizes(),
               Error, "packed dropout rows need seq_ids and position_ids of one [R, L] shape");
  rows_ = seq_ids.size(0);
  width_ = seq_ids.size(1);
  auto seq = seq_ids.to(torch::kCPU, torch::kInt64).contiguous();
  auto pos = position_ids.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t* s = seq.data_ptr<int64_t>();
  const int64_t* q = pos.data_ptr<int64_t>();
  const auto tokens = static_cast<size_t>(seq.numel());
  token_keys_.resize(tokens);
  token_positions_.assign(q, q + tokens);
  for (size_t i = 0; i < tokens; ++i) {
    COHORT_CHECK(s[i] < static_cast<int64_t>(keys_.size()), Error, "packed dropout rows: token ", i, " is of sample ",
                 s[i], " of ", keys_.size());
    // An instance is contiguous, its positions counting from 0 where it starts.
    const int64_t t = static_cast<int64_t>(i) % width_;
    COHORT_CHECK(s[i] < 0 || (q[i] >= 0 && q[i] <= t && (q[i] == 0 || (s[i - 1] == s[i] && q[i - 1] == q[i] - 1))),
                 Error, "packed dropout rows: token ", i, " of sample ", s[i], " is at position ", q[i],
                 ", which does not continue its sample");
    // Padding: any key will do, since no real token reads its outputs.
    token_keys_[i] = s[i] >= 0 ? keys_[static_cast<size_t>(s[i])] : splitmix64(i ^ 0xFADull);
  }
  innermost = this;
}

DropoutRows::DropoutRows(const Saved& saved)
    : keys_(saved.keys), token_keys_(saved.token_keys), token_positions_(saved.token_positions), rows_(saved.rows),
      width_(saved.width), outer_(innermost) {
  innermost = this;
}

DropoutRows::~DropoutRows() { innermost = outer_; }

const torch::Tensor& DropoutRows::on_device(Table table, const c10::Device& device) const {
  auto& copy = device_tables_[static_cast<size_t>(table)];
  if (!copy.defined() || copy.device() != device) {
    const void* data = table == Table::kKeys            ? static_cast<const void*>(keys_.data())
                       : table == Table::kTokenKeys     ? static_cast<const void*>(token_keys_.data())
                                                        : static_cast<const void*>(token_positions_.data());
    const auto n = static_cast<int64_t>(table == Table::kKeys ? keys_.size() : token_keys_.size());
    auto host = torch::from_blob(const_cast<void*>(data), {n}, torch::kInt64);
    // To a GPU from page-locked memory, without making the host wait (a
    // copy from pageable memory would).
    copy = device.is_cuda() ? host.pin_memory().to(device, /*non_blocking=*/true) : host.to(device);
  }
  return copy;
}

const DropoutRows* DropoutRows::current() { return innermost; }

namespace dropout_detail {

const DropoutRows& rows_for(const torch::Tensor& x) {
  const DropoutRows* rows = DropoutRows::current();
  COHORT_CHECK(rows != nullptr, Error, "sample dropout needs a DropoutRows scope");
  COHORT_CHECK(x.dim() >= 1 && x.size(0) == rows->rows(), Error, "sample dropout: a batch of ", x.dim() ? x.size(0) : 0,
               " rows under ", rows->rows(), " row keys");
  if (rows->packed()) {
    const int64_t l = rows->width();
    COHORT_CHECK((x.dim() == 3 && x.size(1) == l) || (x.dim() == 4 && x.size(2) == l && x.size(3) == l), Error,
                 "sample dropout on packed rows of ", l, " tokens takes [R, L, H] or [R, A, L, L], not ", x.sizes());
  }
  return *rows;
}

Lines lines_of(const torch::Tensor& x, const DropoutRows& rows, uint64_t site) {
  Lines out;
  out.cols = x.dim() >= 2 ? x.size(-1) : 1;
  const int64_t lines = out.cols > 0 ? x.numel() / out.cols : 0;
  out.seeds = torch::empty({lines}, torch::kInt64);
  auto* seed = reinterpret_cast<uint64_t*>(out.seeds.data_ptr<int64_t>());
  const uint64_t salt = site_key(site);
  if (!rows.packed()) {
    // The coordinates of every dimension between the row and the last.
    std::vector<int64_t> middle;
    for (int64_t d = 1; d + 1 < x.dim(); ++d) middle.push_back(x.size(d));
    const int64_t per_row = x.size(0) > 0 ? lines / x.size(0) : 0;
    for (int64_t line = 0; line < lines; ++line) {
      int64_t row = line / per_row, rest = line % per_row;
      uint64_t h = splitmix64(rows.keys()[static_cast<size_t>(row)] ^ salt);
      for (size_t d = middle.size(); d-- > 0;) {  // innermost-but-one first
        h = splitmix64(h + static_cast<uint64_t>(rest % middle[d]));
        rest /= middle[d];
      }
      seed[line] = h;
    }
    return out;
  }
  // Packed: [R, L, H] lines are tokens; [R, A, L, L] lines are (head, query
  // token), and a key column's coordinate is its position in the query's sample.
  const int64_t l = rows.width(), heads = x.dim() == 4 ? x.size(1) : 1;
  const uint64_t* key = rows.token_keys().data();
  const int64_t* pos = rows.token_positions().data();
  int64_t* shift = nullptr;
  if (x.dim() == 4) {
    out.shifts = torch::empty({lines}, torch::kInt64);
    shift = out.shifts.data_ptr<int64_t>();
  }
  for (int64_t line = 0; line < lines; ++line) {
    const int64_t t = line % l, head = (line / l) % heads, token = (line / (l * heads)) * l + t;
    uint64_t h = splitmix64(splitmix64(key[token] ^ salt) + static_cast<uint64_t>(pos[token]));
    if (shift != nullptr) {
      h = splitmix64(h + static_cast<uint64_t>(head));
      shift[line] = t - pos[token];
    }
    seed[line] = h;
  }
  return out;
}

}  // namespace dropout_detail

namespace {

using namespace dropout_detail;

// Each element of one line: keep ? 1 : 0.
COHORT_VECTOR_CLONES
void line_keeps(float* out, int64_t cols, uint64_t h, uint64_t threshold) {
  for (int64_t c = 0; c < cols; ++c) out[c] = kept(h, c, threshold) ? 1.0f : 0.0f;
}

// out = in * (keep ? scale : 0), one line, hashing and scaling in one pass:
// the bits of the generic loop below (a dropped NaN stays NaN, a dropped
// negative is -0).
COHORT_VECTOR_CLONES
void scale_line(const float* in, float* out, int64_t cols, uint64_t h, uint64_t threshold, float scale) {
  for (int64_t c = 0; c < cols; ++c) out[c] = in[c] * (kept(h, c, threshold) ? scale : 0.0f);
}

// The same on bf16 bits: widened to float, multiplied, and rounded to
// nearest even as c10::BFloat16 rounds (NaN to 0x7FC0), in lanes.
COHORT_VECTOR_CLONES
void scale_line(const uint16_t* in, uint16_t* out, int64_t cols, uint64_t h, uint64_t threshold, float scale) {
  for (int64_t c = 0; c < cols; ++c) {
    out[c] = bf16_bits(bf16_value(in[c]) * (kept(h, c, threshold) ? scale : 0.0f));
  }
}

// f(h, i, n): the line whose first element is i, of n elements, hashes from
// h (its seed less its shift); lines in parallel.
template <class F>
void for_each_line(const Lines& lines, F&& f) {
  const int64_t n = lines.seeds.numel(), cols = lines.cols;
  const auto* seed = reinterpret_cast<const uint64_t*>(lines.seeds.data_ptr<int64_t>());
  const int64_t* shift = lines.shifts.numel() > 0 ? lines.shifts.data_ptr<int64_t>() : nullptr;
  at::parallel_for(0, n, std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t line = begin; line < end; ++line) {
      f(seed[line] - static_cast<uint64_t>(shift != nullptr ? shift[line] : 0), line * cols, cols);
    }
  });
}

// f(i, k, n): elements i .. i+n-1 (one line, or a block of one) have keep
// bits k[0 .. n-1] (1 or 0); lines in parallel.
template <class F>
void for_each_keep(const Lines& lines, double p, F&& f) {
  const uint64_t threshold = keep_threshold(p);
  constexpr int64_t kBlock = 512;
  for_each_line(lines, [&](uint64_t h, int64_t first, int64_t cols) {
    float k[kBlock];
    for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
      const int64_t m = std::min(kBlock, cols - c0);
      line_keeps(k, m, h + static_cast<uint64_t>(c0), threshold);
      f(first + c0, k, m);
    }
  });
}

// x * (keep / (1 - p)), in x's dtype (the product in its opmath type, as
// x * mask * scale computes it). fp32 and bf16 in one vectorised pass.
torch::Tensor masked_scale(const torch::Tensor& x_in, const Lines& lines, double p) {
  auto x = x_in.contiguous();
  auto out = torch::empty_like(x);
  if (x.numel() == 0) return out;
  const uint64_t threshold = keep_threshold(p);
  const auto scale = static_cast<float>(1.0 / (1.0 - p));
  if (x.scalar_type() == torch::kFloat) {
    const float* in = x.const_data_ptr<float>();
    float* o = out.data_ptr<float>();
    for_each_line(lines, [&](uint64_t h, int64_t i, int64_t n) { scale_line(in + i, o + i, n, h, threshold, scale); });
    return out;
  }
  if (x.scalar_type() == torch::kBFloat16) {
    const auto* in = reinterpret_cast<const uint16_t*>(x.const_data_ptr<c10::BFloat16>());
    auto* o = reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
    for_each_line(lines, [&](uint64_t h, int64_t i, int64_t n) { scale_line(in + i, o + i, n, h, threshold, scale); });
    return out;
  }
  AT_DISPATCH_FLOATING_TYPES_AND(torch::kHalf, x.scalar_type(), "sample_dropout", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto acc_scale = static_cast<acc_t>(1.0 / (1.0 - p));
    const scalar_t* in = x.const_data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    for_each_keep(lines, p, [&](int64_t i, const float* k, int64_t n) {
      for (int64_t c = 0; c < n; ++c) {
        o[i + c] = static_cast<scalar_t>(static_cast<acc_t>(in[i + c]) * (static_cast<acc_t>(k[c]) * acc_scale));
      }
    });
  });
  return out;
}

// Dropout on the CPU: the forward hashes and scales in one pass; the backward
// hashes again (the lines' seeds are all it keeps).
struct SampleDropoutFunction : torch::autograd::Function<SampleDropoutFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& seeds, const torch::Tensor& shifts, int64_t cols, double p) {
    ctx->save_for_backward({seeds, shifts});
    ctx->saved_data["cols"] = cols;
    ctx->saved_data["p"] = p;
    return masked_scale(x, Lines{seeds, shifts, cols}, p);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    // Dropout is linear and its own adjoint: the backward is the same
    // function, so a double backward works too.
    auto saved = ctx->get_saved_variables();
    torch::Tensor dx = grad[0].defined() ? apply(grad[0], saved[0], saved[1], ctx->saved_data["cols"].toInt(),
                                                 ctx->saved_data["p"].toDouble())
                                         : grad[0];
    return {dx, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

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
  const DropoutRows& rows = rows_for(x);
  auto opts = torch::TensorOptions().dtype(torch::kInt64).device(x.device());
  const int64_t dims = x.dim();
  auto along = [&](int64_t d) {  // 0..size-1 along dimension d
    std::vector<int64_t> s(static_cast<size_t>(dims), 1);
    s[static_cast<size_t>(d)] = x.size(d);
    return torch::arange(x.size(d), opts).view(s);
  };
  const auto salt = static_cast<int64_t>(site_key(site));
  torch::Tensor h;
  if (rows.packed()) {
    const int64_t r = rows.rows(), l = rows.width();
    const std::vector<int64_t> token_shape = dims == 3 ? std::vector<int64_t>{r, l, 1} : std::vector<int64_t>{r, 1, l, 1};
    auto keys = rows.on_device(DropoutRows::Table::kTokenKeys, x.device()).view(token_shape);
    auto pos = rows.on_device(DropoutRows::Table::kTokenPositions, x.device()).view(token_shape);
    h = mix(mix(torch::bitwise_xor(keys, salt)) + pos);
    if (dims == 4) h = mix(h + along(1)) - (along(2) - pos);  // the shift: where the query's sample starts
    h = mix(h + along(dims - 1));
  } else {
    std::vector<int64_t> shape(static_cast<size_t>(dims), 1);
    shape[0] = x.size(0);
    auto keys = rows.on_device(DropoutRows::Table::kKeys, x.device()).view(shape);
    h = mix(torch::bitwise_xor(keys, salt));
    for (int64_t d = dims - 2; d >= 1; --d) h = mix(h + along(d));
    h = mix(dims >= 2 ? h + along(dims - 1) : h);
  }
  return shift_right(h, 40).ge(static_cast<int64_t>(keep_threshold(p)));
}

torch::Tensor sample_keep_mask(const torch::Tensor& x, double p, uint64_t site) {
  if (!x.device().is_cpu()) return sample_keep_mask_tensor_ops(x, p, site);
  const Lines lines = lines_of(x, rows_for(x), site);
  auto mask = torch::empty(x.sizes(), torch::TensorOptions().dtype(torch::kBool));
  bool* out = mask.data_ptr<bool>();
  if (mask.numel() > 0) {
    for_each_keep(lines, p, [&](int64_t i, const float* k, int64_t n) {
      for (int64_t c = 0; c < n; ++c) out[i + c] = k[c] != 0.0f;
    });
  }
  return mask;
}

torch::Tensor sample_dropout(const torch::Tensor& x, double p, uint64_t site, bool training) {
  if (!training || p <= 0) return x;
  if (DropoutRows::current() == nullptr) return torch::dropout(x, p, /*train=*/true);
  if (!x.device().is_cpu()) return x * sample_keep_mask_tensor_ops(x, p, site).to(x.scalar_type()) * (1.0 / (1.0 - p));
  Lines lines = lines_of(x, rows_for(x), site);
  return SampleDropoutFunction::apply(x, lines.seeds, lines.shifts, lines.cols, p);
}

}  // namespace cohort
