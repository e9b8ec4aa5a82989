// Sampling from logits rows, CPU reference (see sampling.h). fp64 throughout.
#include "ops/cpu/sampling.h"

#include <cmath>

#include "base/check.h"

namespace tt::cpu {

template <class T>
void sample_rows(int32_t* token, double* logprob, const T* logits, int R, int V, double temperature,
                 const uint64_t* keys) {
  TT_CHECK(R >= 0 && V > 0 && temperature >= 0, "sample_rows: R=", R, " V=", V, " temperature=", temperature);
  for (int r = 0; r < R; ++r) {
    const T* x = logits + (int64_t)r * V;
    int best = 0;
    for (int v = 1; v < V; ++v)
      if ((double)x[v] > (double)x[best]) best = v;
    const double mx = x[best];
    double z = 0;
    for (int v = 0; v < V; ++v) z += std::exp((double)x[v] - mx);
    int tok = best;
    if (temperature > 0) {
      double top = -INFINITY;
      for (int v = 0; v < V; ++v) {
        const double s = (double)x[v] / temperature - std::log(-std::log(sample_uniform(keys[r], v)));
        if (s > top) top = s, tok = v;
      }
    }
    token[r] = tok;
    logprob[r] = (double)x[tok] - (mx + std::log(z));
  }
}

template void sample_rows<float>(int32_t*, double*, const float*, int, int, double, const uint64_t*);
template void sample_rows<double>(int32_t*, double*, const double*, int, int, double, const uint64_t*);

}  // namespace tt::cpu
