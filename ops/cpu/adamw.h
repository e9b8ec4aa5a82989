// AdamW (decoupled weight decay) and global gradient norm, CPU reference.
// The parameter, m and v buffers are updated in place; grad is read only.
#pragma once
#include <cstdint>

namespace tt::cpu {

struct AdamWParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;  // applied as param -= lr * wd * param (decoupled)
  int64_t step = 1;           // 1-based, for bias correction
  double grad_scale = 1.0;    // multiplies grad first (clipping folds in here)
};

// param, grad, m, v: (n).
template <class T>
void adamw_update(T* param, const T* grad, T* m, T* v, int64_t n, const AdamWParams& p);

// sum of squares of x (n), accumulated in fp64.
template <class T>
double sum_squares(const T* x, int64_t n);

}  // namespace tt::cpu
