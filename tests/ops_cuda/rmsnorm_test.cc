// RMSNorm forward/backward vs the CPU reference (fp64), hidden-size and q/k-norm shapes, row
// counts that are not multiples of the block, C not a multiple of the vector width.
//
// Bounds (see test_util.h). fp32 on the GPU: the sum of squares runs C/32 sequential adds per lane
// plus a 5-level tree, so rstd has relative error d_r <= (C/32 + 8) u32 + 2^-21 (rsqrtf).
//   out:  bf16 of x r w:           rel 2^-8, abs 2 (d_r + 3 u32) |ref|
//   rstd: fp32:                    abs 2 d_r |ref|
//   dx:   bf16 of old + r (dout w - x r^2 dot / C); with T = r |dout w| + r^3 |x| sum|dout w x| / C
//         and dot accumulated like the sum of squares: abs 2 (3 d_r + (C/32 + 8) u32) T + u32 |old|
//   dw:   fp32 old + sum_rows dout x r: at most rows + 48 sequential adds (stage 1 chunk rows,
//         in-block lanes, stage 2 chunks and lanes): abs 2 (d_r + (rows + 48) u32) sum|dout x r|.
#include "ops/cuda/rmsnorm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ops/cpu/rmsnorm.h"
#include "tests/ops_cuda/test_util.h"

namespace tt::cuda_test {
namespace {

struct Shape {
  int rows, C;
  std::string name;
};

class RmsnormTest : public GpuTest, public ::testing::WithParamInterface<Shape> {};

constexpr double kEps = 1e-6;

double rstd_rel(int C) { return (C / 32.0 + 8) * kF32U + std::ldexp(1.0, -21); }

TEST_P(RmsnormTest, ForwardMatchesCpu) {
  const auto [rows, C, name] = GetParam();
  std::mt19937_64 rng(101 + rows + C);
  const auto x = randn_bf16(rng, (size_t)rows * C, 2.0);
  const auto w = randn_bf16(rng, C, 1.0);
  std::vector<double> out_ref((size_t)rows * C), rstd_ref(rows);
  tt::cpu::rmsnorm_forward<double>(out_ref.data(), rstd_ref.data(), x.data(), w.data(), rows, C, kEps);
  auto d_x = to_device_bf16(x);
  auto d_w = to_device_bf16(w);
  DeviceBuffer<bf16> out((size_t)rows * C);
  DeviceBuffer<float> rstd(rows);
  poison(out);
  poison(rstd);
  tt::cuda::rmsnorm_forward(out.data(), rstd.data(), d_x.data(), d_w.data(), rows, C, kEps, nullptr);
  sync_and_check();
  const double dr = rstd_rel(C);
  std::vector<double> abs_out(out_ref.size()), abs_r(rows);
  for (size_t i = 0; i < out_ref.size(); i++) abs_out[i] = 2 * (dr + 3 * kF32U) * std::fabs(out_ref[i]);
  for (int r = 0; r < rows; r++) abs_r[r] = 2 * dr * rstd_ref[r];
  EXPECT_TRUE(all_within("out", to_host(out), out_ref, kBf16U, abs_out));
  EXPECT_TRUE(all_within("rstd", to_host(rstd), rstd_ref, 0.0, abs_r));
}

TEST_P(RmsnormTest, BackwardMatchesCpuAndIsDeterministic) {
  const auto [rows, C, name] = GetParam();
  std::mt19937_64 rng(202 + rows + C);
  const auto x = randn_bf16(rng, (size_t)rows * C, 2.0);
  const auto w = randn_bf16(rng, C, 1.0);
  const auto dout = randn_bf16(rng, (size_t)rows * C, 1.0);
  const auto dx0 = randn_bf16(rng, (size_t)rows * C, 0.1);
  const auto dw0 = randn_f32(rng, C, 0.1);
  std::vector<double> out_ref((size_t)rows * C), rstd_ref(rows);
  tt::cpu::rmsnorm_forward<double>(out_ref.data(), rstd_ref.data(), x.data(), w.data(), rows, C, kEps);
  std::vector<double> dx_ref = dx0, dw_ref = dw0;
  tt::cpu::rmsnorm_backward<double>(dx_ref.data(), dw_ref.data(), dout.data(), x.data(), w.data(), rstd_ref.data(),
                                    rows, C);

  auto d_x = to_device_bf16(x);
  auto d_w = to_device_bf16(w);
  auto d_dout = to_device_bf16(dout);
  DeviceBuffer<bf16> out((size_t)rows * C);
  DeviceBuffer<float> rstd(rows);
  tt::cuda::rmsnorm_forward(out.data(), rstd.data(), d_x.data(), d_w.data(), rows, C, kEps, nullptr);
  DeviceBuffer<char> ws(tt::cuda::rmsnorm_backward_workspace_bytes(rows, C));
  std::vector<double> dx_first, dw_first;
  for (int rep = 0; rep < 2; rep++) {
    auto dx = to_device_bf16(dx0);
    auto dw = to_device_f32(dw0);
    tt::cuda::rmsnorm_backward(dx.data(), dw.data(), d_dout.data(), d_x.data(), d_w.data(), rstd.data(), rows, C,
                               {ws.data(), ws.size()}, nullptr);
    sync_and_check();
    if (rep == 0) {
      dx_first = to_host(dx);
      dw_first = to_host(dw);
    } else {
      EXPECT_TRUE(all_equal("dx repeat", to_host(dx), dx_first));
      EXPECT_TRUE(all_equal("dw repeat", to_host(dw), dw_first));
    }
  }
  const double dr = rstd_rel(C);
  std::vector<double> abs_dx(dx_ref.size()), abs_dw(C, 0.0);
  for (int r = 0; r < rows; r++) {
    const double rs = rstd_ref[r];
    double sabs = 0;
    for (int c = 0; c < C; c++) sabs += std::fabs(dout[(size_t)r * C + c] * w[c] * x[(size_t)r * C + c]);
    for (int c = 0; c < C; c++) {
      const size_t i = (size_t)r * C + c;
      const double T = rs * std::fabs(dout[i] * w[c]) + rs * rs * rs * std::fabs(x[i]) * sabs / C;
      abs_dx[i] = 2 * (3 * dr + (C / 32.0 + 8) * kF32U) * T + kF32U * std::fabs(dx0[i]);
      abs_dw[c] += std::fabs(dout[i] * x[i] * rs);
    }
  }
  for (int c = 0; c < C; c++) abs_dw[c] = 2 * (dr + (rows + 48) * kF32U) * abs_dw[c] + kF32U * std::fabs(dw0[c]);
  EXPECT_TRUE(all_within("dx", dx_first, dx_ref, kBf16U, abs_dx));
  EXPECT_TRUE(all_within("dw", dw_first, dw_ref, kF32U, abs_dw));

  // Either gradient alone.
  auto dx_only = to_device_bf16(dx0);
  tt::cuda::rmsnorm_backward(dx_only.data(), nullptr, d_dout.data(), d_x.data(), d_w.data(), rstd.data(), rows, C,
                             {}, nullptr);
  auto dw_only = to_device_f32(dw0);
  tt::cuda::rmsnorm_backward(nullptr, dw_only.data(), d_dout.data(), d_x.data(), d_w.data(), rstd.data(), rows, C,
                             {ws.data(), ws.size()}, nullptr);
  sync_and_check();
  EXPECT_TRUE(all_equal("dx alone", to_host(dx_only), dx_first));
  EXPECT_TRUE(all_equal("dw alone", to_host(dw_only), dw_first));
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsnormTest,
                         ::testing::Values(Shape{37, 2048, "hidden_2048_odd_rows"},
                                           Shape{1024, 128, "qk_norm_rows_n_times_heads"},
                                           Shape{5000, 128, "qk_norm_many_rows"}, Shape{13, 100, "c_not_multiple_of_8"},
                                           Shape{3, 8, "tiny"}, Shape{1, 5120, "single_row_c_5120"}),
                         [](const ::testing::TestParamInfo<Shape>& info) { return info.param.name; });

TEST_F(GpuTest, RmsnormBackwardRejectsSmallWorkspace) {
  DeviceBuffer<bf16> a(64 * 32);
  DeviceBuffer<float> dw(32), r(64);
  EXPECT_THROW(tt::cuda::rmsnorm_backward(nullptr, dw.data(), a.data(), a.data(), a.data(), r.data(), 64, 32,
                                          {nullptr, 0}, nullptr),
               tt::Error);
}

}  // namespace
}  // namespace tt::cuda_test
