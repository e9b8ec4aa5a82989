// AdamW and the fp64 sum of squares, CPU reference.
// The update follows torch.optim.AdamW exactly (in fp64, stored back as T):
//   g = grad * grad_scale; param *= 1 - lr * wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
//   param -= (lr / (1 - b1^step)) * m / (sqrt(v) / sqrt(1 - b2^step) + eps).
// sum_squares reduces fixed blocks in parallel and adds the block sums in order, so the result
// does not depend on the thread count.
#include "ops/cpu/adamw.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/check.h"
#include "base/parallel.h"

namespace tt::cpu {

template <class T>
void adamw_update(T* param, const T* grad, T* m, T* v, int64_t n, const AdamWParams& p) {
  TT_CHECK(n >= 0, "adamw_update: expected n >= 0, got ", n);
  TT_CHECK(p.step >= 1, "adamw_update: step is 1-based, got ", p.step);
  TT_CHECK(p.beta1 >= 0 && p.beta1 < 1 && p.beta2 >= 0 && p.beta2 < 1,
           "adamw_update: expected betas in [0, 1), got beta1=", p.beta1, " beta2=", p.beta2);
  const double bc1 = 1.0 - std::pow(p.beta1, (double)p.step);
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(p.beta2, (double)p.step));
  const double step_size = p.lr / bc1;
  const double decay = 1.0 - p.lr * p.weight_decay;
#pragma omp parallel for schedule(static) if (omp_worth(n * 8))
  for (int64_t i = 0; i < n; i++) {
    const double g = (double)grad[i] * p.grad_scale;
    const double mi = p.beta1 * (double)m[i] + (1.0 - p.beta1) * g;
    const double vi = p.beta2 * (double)v[i] + (1.0 - p.beta2) * g * g;
    const double denom = std::sqrt(vi) / bc2_sqrt + p.eps;
    param[i] = (T)((double)param[i] * decay - step_size * mi / denom);
    m[i] = (T)mi;
    v[i] = (T)vi;
  }
}

template <class T>
double sum_squares(const T* x, int64_t n) {
  TT_CHECK(n >= 0, "sum_squares: expected n >= 0, got ", n);
  constexpr int64_t kBlock = 1 << 14;
  const int64_t n_blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> part(n_blocks);  // (n_blocks)
#pragma omp parallel for schedule(static) if (omp_worth(n))
  for (int64_t b = 0; b < n_blocks; b++) {
    const int64_t i1 = std::min(n, (b + 1) * kBlock);
    double s = 0.0;
    for (int64_t i = b * kBlock; i < i1; i++) s += (double)x[i] * (double)x[i];
    part[b] = s;
  }
  double total = 0.0;
  for (int64_t b = 0; b < n_blocks; b++) total += part[b];
  return total;
}

template void adamw_update<float>(float*, const float*, float*, float*, int64_t, const AdamWParams&);
template void adamw_update<double>(double*, const double*, double*, double*, int64_t,
                                   const AdamWParams&);
template double sum_squares<float>(const float*, int64_t);
template double sum_squares<double>(const double*, int64_t);

}  // namespace tt::cpu
