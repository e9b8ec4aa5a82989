// Rotary position embedding (Hugging Face rotate_half), CPU reference, in place.
// With R the rotary dims (HS, or the first R of a head for Qwen3.5's partial RoPE): for d < R/2,
// inv_freq_d = theta^(-2d/R), a = pos * inv_freq_d (fp64), and the pair (x_d, x_{d+R/2}) is
// rotated by a: forward by R(a), backward by R(a)^T = R(-a); dims R.. pass through.
#include "ops/cpu/rope.h"

#include <cmath>
#include <vector>

#include "base/check.h"
#include "base/parallel.h"

namespace tt::cpu {
namespace {

// Rotates every head of every row by +angle (sign = 1) or -angle (sign = -1).
template <class T>
void rotate(T* x, const int32_t* pos, int N, int H, int HS, double theta, double sign, const char* op,
            int rotary_dim) {
  const int R = rotary_dim > 0 ? rotary_dim : HS;
  TT_CHECK(N >= 0 && H > 0 && HS > 0 && R % 2 == 0 && R <= HS, op,
           ": expected N >= 0, H > 0 and an even rotary_dim <= HS, got N=", N, " H=", H, " HS=", HS, " rotary_dim=", R);
  TT_CHECK(theta > 0, op, ": expected rope theta > 0, got ", theta);
  const int half = R / 2;
  std::vector<double> inv_freq(half);  // (R/2)
  for (int d = 0; d < half; d++) inv_freq[d] = std::pow(theta, -2.0 * d / R);
  OmpErrors errors;  // an allocation failing in the region, rethrown after it
#pragma omp parallel if (omp_worth((int64_t)N * H * R))
  {
    std::vector<double> cs, sn;  // (R/2)
    errors.run([&] {
      cs.resize(half);
      sn.resize(half);
    });
#pragma omp for schedule(static)
    for (int n = 0; n < N; n++) {
      errors.run([&] {
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
      });
    }
  }
  errors.rethrow();
}

}  // namespace

template <class T>
void rope_forward(T* x, const int32_t* pos, int N, int H, int HS, double theta, int rotary_dim) {
  rotate(x, pos, N, H, HS, theta, 1.0, "rope_forward", rotary_dim);
}

template <class T>
void rope_backward(T* dx, const int32_t* pos, int N, int H, int HS, double theta, int rotary_dim) {
  rotate(dx, pos, N, H, HS, theta, -1.0, "rope_backward", rotary_dim);
}

template void rope_forward<float>(float*, const int32_t*, int, int, int, double, int);
template void rope_forward<double>(double*, const int32_t*, int, int, int, double, int);
template void rope_backward<float>(float*, const int32_t*, int, int, int, double, int);
template void rope_backward<double>(double*, const int32_t*, int, int, int, double, int);

}  // namespace tt::cpu
