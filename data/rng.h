// SplitMix64 (Steele, Lea, Flood 2014): a fixed, portable 64-bit generator for the loader's
// permutations and the synthetic data. The standard library's distributions are not used because
// their output differs between implementations; everything here is plain integer arithmetic, so a
// seed gives the same stream on every platform.
#pragma once

#include <cstdint>

namespace tt::data {

// The SplitMix64 output function: a bijective mix of a 64-bit value.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return mix64(state_);
  }

  // Uniform in [0, n), n >= 1, without modulo bias (rejects the top 2^64 mod n values).
  uint64_t below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;  // = 2^64 mod n
    for (;;) {
      const uint64_t r = next();
      if (r >= threshold) return r % n;
    }
  }

 private:
  uint64_t state_;
};

}  // namespace tt::data
