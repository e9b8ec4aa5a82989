// Sampling from logits rows, CPU reference (the CUDA op ops/cuda/sampling.h has the same meaning).
//
// Per row r of logits (R, V): lse[r] = log sum_v exp(x[r, v]) (natural log); the token is
// argmax_v x[r, v] (ties to the lower id) when temperature == 0, else
// argmax_v (x[r, v] / temperature + g(key[r], v)), the Gumbel-max trick: with g = -log(-log(u)) of
// independent uniforms u, the argmax is a draw from softmax(x / temperature). u(key, v) comes from
// a counter-based generator (sample_uniform below), the same on every backend, so a row's draw
// depends only on its logits and its key. logprob[r] = x[r, token] - lse[r]: the log-probability
// at temperature 1.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TT_HOST_DEVICE __host__ __device__
#else
#define TT_HOST_DEVICE
#endif

namespace tt::cpu {

// A uniform in (0, 1) for (key, v): the splitmix64 finaliser of key + (v + 1) * golden ratio,
// top 53 bits, never 0.
TT_HOST_DEVICE inline double sample_uniform(uint64_t key, int64_t v) {
  uint64_t z = key + (uint64_t)(v + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return ((double)(z >> 11) + 0.5) * 0x1.0p-53;
}

// token (R), logprob (R) out; logits (R, V); keys (R).
template <class T>
void sample_rows(int32_t* token, double* logprob, const T* logits, int R, int V, double temperature,
                 const uint64_t* keys);

}  // namespace tt::cpu
