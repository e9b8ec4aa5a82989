// Deterministic parameter initialisation, the same on every backend.
//
// Tensor `name` of a run seeded with `seed` draws from its own stream: splitmix64 (Steele, Lea,
// Flood 2014) seeded with param_init_seed(seed, name), turned into normal(0, stddev) values by
// Box-Muller pairs in fp64 (u1 in (0, 1] keeps the log finite), rounded to the parameter type.
// init_normal_host is the reference; the CUDA backend draws the same values on the device
// (model/exec_cuda_kernels.cu), equal up to the last bit of the fp64 library functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

namespace tt::model {

// The first splitmix64 output of the run seed, xor the FNV-1a hash of the tensor's name.
inline uint64_t param_init_seed(uint64_t seed, const std::string& name) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  uint64_t h = 14695981039346656037ull;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return (z ^ (z >> 31)) ^ h;
}

struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }  // [0, 1)
};

// w (n) = normal(0, stddev) draws of the stream seeded with `state`.
template <class T>
void init_normal_host(T* w, int64_t n, uint64_t state, double stddev) {
  SplitMix64 rng{state};
  const double kTwoPi = 6.283185307179586476925286766559;
  for (int64_t i = 0; i < n; i += 2) {
    const double u1 = 1.0 - rng.uniform();
    const double u2 = rng.uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    w[i] = T(stddev * r * std::cos(kTwoPi * u2));
    if (i + 1 < n) w[i + 1] = T(stddev * r * std::sin(kTwoPi * u2));
  }
}

}  // namespace tt::model
