// RMSNorm forward and backward, CPU reference; row sums in fp64.
// out = x r w with r = (mean(x^2) + eps)^(-1/2), so
//   dx_c = r (dout_c w_c - x_c r^2 mean_k(dout_k w_k x_k)),   dw_c = sum_rows dout_c x_c r.
// dx rows are independent (parallel over rows); dw is reduced per column over rows in a fixed
// row order by one thread per column chunk, so results do not depend on the thread count.
#include "ops/cpu/rmsnorm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/check.h"
#include "base/parallel.h"

namespace tt::cpu {

template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, int rows, int C, double eps, double w_offset) {
  TT_CHECK(rows >= 0 && C > 0, "rmsnorm_forward: expected rows >= 0 and C > 0, got rows=", rows,
           " C=", C);
  TT_CHECK(eps >= 0, "rmsnorm_forward: expected eps >= 0, got ", eps);
#pragma omp parallel for schedule(static) if (omp_worth((int64_t)rows * C))
  for (int r = 0; r < rows; r++) {
    const T* xr = x + (int64_t)r * C;  // (C)
    T* o = out + (int64_t)r * C;       // (C)
    double ss = 0.0;
    for (int c = 0; c < C; c++) ss += (double)xr[c] * (double)xr[c];
    const double rs = 1.0 / std::sqrt(ss / C + eps);
    for (int c = 0; c < C; c++) o[c] = (T)((double)xr[c] * rs * ((double)w[c] + w_offset));
    rstd[r] = (T)rs;
  }
}

template <class T>
void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd, int rows,
                      int C, double w_offset) {
  TT_CHECK(rows >= 0 && C > 0, "rmsnorm_backward: expected rows >= 0 and C > 0, got rows=", rows,
           " C=", C);
#pragma omp parallel for schedule(static) if (omp_worth((int64_t)rows * C))
  for (int r = 0; r < rows; r++) {
    const T* xr = x + (int64_t)r * C;     // (C)
    const T* dr = dout + (int64_t)r * C;  // (C)
    T* dxr = dx + (int64_t)r * C;         // (C)
    const double rs = rstd[r];
    double dot = 0.0;  // sum_k dout_k w_k x_k
    for (int c = 0; c < C; c++) dot += (double)dr[c] * ((double)w[c] + w_offset) * (double)xr[c];
    const double k = rs * rs * dot / C;
    for (int c = 0; c < C; c++) {
      dxr[c] = (T)((double)dxr[c] + rs * ((double)dr[c] * ((double)w[c] + w_offset) - (double)xr[c] * k));
    }
  }
  // dw (C): column chunks of 64, each reduced over all rows in order by one thread.
  constexpr int kChunk = 64;
  const int n_chunks = (C + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (omp_worth((int64_t)rows * C))
  for (int ch = 0; ch < n_chunks; ch++) {
    const int c0 = ch * kChunk, c1 = std::min(C, c0 + kChunk);
    double acc[kChunk] = {};
    for (int r = 0; r < rows; r++) {
      const T* xr = x + (int64_t)r * C;
      const T* dr = dout + (int64_t)r * C;
      const double rs = rstd[r];
      for (int c = c0; c < c1; c++) acc[c - c0] += (double)dr[c] * (double)xr[c] * rs;
    }
    for (int c = c0; c < c1; c++) dw[c] = (T)((double)dw[c] + acc[c - c0]);
  }
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int, int, double, double);
template void rmsnorm_forward<double>(double*, double*, const double*, const double*, int, int, double, double);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*,
                                      const float*, int, int, double);
template void rmsnorm_backward<double>(double*, double*, const double*, const double*, const double*,
                                       const double*, int, int, double);

}  // namespace tt::cpu
