// defines: fast_math::exp_nonpositive
//
// exp for the CPU kernels' inner loops (model/cross_entropy.hpp):
// branch-free, with no libm call, so that a loop of it vectorises under
// COHORT_VECTOR_CLONES. Not libm's bits: within about 1 ulp of them.
#pragma once

#include <cstdint>
#include <cstring>

namespace cohort::fast_math {

// exp(x) for x <= 0: Cephes' expf, x = n ln2 + r with |r| <= ln2 / 2, a
// degree-6 polynomial in r, times 2^n by exponent bits, in two factors so
// that results below fp32's smallest normal come out subnormal as libm's do
// (x below -104 gives 0).
[[gnu::always_inline]] inline float exp_nonpositive(float x) {
  x = x < -104.0f ? -104.0f : x;
  // Round to nearest by the 1.5 * 2^23 trick.
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * (r * r) + r + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 64 + 127) << 23;  // 2^(n + 64)
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return y * scale * 5.42101086242752217e-20f;  // 2^-64
}

}  // namespace cohort::fast_math
