// Shared helpers of the CPU op tests: seeded random tensors and a central finite-difference
// gradient check.
//
// Gradient-check bound. For a smooth objective L(x) the central difference
// (L(x + h) - L(x - h)) / 2h differs from dL/dx by a truncation term |L'''| h^2 / 6 and a rounding
// term of about eps_L / h, where eps_L is the absolute rounding error of one evaluation of L.
// With fp64 (unit roundoff 1.1e-16), O(1) inputs, h = 1e-6 and objectives that are sums of at most
// a few thousand O(1) terms, eps_L <= 1e3 * 1.1e-16 * |terms| ~ 1e-13 (a worst case; rounding
// errors of a sum grow like sqrt(n) in practice), so the rounding term is <= 1e-7 and the
// truncation term ~1e-13. Measured against the largest analytic gradient of the tensor (normwise
// relative error, O(1) here) a bound of 1e-6 therefore holds with margin for a correct gradient,
// while any real mistake (a missing term, a wrong sign or scale) gives errors of order 1e-2 or more.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace tt::test {

constexpr double kFdStep = 1e-6;
constexpr double kFdTol = 1e-6;

inline std::vector<double> randn(std::mt19937_64& rng, size_t n, double scale = 1.0) {
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> x(n);
  for (auto& v : x) v = dist(rng);
  return x;
}

// Small integers in [-r, r]: products and sums of a few of them are exact in float and double.
inline std::vector<double> randint(std::mt19937_64& rng, size_t n, int r) {
  std::uniform_int_distribution<int> dist(-r, r);
  std::vector<double> x(n);
  for (auto& v : x) v = dist(rng);
  return x;
}

template <class T>
std::vector<T> cast(const std::vector<double>& x) {
  return std::vector<T>(x.begin(), x.end());
}

// sum(out * r) in long double, so the objective adds no rounding of its own beyond out's.
inline double dot_objective(const std::vector<double>& out, const std::vector<double>& r) {
  long double s = 0;
  for (size_t i = 0; i < out.size(); i++) s += (long double)out[i] * r[i];
  return (double)s;
}

// Largest |a - b| over the largest |b|: normwise relative error of a against reference b.
inline double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  double err = 0.0, ref = 0.0;
  for (size_t i = 0; i < a.size(); i++) {
    err = std::max(err, std::fabs(a[i] - b[i]));
    ref = std::max(ref, std::fabs(b[i]));
  }
  return ref > 0 ? err / ref : err;
}

// Checks the analytic gradient of L with respect to x by central differences on every element.
// objective() recomputes L from the current contents of x.
inline void check_gradient(const std::string& name, std::vector<double>* x, const std::vector<double>& analytic,
                           const std::function<double()>& objective) {
  ASSERT_EQ(x->size(), analytic.size()) << name;
  std::vector<double> fd(x->size());
  for (size_t i = 0; i < x->size(); i++) {
    const double saved = (*x)[i];
    (*x)[i] = saved + kFdStep;
    const double lp = objective();
    (*x)[i] = saved - kFdStep;
    const double lm = objective();
    (*x)[i] = saved;
    fd[i] = (lp - lm) / (2 * kFdStep);
  }
  double max_grad = 0.0;
  for (double g : analytic) max_grad = std::max(max_grad, std::fabs(g));
  ASSERT_GT(max_grad, 1e-3) << name << ": gradient too small for a meaningful check";
  EXPECT_LE(rel_error(fd, analytic), kFdTol) << name << " (max |grad| " << max_grad << ")";
}

}  // namespace tt::test
