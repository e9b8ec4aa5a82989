// The fused q/k norm + rotary embedding (cuda::qk_norm_rope_*) vs the CPU reference of the two ops
// one after the other (fp64), at deep positions, head dims 64 / 128 / 256, row counts that leave a
// block or a chunk partly filled; and the rope table against the values rope_forward uses.
//
// Bounds (see test_util.h and rmsnorm_test.cc / rope_test.cc; y the reference norm output, g the
// reference rotated-back gradient, e_d = 6 u32 (|g_d| + |g_{d+HS/2}|) the rotation's fp32 error):
//   out:  one bf16 rounding of the rotated y: rel 2^-8, abs (2 (d_r + 3 u32) + 6 u32)
//         (|y_d| + |y_{d+HS/2}|)
//   dx:   rmsnorm's dx bound on g, plus 2 (r |w_c| e_c + r^3 |x_c| sum_k |w_k x_k| e_k / C)
//   dw:   rmsnorm's dw bound on g, plus 2 sum_rows r |x_c| e_c.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ops/cpu/rmsnorm.h"
#include "ops/cpu/rope.h"
#include "ops/cuda/rmsnorm.h"
#include "ops/cuda/rope.h"
#include "tests/ops_cuda/test_util.h"

namespace tt::cuda_test {
namespace {

struct Shape {
  int N, H, HS;
  double theta;
  std::string name;
};

class QkNormRopeTest : public GpuTest, public ::testing::WithParamInterface<Shape> {};

constexpr double kEps = 1e-6;

double rstd_rel(int C) { return (std::max(C / 32.0, 8.0) + 8) * kF32U + std::ldexp(1.0, -21); }

// The inputs of one case: x (N, H, HS), w (HS), positions 0, 1, 2 then deep ones, the rope table.
struct Case {
  int N, H, HS, rows;
  double theta;
  std::vector<double> x, w;
  std::vector<int32_t> pos;
  DeviceBuffer<bf16> d_x, d_w;
  DeviceBuffer<int32_t> d_pos;
  DeviceBuffer<float2> cs;
  Case(const Shape& s, uint64_t seed) : N(s.N), H(s.H), HS(s.HS), rows(s.N * s.H), theta(s.theta) {
    std::mt19937_64 rng(seed + N + HS);
    x = randn_bf16(rng, (size_t)rows * HS, 2.0);
    w = randn_bf16(rng, HS, 1.0);
    pos.resize(N);
    std::uniform_int_distribution<int> pd(0, 40000);
    for (int n = 0; n < N; n++) pos[n] = n < 3 ? n : pd(rng);
    d_x = to_device_bf16(x);
    d_w = to_device_bf16(w);
    d_pos = to_device(pos);
    cs = DeviceBuffer<float2>((size_t)N * (HS / 2));
    tt::cuda::rope_table(cs.data(), d_pos.data(), N, HS, theta, nullptr);
    sync_and_check();
  }
};

TEST_P(QkNormRopeTest, TableHoldsTheAnglesRopeUses) {
  Case c(GetParam(), 11);
  // Rotating e_d (1 at d) by rope_forward gives cos at d and sin at d + HS/2 (as bf16: compare the
  // table rounded to bf16).
  const int half = c.HS / 2;
  std::vector<double> unit((size_t)c.N * c.HS, 0.0);
  for (int n = 0; n < c.N; n++) unit[(size_t)n * c.HS + 1] = 1.0;
  auto d_unit = to_device_bf16(unit);
  tt::cuda::rope_forward(d_unit.data(), c.d_pos.data(), c.N, 1, c.HS, c.theta, nullptr);
  sync_and_check();
  const auto rotated = to_host(d_unit);
  std::vector<float2> table(c.cs.size());
  c.cs.copy_to_host(table.data(), table.size());
  std::vector<double> tc, ts, rc, rs;
  const int slot = tt::cuda::rope_table_slot(1, c.HS);
  for (int n = 0; n < c.N; n++) {
    const float2 t = table[(size_t)n * half + slot];
    tc.push_back(round_bf16({t.x})[0]);
    ts.push_back(round_bf16({t.y})[0]);
    rc.push_back(rotated[(size_t)n * c.HS + 1]);
    rs.push_back(rotated[(size_t)n * c.HS + 1 + half]);
    const double a = c.pos[n] * std::pow(c.theta, -2.0 * 1 / c.HS);
    EXPECT_NEAR(t.x, std::cos(a), 2 * kF32U) << "position " << c.pos[n];
    EXPECT_NEAR(t.y, std::sin(a), 2 * kF32U) << "position " << c.pos[n];
  }
  // Every angle has its own slot.
  std::vector<int> seen(half, 0);
  for (int d = 0; d < half; d++) seen.at(tt::cuda::rope_table_slot(d, c.HS))++;
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), half);
  EXPECT_TRUE(all_equal("cos", rc, tc));
  EXPECT_TRUE(all_equal("sin", rs, ts));
}

// Zero-centred weights (w_offset 1, Qwen3.5's): the reference norm scales by w + 1 exactly.
void expect_forward_matches(const Case& c, double w_offset) {
  const int C = c.HS, half = C / 2;
  std::vector<double> w = c.w;
  for (double& v : w) v += w_offset;
  std::vector<double> ref((size_t)c.rows * C), rstd_ref(c.rows);
  tt::cpu::rmsnorm_forward<double>(ref.data(), rstd_ref.data(), c.x.data(), w.data(), c.rows, C, kEps);
  const std::vector<double> y = ref;  // before the rotation
  tt::cpu::rope_forward<double>(ref.data(), c.pos.data(), c.N, c.H, C, c.theta);
  DeviceBuffer<bf16> out((size_t)c.rows * C);
  DeviceBuffer<float> rstd(c.rows);
  poison(out);
  poison(rstd);
  tt::cuda::qk_norm_rope_forward(out.data(), rstd.data(), c.d_x.data(), c.d_w.data(), c.cs.data(), c.N, c.H, C, kEps,
                                 nullptr, w_offset);
  sync_and_check();
  const double dr = rstd_rel(C);
  std::vector<double> abs_out(ref.size()), abs_r(c.rows);
  for (int64_t r = 0; r < c.rows; r++) {
    abs_r[r] = 2 * dr * rstd_ref[r];
    for (int d = 0; d < half; d++) {
      const double m = std::fabs(y[r * C + d]) + std::fabs(y[r * C + d + half]);
      abs_out[r * C + d] = abs_out[r * C + d + half] = (2 * (dr + 3 * kF32U) + 6 * kF32U) * m;
    }
  }
  EXPECT_TRUE(all_within(w_offset ? "out (w + 1)" : "out", to_host(out), ref, kBf16U, abs_out));
  EXPECT_TRUE(all_within("rstd", to_host(rstd), rstd_ref, 0.0, abs_r));
}

TEST_P(QkNormRopeTest, ForwardMatchesCpu) {
  const Case c(GetParam(), 21);
  expect_forward_matches(c, 0.0);
  expect_forward_matches(c, 1.0);
}

TEST_P(QkNormRopeTest, BackwardMatchesCpuAndIsDeterministic) {
  Case c(GetParam(), 31);
  const int C = c.HS, half = C / 2, rows = c.rows;
  std::mt19937_64 rng(41 + rows);
  const auto dout = randn_bf16(rng, (size_t)rows * C, 1.0);
  const auto dx0 = randn_bf16(rng, (size_t)rows * C, 0.1);
  const auto dw0 = randn_f32(rng, C, 0.1);

  std::vector<double> tmp((size_t)rows * C), rstd_ref(rows);
  tt::cpu::rmsnorm_forward<double>(tmp.data(), rstd_ref.data(), c.x.data(), c.w.data(), rows, C, kEps);
  std::vector<double> g = dout;
  tt::cpu::rope_backward<double>(g.data(), c.pos.data(), c.N, c.H, C, c.theta);
  std::vector<double> dx_ref = dx0, dw_ref = dw0;
  tt::cpu::rmsnorm_backward<double>(dx_ref.data(), dw_ref.data(), g.data(), c.x.data(), c.w.data(), rstd_ref.data(),
                                    rows, C);

  DeviceBuffer<float> rstd(rows);
  DeviceBuffer<bf16> out((size_t)rows * C);
  tt::cuda::qk_norm_rope_forward(out.data(), rstd.data(), c.d_x.data(), c.d_w.data(), c.cs.data(), c.N, c.H, C, kEps,
                                 nullptr);
  auto d_dout = to_device_bf16(dout);
  DeviceBuffer<char> ws(tt::cuda::rmsnorm_backward_workspace_bytes(rows, C));
  auto run = [&](bf16* dx, float* dw, bool accumulate) {
    tt::cuda::qk_norm_rope_backward(dx, dw, d_dout.data(), c.d_x.data(), c.d_w.data(), rstd.data(), c.cs.data(), c.N,
                                    c.H, C, {ws.data(), ws.size()}, nullptr, accumulate);
    sync_and_check();
  };
  std::vector<double> dx_first, dw_first;
  for (int rep = 0; rep < 2; rep++) {
    auto dx = to_device_bf16(dx0);
    auto dw = to_device_f32(dw0);
    run(dx.data(), dw.data(), true);
    if (rep == 0) {
      dx_first = to_host(dx);
      dw_first = to_host(dw);
    } else {
      EXPECT_TRUE(all_equal("dx repeat", to_host(dx), dx_first));
      EXPECT_TRUE(all_equal("dw repeat", to_host(dw), dw_first));
    }
  }

  const double dr = rstd_rel(C);
  std::vector<double> e(g.size());  // the rotation's error on g
  for (int64_t r = 0; r < rows; r++)
    for (int d = 0; d < half; d++)
      e[r * C + d] = e[r * C + d + half] = 6 * kF32U * (std::fabs(g[r * C + d]) + std::fabs(g[r * C + d + half]));
  std::vector<double> abs_dx(g.size()), abs_dw(C, 0.0), abs_dw_e(C, 0.0);
  for (int64_t r = 0; r < rows; r++) {
    const double rs = rstd_ref[r];
    double sabs = 0, seabs = 0;
    for (int k = 0; k < C; k++) {
      sabs += std::fabs(g[r * C + k] * c.w[k] * c.x[r * C + k]);
      seabs += std::fabs(c.w[k] * c.x[r * C + k]) * e[r * C + k];
    }
    for (int k = 0; k < C; k++) {
      const size_t i = (size_t)r * C + k;
      const double T = rs * std::fabs(g[i] * c.w[k]) + rs * rs * rs * std::fabs(c.x[i]) * sabs / C;
      const double E = rs * std::fabs(c.w[k]) * e[i] + rs * rs * rs * std::fabs(c.x[i]) * seabs / C;
      abs_dx[i] = 2 * (3 * dr + (std::max(C / 32.0, 8.0) + 8) * kF32U) * T + 2 * E + kF32U * std::fabs(dx0[i]);
      abs_dw[k] += std::fabs(g[i] * c.x[i] * rs);
      abs_dw_e[k] += std::fabs(c.x[i] * rs) * e[i];
    }
  }
  for (int k = 0; k < C; k++)
    abs_dw[k] = 2 * (dr + (rows + 48) * kF32U) * abs_dw[k] + 2 * abs_dw_e[k] + kF32U * std::fabs(dw0[k]);
  EXPECT_TRUE(all_within("dx", dx_first, dx_ref, kBf16U, abs_dx));
  EXPECT_TRUE(all_within("dw", dw_first, dw_ref, kF32U, abs_dw));

  // Either gradient alone; dx overwritten (a poisoned buffer) is the sum into zeros.
  auto dx_only = to_device_bf16(dx0);
  run(dx_only.data(), nullptr, true);
  auto dw_only = to_device_f32(dw0);
  run(nullptr, dw_only.data(), true);
  EXPECT_TRUE(all_equal("dx alone", to_host(dx_only), dx_first));
  EXPECT_TRUE(all_equal("dw alone", to_host(dw_only), dw_first));
  DeviceBuffer<bf16> dx_zero((size_t)rows * C), dx_over((size_t)rows * C);
  dx_zero.fill_bytes(0, nullptr);
  poison(dx_over);
  run(dx_zero.data(), nullptr, true);
  run(dx_over.data(), nullptr, false);
  EXPECT_TRUE(all_equal("dx overwritten", to_host(dx_over), to_host(dx_zero)));
}

// The pair (q heads and k heads in one launch) equals the two single calls bit for bit, and with a
// cache store puts each position's k and v rows at its cache row (the other rows untouched).
TEST_P(QkNormRopeTest, PairEqualsTwoCallsAndStoresTheCacheRows) {
  const Shape sh = GetParam();
  Case q(sh, 21);
  const int NKV = std::max(1, sh.H / 2), C = sh.HS, N = sh.N;
  std::mt19937_64 rng(5);  // the k heads at q's positions (one rope table)
  auto d_kx = to_device_bf16(randn_bf16(rng, (size_t)N * NKV * C, 2.0));
  auto d_kw = to_device_bf16(randn_bf16(rng, C));
  const auto v = randn_bf16(rng, (size_t)N * NKV * C);
  auto d_v = to_device_bf16(v);
  const int cache_rows = 2 * N + 3;
  std::vector<int32_t> rows(N);
  for (int n = 0; n < N; n++) rows[n] = 2 * (N - 1 - n) + 1;  // reversed, every other row
  auto d_rows = to_device(rows);
  for (double off : {0.0, 1.0}) {
    SCOPED_TRACE(off);
    DeviceBuffer<bf16> q1((size_t)N * sh.H * C), k1((size_t)N * NKV * C), q2(q1.size()), k2(k1.size());
    DeviceBuffer<float> qr1((size_t)N * sh.H), kr1((size_t)N * NKV), qr2(qr1.size()), kr2(kr1.size());
    DeviceBuffer<bf16> ck((size_t)cache_rows * NKV * C), cv(ck.size());
    for (auto* b : {&q1, &k1, &q2, &k2, &ck, &cv}) poison(*b);
    for (auto* b : {&qr1, &kr1, &qr2, &kr2}) poison(*b);
    tt::cuda::qk_norm_rope_forward(q1.data(), qr1.data(), q.d_x.data(), q.d_w.data(), q.cs.data(), N, sh.H, C, kEps,
                                   nullptr, off);
    tt::cuda::qk_norm_rope_forward(k1.data(), kr1.data(), d_kx.data(), d_kw.data(), q.cs.data(), N, NKV, C, kEps,
                                   nullptr, off);
    tt::cuda::qk_norm_rope_pair(q2.data(), qr2.data(), q.d_x.data(), q.d_w.data(), sh.H, k2.data(), kr2.data(),
                                d_kx.data(), d_kw.data(), NKV, q.cs.data(), N, C, kEps, off, d_v.data(), ck.data(),
                                cv.data(), d_rows.data(), nullptr);
    sync_and_check();
    EXPECT_TRUE(all_equal("q", to_host(q2), to_host(q1)));
    EXPECT_TRUE(all_equal("k", to_host(k2), to_host(k1)));
    EXPECT_TRUE(all_equal("q rstd", to_host(qr2), to_host(qr1)));
    EXPECT_TRUE(all_equal("k rstd", to_host(kr2), to_host(kr1)));
    const std::vector<double> kk = to_host(k1), hk = to_host(ck), hv = to_host(cv);
    const size_t row = (size_t)NKV * C;
    std::vector<bool> stored(cache_rows, false);
    for (int n = 0; n < N; n++) {
      stored[rows[n]] = true;
      for (size_t i = 0; i < row; i++) {
        ASSERT_EQ(hk[rows[n] * row + i], kk[n * row + i]) << "k of position " << n;
        ASSERT_EQ(hv[rows[n] * row + i], v[n * row + i]) << "v of position " << n;
      }
    }
    for (int r = 0; r < cache_rows; r++)
      if (!stored[r])
        for (size_t i = 0; i < row; i++) ASSERT_TRUE(std::isnan(hk[r * row + i]) && std::isnan(hv[r * row + i]));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, QkNormRopeTest,
                         ::testing::Values(Shape{37, 16, 128, 1e6, "hs128_q_heads"},
                                           Shape{301, 8, 128, 1e6, "hs128_kv_heads_many_chunks"},
                                           Shape{50, 8, 64, 1e4, "hs64"}, Shape{9, 3, 256, 1e4, "hs256_three_heads"},
                                           Shape{1, 1, 64, 1e4, "single_row"}),
                         [](const ::testing::TestParamInfo<Shape>& info) { return info.param.name; });

TEST_F(GpuTest, QkNormRopeRejectsBadInput) {
  DeviceBuffer<bf16> a(4 * 2 * 96);
  DeviceBuffer<float> r(8);
  DeviceBuffer<float2> cs(4 * 48);
  try {
    tt::cuda::qk_norm_rope_forward(a.data(), r.data(), a.data(), a.data(), cs.data(), 4, 2, 96, kEps, nullptr);
    FAIL() << "head dim 96 accepted";
  } catch (const tt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("head dim 96 not supported, expected 64, 128 or 256"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(tt::cuda::qk_norm_rope_forward(a.data(), r.data(), a.data(), a.data(), nullptr, 4, 2, 64, kEps, nullptr),
               tt::Error);
  EXPECT_THROW(tt::cuda::qk_norm_rope_backward(a.data() + 1, nullptr, a.data(), a.data(), a.data(), r.data(),
                                               cs.data(), 4, 2, 64, {}, nullptr),
               tt::Error);  // misaligned dx
  EXPECT_THROW(tt::cuda::rope_table(cs.data(), nullptr, 4, 64, 1e4, nullptr), tt::Error);
  DeviceBuffer<int32_t> pos(4);
  EXPECT_THROW(tt::cuda::rope_table(cs.data(), pos.data(), 4, 40, 1e4, nullptr), tt::Error);  // HS not 16k
}

}  // namespace
}  // namespace tt::cuda_test
