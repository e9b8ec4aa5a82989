// CPU reference ops other than attention: finite-difference gradient checks in fp64 for every
// backward, exact checks with integer-valued inputs, AdamW against a hand-computed example,
// index validation, and thread-count independence of the reductions.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "base/parallel.h"
#include "base/check.h"
#include "ops/cpu/adamw.h"
#include "ops/cpu/cross_entropy.h"
#include "ops/cpu/embedding.h"
#include "ops/cpu/matmul.h"
#include "ops/cpu/retrieval.h"
#include "ops/cpu/rmsnorm.h"
#include "ops/cpu/rope.h"
#include "ops/cpu/swiglu.h"
#include "tests/ops/test_util.h"

namespace tt::cpu {
namespace {

using test::check_gradient;
using test::dot_objective;
using test::randn;

TEST(Embedding, GradientByFiniteDifferences) {
  std::mt19937_64 rng(1);
  const int N = 9, C = 5, V = 6;
  const std::vector<int32_t> tokens = {3, 0, 3, 5, 1, 3, 0, 2, 5};
  std::vector<double> wte = randn(rng, V * C), R = randn(rng, N * C), out(N * C);
  auto objective = [&] {
    embedding_forward(out.data(), tokens.data(), wte.data(), N, C);
    return dot_objective(out, R);
  };
  // Gradients accumulate: start from a known dwte and subtract it.
  const std::vector<double> base = randn(rng, V * C);
  std::vector<double> dwte = base;
  embedding_backward(dwte.data(), R.data(), tokens.data(), N, C);
  for (int i = 0; i < V * C; i++) dwte[i] -= base[i];
  check_gradient("dwte", &wte, dwte, objective);
}

TEST(Embedding, RejectsNegativeToken) {
  std::vector<double> wte(4), out(2);
  const std::vector<int32_t> tokens = {1, -1};
  EXPECT_THROW(embedding_forward(out.data(), tokens.data(), wte.data(), 2, 1), tt::Error);
}

TEST(RmsNorm, GradientByFiniteDifferences) {
  std::mt19937_64 rng(2);
  const int rows = 6, C = 7;
  const double eps = 1e-5;
  std::vector<double> x = randn(rng, rows * C), w = randn(rng, C), R = randn(rng, rows * C);
  std::vector<double> out(rows * C), rstd(rows);
  auto objective = [&] {
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), rows, C, eps);
    return dot_objective(out, R);
  };
  objective();
  const std::vector<double> base_dx = randn(rng, rows * C), base_dw = randn(rng, C);
  std::vector<double> dx = base_dx, dw = base_dw;
  rmsnorm_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(), rows, C);
  for (int i = 0; i < rows * C; i++) dx[i] -= base_dx[i];
  for (int i = 0; i < C; i++) dw[i] -= base_dw[i];
  check_gradient("dx", &x, dx, objective);
  check_gradient("dw", &w, dw, objective);
}

TEST(RmsNorm, ForwardMatchesFormula) {
  const std::vector<double> x = {3, 4}, w = {2, 0.5};
  std::vector<double> out(2), rstd(1);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), 1, 2, 0.0);
  // mean(x^2) = 12.5, rstd = 1/sqrt(12.5).
  EXPECT_DOUBLE_EQ(rstd[0], 1 / std::sqrt(12.5));
  EXPECT_DOUBLE_EQ(out[0], 3 * 2 / std::sqrt(12.5));
  EXPECT_DOUBLE_EQ(out[1], 4 * 0.5 / std::sqrt(12.5));
}

// Shapes that are not multiples of the 4 x 4 register block or the 32-row tile.
struct MatmulShape {
  const char* name;
  int N, IC, OC;
};

class MatmulTest : public ::testing::TestWithParam<MatmulShape> {};

TEST_P(MatmulTest, GradientByFiniteDifferences) {
  const MatmulShape s = GetParam();
  std::mt19937_64 rng(3);
  std::vector<double> x = randn(rng, s.N * s.IC), w = randn(rng, s.OC * s.IC), R = randn(rng, s.N * s.OC);
  std::vector<double> out(s.N * s.OC);
  auto objective = [&] {
    matmul_forward(out.data(), x.data(), w.data(), s.N, s.IC, s.OC);
    return dot_objective(out, R);
  };
  const std::vector<double> base_dx = randn(rng, s.N * s.IC), base_dw = randn(rng, s.OC * s.IC);
  std::vector<double> dx = base_dx, dw = base_dw;
  matmul_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), s.N, s.IC, s.OC);
  for (size_t i = 0; i < dx.size(); i++) dx[i] -= base_dx[i];
  for (size_t i = 0; i < dw.size(); i++) dw[i] -= base_dw[i];
  check_gradient("dx", &x, dx, objective);
  check_gradient("dw", &w, dw, objective);
}

// Integer-valued inputs: every product and partial sum is exact, so float and double must equal
// a naive triple loop exactly.
template <class T>
void check_matmul_exact(const MatmulShape& s) {
  std::mt19937_64 rng(4);
  const std::vector<double> x = test::randint(rng, s.N * s.IC, 3), w = test::randint(rng, s.OC * s.IC, 3);
  const std::vector<double> dout = test::randint(rng, s.N * s.OC, 3);
  const std::vector<double> dx0 = test::randint(rng, s.N * s.IC, 3), dw0 = test::randint(rng, s.OC * s.IC, 3);
  std::vector<T> xt = test::cast<T>(x), wt = test::cast<T>(w), doutt = test::cast<T>(dout);
  std::vector<T> out(s.N * s.OC, T(7)), dx = test::cast<T>(dx0), dw = test::cast<T>(dw0);
  matmul_forward(out.data(), xt.data(), wt.data(), s.N, s.IC, s.OC);
  matmul_backward(dx.data(), dw.data(), doutt.data(), xt.data(), wt.data(), s.N, s.IC, s.OC);
  for (int n = 0; n < s.N; n++) {
    for (int o = 0; o < s.OC; o++) {
      double ref = 0;
      for (int i = 0; i < s.IC; i++) ref += x[n * s.IC + i] * w[o * s.IC + i];
      ASSERT_EQ((double)out[n * s.OC + o], ref) << "out " << n << "," << o;
    }
    for (int i = 0; i < s.IC; i++) {
      double ref = dx0[n * s.IC + i];
      for (int o = 0; o < s.OC; o++) ref += dout[n * s.OC + o] * w[o * s.IC + i];
      ASSERT_EQ((double)dx[n * s.IC + i], ref) << "dx " << n << "," << i;
    }
  }
  for (int o = 0; o < s.OC; o++) {
    for (int i = 0; i < s.IC; i++) {
      double ref = dw0[o * s.IC + i];
      for (int n = 0; n < s.N; n++) ref += dout[n * s.OC + o] * x[n * s.IC + i];
      ASSERT_EQ((double)dw[o * s.IC + i], ref) << "dw " << o << "," << i;
    }
  }
}

TEST_P(MatmulTest, ExactOnIntegersDouble) { check_matmul_exact<double>(GetParam()); }
TEST_P(MatmulTest, ExactOnIntegersFloat) { check_matmul_exact<float>(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Shapes, MatmulTest,
                         ::testing::Values(MatmulShape{"one_row", 1, 3, 2}, MatmulShape{"odd", 7, 5, 6},
                                           MatmulShape{"blocks", 8, 8, 8},
                                           MatmulShape{"past_tile", 37, 9, 13}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Matmul, NullGradientsAreSkipped) {
  std::mt19937_64 rng(5);
  const int N = 5, IC = 3, OC = 4;
  const std::vector<double> x = randn(rng, N * IC), w = randn(rng, OC * IC), dout = randn(rng, N * OC);
  std::vector<double> dx(N * IC, 0.0), dw(OC * IC, 0.0), dx_only(N * IC, 0.0), dw_only(OC * IC, 0.0);
  matmul_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), N, IC, OC);
  matmul_backward(dx_only.data(), (double*)nullptr, dout.data(), x.data(), w.data(), N, IC, OC);
  matmul_backward((double*)nullptr, dw_only.data(), dout.data(), x.data(), w.data(), N, IC, OC);
  EXPECT_EQ(dx, dx_only);
  EXPECT_EQ(dw, dw_only);
}

TEST(Matmul, SameResultForAnyThreadCount) {
  std::mt19937_64 rng(6);
  const int N = 70, IC = 33, OC = 18;
  const std::vector<float> x = test::cast<float>(randn(rng, N * IC)), w = test::cast<float>(randn(rng, OC * IC));
  const std::vector<float> dout = test::cast<float>(randn(rng, N * OC));
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    std::vector<float> out(N * OC), dx(N * IC, 0.f), dw(OC * IC, 0.f);
    matmul_forward(out.data(), x.data(), w.data(), N, IC, OC);
    matmul_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), N, IC, OC);
    out.insert(out.end(), dx.begin(), dx.end());
    out.insert(out.end(), dw.begin(), dw.end());
    return out;
  };
  const int max_threads = omp_get_max_threads();
  const int64_t min_work = omp_min_work().exchange(0);  // every region on its team, however small
  const std::vector<float> one = run(1), many = run(3);
  omp_set_num_threads(max_threads);
  omp_min_work().store(min_work);
  EXPECT_EQ(one, many);
}

TEST(Rope, GradientByFiniteDifferences) {
  std::mt19937_64 rng(7);
  const int N = 5, H = 2, HS = 6;
  const double theta = 10000.0;
  const std::vector<int32_t> pos = {0, 1, 2, 7, 300};
  std::vector<double> x = randn(rng, N * H * HS), R = randn(rng, N * H * HS);
  auto objective = [&] {
    std::vector<double> y = x;
    rope_forward(y.data(), pos.data(), N, H, HS, theta);
    return dot_objective(y, R);
  };
  std::vector<double> dx = R;
  rope_backward(dx.data(), pos.data(), N, H, HS, theta);
  check_gradient("dx", &x, dx, objective);
}

TEST(Rope, BackwardInvertsForward) {
  std::mt19937_64 rng(8);
  const int N = 4, H = 3, HS = 8;
  const std::vector<int32_t> pos = {0, 5, 17, 4095};
  const std::vector<double> x = randn(rng, N * H * HS);
  std::vector<double> y = x;
  rope_forward(y.data(), pos.data(), N, H, HS, 1e6);
  rope_backward(y.data(), pos.data(), N, H, HS, 1e6);
  // Two rotations by opposite fp64 angles: a few roundings of O(1) values.
  EXPECT_LE(test::rel_error(y, x), 1e-14);
}

TEST(Rope, MatchesRotateHalfFormula) {
  std::mt19937_64 rng(9);
  const int N = 2, H = 1, HS = 8, half = HS / 2;
  const double theta = 10000.0;
  const std::vector<int32_t> pos = {0, 11};
  const std::vector<double> x = randn(rng, N * H * HS);
  std::vector<double> y = x;
  rope_forward(y.data(), pos.data(), N, H, HS, theta);
  // Row 1, d = 3: angle = 11 * theta^(-6/8); out[d] = x[d] cos - x[d+4] sin, out[d+4] = x[d+4] cos + x[d] sin.
  const double a = 11 * std::pow(theta, -6.0 / 8.0);
  const double* x1 = x.data() + HS;
  EXPECT_NEAR(y[HS + 3], x1[3] * std::cos(a) - x1[3 + half] * std::sin(a), 1e-15);
  EXPECT_NEAR(y[HS + 3 + half], x1[3 + half] * std::cos(a) + x1[3] * std::sin(a), 1e-15);
  // Position 0 is the identity.
  for (int d = 0; d < HS; d++) EXPECT_EQ(y[d], x[d]);
}

TEST(Rope, RejectsOddHeadDim) {
  std::vector<double> x(3);
  const std::vector<int32_t> pos = {0};
  EXPECT_THROW(rope_forward(x.data(), pos.data(), 1, 1, 3, 10000.0), tt::Error);
}

TEST(SwiGlu, GradientByFiniteDifferences) {
  std::mt19937_64 rng(10);
  const int n = 40;
  std::vector<double> gate = randn(rng, n, 2.0), up = randn(rng, n), R = randn(rng, n), out(n);
  auto objective = [&] {
    swiglu_forward(out.data(), gate.data(), up.data(), n);
    return dot_objective(out, R);
  };
  std::vector<double> dgate(n, 1e30), dup(n, 1e30);  // overwritten
  swiglu_backward(dgate.data(), dup.data(), R.data(), gate.data(), up.data(), n);
  check_gradient("dgate", &gate, dgate, objective);
  check_gradient("dup", &up, dup, objective);
}

// Rows 1 and 4 are branch points (several targets), rows 0, 3 and 6 have none.
struct CeCase {
  int N = 7, V = 5;
  std::vector<int32_t> src = {1, 1, 2, 4, 4, 4, 5, 1};
  std::vector<int32_t> tok = {0, 3, 4, 2, 2, 1, 0, 0};
  std::vector<double> w = {1.0, 0.5, 2.0, 0.25, 1.0, 0.75, 1.5, 0.3};
};

TEST(CrossEntropy, GradientByFiniteDifferences) {
  std::mt19937_64 rng(11);
  const CeCase c;
  const double dloss = 0.7;
  std::vector<double> logits = randn(rng, c.N * c.V, 2.0), lse(c.N);
  auto objective = [&] {
    return dloss * cross_entropy_forward(lse.data(), logits.data(), c.src.data(), c.tok.data(), c.w.data(),
                                         (int)c.src.size(), c.N, c.V);
  };
  objective();
  std::vector<double> dlogits(c.N * c.V, 1e30);  // overwritten
  cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), c.src.data(), c.tok.data(), c.w.data(),
                         (int)c.src.size(), c.N, c.V, dloss);
  for (int row : {0, 3, 6}) {
    for (int v = 0; v < c.V; v++) EXPECT_EQ(dlogits[row * c.V + v], 0.0) << "row " << row;
  }
  check_gradient("dlogits", &logits, dlogits, objective);
}

TEST(CrossEntropy, LossMatchesDirectFormula) {
  std::mt19937_64 rng(12);
  const CeCase c;
  const std::vector<double> logits = randn(rng, c.N * c.V, 2.0);
  std::vector<double> lse(c.N);
  const double loss = cross_entropy_forward(lse.data(), logits.data(), c.src.data(), c.tok.data(), c.w.data(),
                                            (int)c.src.size(), c.N, c.V);
  double ref = 0;
  for (size_t t = 0; t < c.src.size(); t++) {
    const double* row = logits.data() + c.src[t] * c.V;
    double z = 0;
    for (int v = 0; v < c.V; v++) z += std::exp(row[v]);
    ref += c.w[t] * (std::log(z) - row[c.tok[t]]);
  }
  // O(1) logits: the unshifted reference is accurate to a few ulps per term.
  EXPECT_NEAR(loss, ref, 1e-13 * std::fabs(ref));
}

TEST(CrossEntropy, StableForLargeLogits) {
  const std::vector<double> logits = {1000.0, 1000.0};
  const std::vector<int32_t> src = {0}, tok = {1};
  const std::vector<double> w = {1.0};
  std::vector<double> lse(1);
  const double loss = cross_entropy_forward(lse.data(), logits.data(), src.data(), tok.data(), w.data(), 1, 1, 2);
  // lse = 1000 + log 2 is rounded at ulp(1000) ~ 1.1e-13, the rest is exact.
  EXPECT_NEAR(loss, std::log(2.0), 2.5e-13);
}

TEST(CrossEntropy, RejectsBadIndices) {
  const std::vector<double> logits(6), w = {1.0};
  std::vector<double> lse(2), dlogits(6);
  const std::vector<int32_t> ok = {0}, bad_src = {2}, bad_tok = {3}, negative = {-1};
  EXPECT_THROW(cross_entropy_forward(lse.data(), logits.data(), bad_src.data(), ok.data(), w.data(), 1, 2, 3),
               tt::Error);
  EXPECT_THROW(cross_entropy_forward(lse.data(), logits.data(), ok.data(), bad_tok.data(), w.data(), 1, 2, 3),
               tt::Error);
  EXPECT_THROW(cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), negative.data(), ok.data(),
                                      w.data(), 1, 2, 3, 1.0),
               tt::Error);
}

TEST(AdamW, TwoStepsMatchHandComputation) {
  // lr 0.1, betas (0.9, 0.99), eps 1e-8, wd 0.1, grad_scale 2; param 1, grads 0.5 then -0.25.
  // Step 1: g = 1. param = 0.99; m = 0.1; v = 0.01; m/(1-0.9) = 1, v/(1-0.99) = 1;
  //         param = 0.99 - 0.1 * 1 / (1 + 1e-8).
  // Step 2: g = -0.5. param *= 0.99; m = 0.09 - 0.05 = 0.04; v = 0.0099 + 0.0025 = 0.0124;
  //         param -= 0.1 * (0.04 / 0.19) / (sqrt(0.0124 / 0.0199) + 1e-8).
  AdamWParams p;
  p.lr = 0.1;
  p.beta1 = 0.9;
  p.beta2 = 0.99;
  p.eps = 1e-8;
  p.weight_decay = 0.1;
  p.grad_scale = 2.0;
  double param = 1.0, m = 0.0, v = 0.0;
  const double g1 = 0.5, g2 = -0.25;
  p.step = 1;
  adamw_update(&param, &g1, &m, &v, 1, p);
  // The decimal constants (0.99, 1 - 0.9, ...) are rounded in binary and the op evaluates the
  // same formula in another order: agreement to a few ulps, 1e-14 relative.
  const double tol = 1e-14;
  const double after1 = 0.99 - 0.1 / (1 + 1e-8);
  EXPECT_NEAR(param, after1, tol * after1);
  EXPECT_NEAR(m, 0.1, tol * 0.1);
  EXPECT_NEAR(v, 0.01, tol * 0.01);
  p.step = 2;
  adamw_update(&param, &g2, &m, &v, 1, p);
  const double after2 = after1 * 0.99 - 0.1 * (0.04 / 0.19) / (std::sqrt(0.0124 / 0.0199) + 1e-8);
  EXPECT_NEAR(param, after2, tol * after2);
  EXPECT_NEAR(m, 0.04, tol * 0.04);
  EXPECT_NEAR(v, 0.0124, tol * 0.0124);
  // The same steps in float (m, v, param rounded to float between steps) agree to ~1e-7.
  float pf = 1.0f, mf = 0.f, vf = 0.f;
  const float g1f = 0.5f, g2f = -0.25f;
  p.step = 1;
  adamw_update(&pf, &g1f, &mf, &vf, 1, p);
  p.step = 2;
  adamw_update(&pf, &g2f, &mf, &vf, 1, p);
  EXPECT_NEAR(pf, after2, 1e-6);
}

TEST(AdamW, RejectsStepZero) {
  AdamWParams p;
  p.step = 0;
  double x = 0, g = 0, m = 0, v = 0;
  EXPECT_THROW(adamw_update(&x, &g, &m, &v, 1, p), tt::Error);
}

TEST(SumSquares, ExactOnIntegers) {
  // 1^2 + ... + n^2 = n(n+1)(2n+1)/6 ~ 3.3e14 < 2^53: every partial sum is exact, over many blocks.
  const int64_t n = 100000;
  std::vector<float> xf(n);
  std::vector<double> xd(n);
  for (int64_t i = 0; i < n; i++) xf[i] = xd[i] = (double)(i + 1);
  const double expected = (double)(n * (n + 1) * (2 * n + 1) / 6);
  EXPECT_EQ(sum_squares(xf.data(), n), expected);
  EXPECT_EQ(sum_squares(xd.data(), n), expected);
  EXPECT_EQ(sum_squares(xd.data(), 0), 0.0);
}

// Retrieval on a pool that keeps the long-range heads only (heads 0 and 2 of 4, non-contiguous):
// the selection equals a brute-force ranking of q . k over each head's query group (ties to the
// lower row), and the gather puts slot pool_slot(heads, g) of each selected row at head g, zeros
// at the local heads.
TEST(Retrieval, CompactPoolSelectsAndGathersTheLongRangeHeads) {
  const int P = 40, NH = 8, NKV = 4, HS = 6, R = 7, NL = 2, G = NH / NKV;
  const uint64_t heads = 0b0101;
  const int slot_of[NKV] = {0, -1, 1, -1};
  EXPECT_EQ(pool_slot(heads, 0), 0);
  EXPECT_EQ(pool_slot(heads, 2), 1);
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<int> small(-3, 3);  // integers: exact scores, many ties
  std::vector<double> q((size_t)NH * HS), pool((size_t)P * NL * HS);
  for (double& x : q) x = small(rng);
  for (double& x : pool) x = small(rng);
  std::vector<int32_t> idx((size_t)NKV * R);
  retrieval_select<double>(idx.data(), q.data(), pool.data(), P, NH, NKV, HS, heads, R);
  for (int g = 0; g < NKV; ++g) {
    std::vector<int32_t> want(R, -1);
    if (slot_of[g] >= 0) {
      std::vector<std::pair<double, int>> ranked;
      for (int j = 0; j < P; ++j) {
        double sc = 0;
        for (int h = g * G; h < (g + 1) * G; ++h)
          for (int d = 0; d < HS; ++d) sc += q[(size_t)h * HS + d] * pool[((size_t)j * NL + slot_of[g]) * HS + d];
        ranked.push_back({-sc, j});  // ascending: the highest score first, then the lower row
      }
      std::sort(ranked.begin(), ranked.end());
      for (int r = 0; r < R; ++r) want[r] = ranked[r].second;
      std::sort(want.begin(), want.end());
    }
    EXPECT_EQ(std::vector<int32_t>(idx.begin() + (size_t)g * R, idx.begin() + (size_t)(g + 1) * R), want)
        << "KV head " << g;
  }
  std::vector<double> out((size_t)R * NKV * HS, 99.0);
  retrieval_gather<double>(out.data(), pool.data(), idx.data(), R, NKV, HS, heads);
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < NKV; ++g)
      for (int d = 0; d < HS; ++d) {
        const double want =
            slot_of[g] >= 0 ? pool[((size_t)idx[(size_t)g * R + r] * NL + slot_of[g]) * HS + d] : 0.0;
        EXPECT_EQ(out[((size_t)r * NKV + g) * HS + d], want) << "row " << r << " head " << g << " d " << d;
      }
}

}  // namespace
}  // namespace tt::cpu
