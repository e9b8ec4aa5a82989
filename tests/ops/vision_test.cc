// The vision tower's CPU ops (ops/cpu/vision.h): finite-difference gradient checks in fp64 (the
// bound rule of tests/ops/test_util.h) and the forwards against their formulas.
#include "ops/cpu/vision.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "base/check.h"
#include "tests/ops/test_util.h"

namespace tt::cpu {
namespace {

using test::check_gradient;
using test::dot_objective;
using test::randn;

TEST(LayerNorm, GradientByFiniteDifferences) {
  std::mt19937_64 rng(21);
  const int rows = 5, C = 7;
  std::vector<double> x = randn(rng, rows * C, 2.0), w = randn(rng, C), b = randn(rng, C), R = randn(rng, rows * C);
  std::vector<double> out(rows * C), mean(rows), rstd(rows);
  auto objective = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, C, 1e-6);
    return dot_objective(out, R);
  };
  objective();
  // Row 1, channel 3 by the formula: (x - mean) / sqrt(var + eps) w + b.
  double m = 0, v = 0;
  for (int c = 0; c < C; c++) m += x[C + c] / C;
  for (int c = 0; c < C; c++) v += (x[C + c] - m) * (x[C + c] - m) / C;
  EXPECT_NEAR(out[C + 3], (x[C + 3] - m) / std::sqrt(v + 1e-6) * w[3] + b[3], 1e-12);
  std::vector<double> dx(rows * C, 0.0), dw(C, 0.0), db(C, 0.0);
  layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), mean.data(), rstd.data(), rows, C);
  check_gradient("dx", &x, dx, objective);
  check_gradient("dw", &w, dw, objective);
  check_gradient("db", &b, db, objective);
}

TEST(GeluTanh, GradientByFiniteDifferencesAndFormula) {
  std::mt19937_64 rng(22);
  const int n = 40;
  std::vector<double> x = randn(rng, n, 2.0), R = randn(rng, n), y(n);
  auto objective = [&] {
    gelu_tanh_forward(y.data(), x.data(), n);
    return dot_objective(y, R);
  };
  objective();
  for (int i = 0; i < n; ++i) {
    const double v = x[i];
    EXPECT_NEAR(y[i], 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))), 1e-15);
  }
  std::vector<double> dx(n, 0.0);
  gelu_tanh_backward(dx.data(), R.data(), x.data(), n);
  check_gradient("dx", &x, dx, objective);
}

TEST(GeluErf, GradientByFiniteDifferencesAndFormula) {
  std::mt19937_64 rng(25);
  const int n = 40;
  std::vector<double> x = randn(rng, n, 2.0), R = randn(rng, n), y(n);
  auto objective = [&] {
    gelu_erf_forward(y.data(), x.data(), n);
    return dot_objective(y, R);
  };
  objective();
  for (int i = 0; i < n; ++i) EXPECT_NEAR(y[i], 0.5 * x[i] * std::erfc(-x[i] / std::sqrt(2.0)), 1e-15);
  std::vector<double> dx(n, 0.0);
  gelu_erf_backward(dx.data(), R.data(), x.data(), n);
  check_gradient("dx", &x, dx, objective);
}

TEST(Bias, AddAndGradientByFiniteDifferences) {
  std::mt19937_64 rng(26);
  const int rows = 4, C = 5;
  std::vector<double> x = randn(rng, rows * C), b = randn(rng, C), R = randn(rng, rows * C), out;
  auto objective = [&] {
    out = x;
    bias_add(out.data(), b.data(), rows, C);
    return dot_objective(out, R);
  };
  objective();
  EXPECT_DOUBLE_EQ(out[2 * C + 3], x[2 * C + 3] + b[3]);
  std::vector<double> db(C, 1.0);  // accumulates
  bias_backward(db.data(), R.data(), rows, C);
  for (double& v : db) v -= 1.0;
  check_gradient("db", &b, db, objective);
}

// copy_rows moves rows between two row spaces; sum_rows gathers and sums a CSR list per
// destination (a frame shown by two slots; an empty list writes zeros); zero_rows clears rows.
TEST(Rows, CopyAddAndZero) {
  const int C = 2;
  const std::vector<double> src = {1, 2, 3, 4, 5, 6};  // rows 0..2
  std::vector<double> dst(8, -1.0);                    // rows 0..3
  const int32_t to[] = {3, 0}, from[] = {1, 2};
  copy_rows(dst.data(), to, src.data(), from, 2, C);
  EXPECT_EQ(dst, (std::vector<double>{5, 6, -1, -1, -1, -1, 3, 4}));
  const int32_t offsets[] = {0, 0, 2, 3}, from2[] = {0, 2, 1};
  sum_rows(dst.data() + 2, src.data(), offsets, from2, 3, C);  // rows 1..3 of dst
  EXPECT_EQ(dst, (std::vector<double>{5, 6, 0, 0, 6, 8, 3, 4}));
  const int32_t z[] = {0, 3};
  zero_rows(dst.data(), z, 2, C);
  EXPECT_EQ(dst, (std::vector<double>{0, 0, 0, 0, 6, 8, 0, 0}));
}

// patchify + matmul is the stride-patch convolution, computed here directly; unpatchify_add is
// patchify's transpose (<patchify(x), y> == <x, unpatchify(y)>).
TEST(Patchify, IsTheConvolutionsGemmInput) {
  std::mt19937_64 rng(23);
  const int H = 6, W = 4, p = 2, P = (H / p) * (W / p), K = 3 * p * p, OC = 5;
  const std::vector<double> px = randn(rng, 3 * H * W), w = randn(rng, (size_t)OC * K);
  std::vector<double> rows((size_t)P * K);
  patchify(rows.data(), px.data(), H, W, p);
  for (int py = 0; py < H / p; py++)
    for (int qx = 0; qx < W / p; qx++)
      for (int o = 0; o < OC; o++) {
        double conv = 0, gemm = 0;
        for (int c = 0; c < 3; c++)
          for (int dy = 0; dy < p; dy++)
            for (int dx = 0; dx < p; dx++)
              conv += w[(size_t)o * K + (c * p + dy) * p + dx] * px[((size_t)c * H + py * p + dy) * W + qx * p + dx];
        const int patch = py * (W / p) + qx;
        for (int k = 0; k < K; k++) gemm += rows[(size_t)patch * K + k] * w[(size_t)o * K + k];
        EXPECT_NEAR(gemm, conv, 1e-12);
      }
  const std::vector<double> y = randn(rng, (size_t)P * K);
  std::vector<double> back(3 * H * W, 0.0);
  unpatchify_add(back.data(), y.data(), H, W, p);
  EXPECT_NEAR(dot_objective(rows, y), dot_objective(px, back), 1e-12);
  EXPECT_THROW(patchify(rows.data(), px.data(), 5, 4, 2), Error);
}

}  // namespace
}  // namespace tt::cpu
