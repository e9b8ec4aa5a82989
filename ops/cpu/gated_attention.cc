// Qwen3.5's gated attention ops, CPU reference (see gated_attention.h); fp64 inside.
#include "ops/cpu/gated_attention.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"

namespace tt::cpu {

template <class T>
void split_heads(T* a, T* b, const T* ab, int N, int H, int D) {
  TT_CHECK(N >= 0 && H > 0 && D > 0, "split_heads: expected N >= 0, H > 0, D > 0, got ", N, ", ", H, ", ", D);
  for (int64_t r = 0; r < (int64_t)N * H; r++) {
    std::copy_n(ab + r * 2 * D, D, a + r * D);
    std::copy_n(ab + r * 2 * D + D, D, b + r * D);
  }
}

template <class T>
void merge_heads(T* ab, const T* a, const T* b, int N, int H, int D) {
  TT_CHECK(N >= 0 && H > 0 && D > 0, "merge_heads: expected N >= 0, H > 0, D > 0, got ", N, ", ", H, ", ", D);
  for (int64_t r = 0; r < (int64_t)N * H; r++) {
    std::copy_n(a + r * D, D, ab + r * 2 * D);
    std::copy_n(b + r * D, D, ab + r * 2 * D + D);
  }
}

template <class T>
void sigmoid_gate_forward(T* y, const T* x, const T* gate, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = (T)((double)x[i] / (1.0 + std::exp(-(double)gate[i])));
}

template <class T>
void sigmoid_gate_backward(T* dx, T* dgate, const T* dy, const T* x, const T* gate, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const double s = 1.0 / (1.0 + std::exp(-(double)gate[i])), d = (double)dy[i];
    dx[i] = (T)(d * s);
    dgate[i] = (T)(d * (double)x[i] * s * (1.0 - s));
  }
}

#define TT_GATED_INSTANTIATE(T)                                                \
  template void split_heads<T>(T*, T*, const T*, int, int, int);               \
  template void merge_heads<T>(T*, const T*, const T*, int, int, int);         \
  template void sigmoid_gate_forward<T>(T*, const T*, const T*, int64_t);      \
  template void sigmoid_gate_backward<T>(T*, T*, const T*, const T*, const T*, int64_t);
TT_GATED_INSTANTIATE(float)
TT_GATED_INSTANTIATE(double)
#undef TT_GATED_INSTANTIATE

}  // namespace tt::cpu
