// defines: splitmix64, Rng
//
// Portable randomness: the same seed gives the same draws on every platform
// and standard library (std::uniform_int_distribution and std::shuffle are
// implementation-defined). Used for the global sample order and for
// `cohort prepare`'s instances.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace cohort {

// A well-mixed 64-bit hash, for deriving independent seeds.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// std::mt19937_64 with portable bounded draws.
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  uint64_t next() { return engine_(); }
  // Uniform in [0, n), unbiased: the lowest 2^64 mod n values are rejected
  // so every residue is equally likely. n >= 1.
  uint64_t below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;
    uint64_t x = next();
    while (x < threshold) x = next();
    return x % n;
  }
  // Uniform in [lo, hi], both included. lo <= hi.
  int64_t between(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(below(static_cast<uint64_t>(hi - lo) + 1)); }
  // Uniform in [0, 1), 53 bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Fisher-Yates, from the back.
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }

 private:
  std::mt19937_64 engine_;
};

}  // namespace cohort
