// defines: dropout_detail::{Lines, lines_of, rows_for, kept, bf16_bits, bf16_value}
//
// The per-sample dropout masks' layout (model/dropout.hpp), shared by the
// dropout kernels and the kernels that fuse dropout with what follows it
// (model/residual_norm.hpp). Not an API: its shapes may change with them.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <cstring>

#include "cohort/core/random.hpp"
#include "cohort/model/dropout.hpp"

// The kernels that hash are compiled for AVX-512 and AVX2 as well, picked at
// load time where the CPU has them, so that the hash's 64-bit multiplies
// vectorise. (GCC 12 or later on glibc: arch= in target_clones, and ifunc.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && defined(__GLIBC__)
#define COHORT_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define COHORT_VECTOR_CLONES
#endif

namespace cohort::dropout_detail {

// The current DropoutRows, checked against x's rows (and, packed, its shape).
const DropoutRows& rows_for(const torch::Tensor& x);

// Keep when the top 24 bits are >= p * 2^24.
inline uint64_t keep_threshold(double p) { return static_cast<uint64_t>(p * 16777216.0 + 0.5); }
inline uint64_t site_key(uint64_t site) { return splitmix64(site + 0x5173ull); }

// A mask is laid out in lines along x's last dimension. Element c of a line
// is kept when splitmix64(seed + c - shift) clears the threshold: the seed
// hashes the sample's key with every coordinate but the last, and the shift
// (packed attention only) is where the line's sample starts in its row.
struct Lines {
  torch::Tensor seeds;   // int64 [lines]
  torch::Tensor shifts = torch::empty({0}, torch::kInt64);  // int64 [lines], or empty: none
  int64_t cols = 1;
};

// The lines of x [B, ...] under `rows`, for dropout site `site`.
Lines lines_of(const torch::Tensor& x, const DropoutRows& rows, uint64_t site);

// Element c of the line hashed from h is kept.
inline bool kept(uint64_t h, int64_t c, uint64_t threshold) {
  return (splitmix64(h + static_cast<uint64_t>(c)) >> 40) >= threshold;
}

// bf16 bits to float, and float to bf16 bits rounded to nearest even as
// c10::BFloat16 rounds (NaN to 0x7FC0); both vectorise.
inline float bf16_value(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}
inline uint16_t bf16_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? uint16_t{0x7FC0}
                                         : static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace cohort::dropout_detail
