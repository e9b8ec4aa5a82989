// Rotary position embedding (Hugging Face rotate_half), CPU reference, in place.
// For d < HS/2: inv_freq_d = theta^(-2d/HS), a = pos * inv_freq_d (fp64), and the pair
// (x_d, x_{d+HS/2}) is rotated by a: forward by R(a), backward by R(a)^T = R(-a).
#include "ops/cpu/rope.h"

#include <cmath>
#include <vector>

#include "base/check.h"

namespace tt::cpu {
namespace {

// Rotates every head of every row by +angle (sign = 1) or -angle (sign = -1).
template <class T>
void rotate(T* x, const int32_t* pos, int N, int H, int HS, double theta, double sign, const char* op) {
  TT_CHECK(N >= 0 && H > 0 && HS > 0 && HS % 2 == 0, op,
           ": expected N >= 0, H > 0 and an even HS > 0, got N=", N, " H=", H, " HS=", HS);
  TT_CHECK(theta > 0, op, ": expected rope theta > 0, got ", theta);
  const int half = HS / 2;
  std::vector<double> inv_freq(half);  // (HS/2)
  for (int d = 0; d < half; d++) inv_freq[d] = std::pow(theta, -2.0 * d / HS);
#pragma omp parallel
  {
    std::vector<double> cs(half), sn(half);  // (HS/2)
#pragma omp for schedule(static)
    for (int n = 0; n < N; n++) {
      for (int d = 0; d < half; d++) {
        const double a = (double)pos[n] * inv_freq[d];
        cs[d] = std::cos(a);
        sn[d] = sign * std::sin(a);
      }
      for (int h = 0; h < H; h++) {
        T* xh = x + ((int64_t)n * H + h) * HS;  // (HS)
        for (int d = 0; d < half; d++) {
          const double x1 = xh[d], x2 = xh[d + half];
          xh[d] = (T)(x1 * cs[d] - x2 * sn[d]);
          xh[d + half] = (T)(x2 * cs[d] + x1 * sn[d]);
        }
      }
    }
  }
}

}  // namespace

template <class T>
void rope_forward(T* x, const int32_t* pos, int N, int H, int HS, double theta) {
  rotate(x, pos, N, H, HS, theta, 1.0, "rope_forward");
}

template <class T>
void rope_backward(T* dx, const int32_t* pos, int N, int H, int HS, double theta) {
  rotate(dx, pos, N, H, HS, theta, -1.0, "rope_backward");
}

template void rope_forward<float>(float*, const int32_t*, int, int, int, double);
template void rope_forward<double>(double*, const int32_t*, int, int, int, double);
template void rope_backward<float>(float*, const int32_t*, int, int, int, double);
template void rope_backward<double>(double*, const int32_t*, int, int, int, double);

}  // namespace tt::cpu
