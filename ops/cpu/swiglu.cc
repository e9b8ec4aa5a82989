// SwiGLU out = silu(gate) * up and its gradient, CPU reference; elementwise math in fp64.
// d/dg silu(g) = s + g s (1 - s) with s = sigmoid(g).
#include "ops/cpu/swiglu.h"

#include <cmath>

#include "base/check.h"
#include "base/parallel.h"

namespace tt::cpu {

template <class T>
void swiglu_forward(T* out, const T* gate, const T* up, int64_t n) {
  TT_CHECK(n >= 0, "swiglu_forward: expected n >= 0, got ", n);
#pragma omp parallel for schedule(static) if (omp_worth(n * 16))
  for (int64_t i = 0; i < n; i++) {
    const double g = gate[i];
    const double s = 1.0 / (1.0 + std::exp(-g));
    out[i] = (T)(g * s * (double)up[i]);
  }
}

template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n) {
  TT_CHECK(n >= 0, "swiglu_backward: expected n >= 0, got ", n);
#pragma omp parallel for schedule(static) if (omp_worth(n * 16))
  for (int64_t i = 0; i < n; i++) {
    const double g = gate[i];
    const double s = 1.0 / (1.0 + std::exp(-g));
    const double d = dout[i];
    dgate[i] = (T)(d * (double)up[i] * (s + g * s * (1.0 - s)));
    dup[i] = (T)(d * g * s);
  }
}

template void swiglu_forward<float>(float*, const float*, const float*, int64_t);
template void swiglu_forward<double>(double*, const double*, const double*, int64_t);
template void swiglu_backward<float>(float*, float*, const float*, const float*, const float*, int64_t);
template void swiglu_backward<double>(double*, double*, const double*, const double*, const double*,
                                      int64_t);

}  // namespace tt::cpu
