#include "cohort/model/rotary.hpp"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <algorithm>

#include "cohort/core/error.hpp"
#include "cohort/model/dropout_lines.hpp"

namespace cohort {

namespace rotary_detail {  // a name of its own: the unity build joins files

using dropout_detail::bf16_bits;
using dropout_detail::bf16_value;

inline float value(float x) { return x; }
inline float value(uint16_t x) { return bf16_value(x); }
template <class T>
T stored(float v);
template <>
inline float stored<float>(float v) { return v; }
template <>
inline uint16_t stored<uint16_t>(float v) { return bf16_bits(v); }

// y = x * cos + rotate_half(x) * sin for one head's D values, in fp32, each
// product and the sum rounded as the unfused ops round them.
template <class T>
inline void rotate_head(const T* x, T* y, const float* c, const float* s, int64_t half) {
  for (int64_t d = 0; d < half; ++d) {
    const float a = value(x[d]) * c[d], b = -value(x[d + half]) * s[d];
    y[d] = stored<T>(a + b);
  }
  for (int64_t d = half; d < 2 * half; ++d) {
    const float a = value(x[d]) * c[d], b = value(x[d - half]) * s[d];
    y[d] = stored<T>(a + b);
  }
}

// Its gradient: gx = g * cos + rotate_half's transpose of g * sin.
template <class T>
inline void unrotate_head(const T* g, T* gx, const float* c, const float* s, int64_t half) {
  for (int64_t d = 0; d < half; ++d) {
    const float a = value(g[d]) * c[d], b = value(g[d + half]) * s[d + half];
    gx[d] = stored<T>(a + b);
  }
  for (int64_t d = half; d < 2 * half; ++d) {
    const float a = value(g[d]) * c[d], b = -(value(g[d - half]) * s[d - half]);
    gx[d] = stored<T>(a + b);
  }
}

// The shapes one pass walks: B rows of L tokens, A heads of D.
struct Shape {
  int64_t rows, length, heads, dim;
  bool per_row;  // cos and sin have a row each (packed rows' positions)
  int64_t hidden() const { return heads * dim; }
  // Token t's angles, and head a of its [B, A, L, D] element offset.
  int64_t angles(int64_t t) const { return ((per_row ? t / length : 0) * length + t % length) * dim; }
  int64_t head(int64_t t, int64_t a) const { return (((t / length) * heads + a) * length + t % length) * dim; }
};

int64_t grain(const Shape& s) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(3 * s.hidden(), 1)); }

// qkv [B, L, 3, A, D] to q and k rotated and v, each [B, A, L, D].
template <class T>
void split_rotate(const T* qkv, T* q, T* k, T* v, const float* cos, const float* sin, const Shape& s) {
  const int64_t h = s.hidden(), half = s.dim / 2;
  at::parallel_for(0, s.rows * s.length, grain(s), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* x = qkv + t * 3 * h;
      const float* c = cos + s.angles(t);
      const float* sn = sin + s.angles(t);
      for (int64_t a = 0; a < s.heads; ++a) {
        const int64_t o = s.head(t, a);
        rotate_head(x + a * s.dim, q + o, c, sn, half);
        rotate_head(x + h + a * s.dim, k + o, c, sn, half);
        std::copy(x + 2 * h + a * s.dim, x + 2 * h + (a + 1) * s.dim, v + o);
      }
    }
  });
}

// The gradients of q, k and v (each [B, A, L, D]; null: zero) to qkv's.
template <class T>
void join_unrotate(const T* gq, const T* gk, const T* gv, T* gqkv, const float* cos, const float* sin,
                   const Shape& s) {
  const int64_t h = s.hidden(), half = s.dim / 2;
  at::parallel_for(0, s.rows * s.length, grain(s), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      T* gx = gqkv + t * 3 * h;
      const float* c = cos + s.angles(t);
      const float* sn = sin + s.angles(t);
      for (int64_t a = 0; a < s.heads; ++a) {
        const int64_t o = s.head(t, a);
        T* to = gx + a * s.dim;
        if (gq) unrotate_head(gq + o, to, c, sn, half);
        else std::fill(to, to + s.dim, stored<T>(0.0f));
        to += h;
        if (gk) unrotate_head(gk + o, to, c, sn, half);
        else std::fill(to, to + s.dim, stored<T>(0.0f));
        to += h;
        if (gv) std::copy(gv + o, gv + o + s.dim, to);
        else std::fill(to, to + s.dim, stored<T>(0.0f));
      }
    }
  });
}

template <class T>
T* elements(const torch::Tensor& t) {
  return t.defined() ? reinterpret_cast<T*>(t.data_ptr()) : nullptr;
}

bool fusable(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& sin) {
  return qkv.is_cpu() && (qkv.scalar_type() == torch::kFloat32 || qkv.scalar_type() == torch::kBFloat16) &&
         qkv.dim() == 3 && qkv.is_contiguous() && cos.is_cpu() && sin.is_cpu() &&
         cos.scalar_type() == torch::kFloat32 && sin.scalar_type() == torch::kFloat32 && cos.is_contiguous() &&
         sin.is_contiguous() && cos.sizes() == sin.sizes() && cos.dim() == 3 &&
         (cos.size(0) == 1 || cos.size(0) == qkv.size(0)) && cos.size(1) == qkv.size(1);
}

Shape shape_of(const torch::Tensor& qkv, int64_t heads, const torch::Tensor& cos) {
  const int64_t dim = qkv.size(2) / (3 * heads);
  COHORT_CHECK(dim * 3 * heads == qkv.size(2) && dim % 2 == 0 && cos.size(2) == dim, Error, "rotary_qkv: qkv ",
               qkv.sizes(), " for ", heads, " heads and angles ", cos.sizes());
  return Shape{qkv.size(0), qkv.size(1), heads, dim, cos.size(0) > 1};
}

struct RotaryQkvFunction : torch::autograd::Function<RotaryQkvFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& qkv,
                                                int64_t heads, const torch::Tensor& cos, const torch::Tensor& sin) {
    const Shape s = shape_of(qkv, heads, cos);
    auto opts = qkv.options();
    auto q = torch::empty({s.rows, s.heads, s.length, s.dim}, opts);
    auto k = torch::empty_like(q), v = torch::empty_like(q);
    if (qkv.scalar_type() == torch::kFloat32) {
      split_rotate(elements<float>(qkv), elements<float>(q), elements<float>(k), elements<float>(v),
                   cos.data_ptr<float>(), sin.data_ptr<float>(), s);
    } else {
      split_rotate(elements<uint16_t>(qkv), elements<uint16_t>(q), elements<uint16_t>(k), elements<uint16_t>(v),
                   cos.data_ptr<float>(), sin.data_ptr<float>(), s);
    }
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["length"] = qkv.size(1);
    return {q, k, v};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& cos = saved[0];
    const auto& sin = saved[1];
    torch::Tensor any;
    for (auto& g : grads) {
      if (g.defined()) {
        g = g.contiguous();
        any = g;
      }
    }
    if (!any.defined()) return {torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const Shape s{any.size(0), ctx->saved_data["length"].toInt(), heads, any.size(3), cos.size(0) > 1};
    auto gqkv = torch::empty({s.rows, s.length, 3 * s.hidden()}, any.options());
    if (any.scalar_type() == torch::kFloat32) {
      join_unrotate(elements<float>(grads[0]), elements<float>(grads[1]), elements<float>(grads[2]),
                    elements<float>(gqkv), cos.data_ptr<float>(), sin.data_ptr<float>(), s);
    } else {
      join_unrotate(elements<uint16_t>(grads[0]), elements<uint16_t>(grads[1]), elements<uint16_t>(grads[2]),
                    elements<uint16_t>(gqkv), cos.data_ptr<float>(), sin.data_ptr<float>(), s);
    }
    return {gqkv, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

torch::Tensor rotate_half(const torch::Tensor& x) {
  auto halves = x.chunk(2, -1);
  return torch::cat({halves[1].neg(), halves[0]}, -1);
}

// x [B, A, L, D] rotated in fp32, as Hugging Face's apply_rotary_pos_emb.
torch::Tensor rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  auto f = x.to(torch::kFloat32);
  return (f * cos.unsqueeze(1) + rotate_half(f) * sin.unsqueeze(1)).to(x.scalar_type());
}

}  // namespace rotary_detail

Qkv rotary_qkv_unfused(const torch::Tensor& qkv, int64_t heads, const torch::Tensor& cos, const torch::Tensor& sin) {
  const auto b = qkv.size(0), l = qkv.size(1), d = qkv.size(2) / (3 * heads);
  auto parts = qkv.view({b, l, 3, heads, d}).permute({2, 0, 3, 1, 4}).unbind(0);
  return {rotary_detail::rotate(parts[0], cos, sin), rotary_detail::rotate(parts[1], cos, sin), parts[2]};
}

Qkv rotary_qkv(const torch::Tensor& qkv, int64_t heads, const torch::Tensor& cos, const torch::Tensor& sin) {
  if (!rotary_detail::fusable(qkv, cos, sin)) return rotary_qkv_unfused(qkv, heads, cos, sin);
  auto out = rotary_detail::RotaryQkvFunction::apply(qkv, heads, cos, sin);
  return {out[0], out[1], out[2]};
}

}  // namespace cohort
