// RMSNorm forward/backward vs the CPU reference (fp64), hidden-size and q/k-norm shapes, row
// counts that are not multiples of the block, C not a multiple of the vector width.
//
// Bounds (see test_util.h). fp32 on the GPU: the sum of squares runs C/32 sequential adds per lane
// plus a 5-level tree (rows of C < 256 share a warp: at most 8 adds per lane and fewer levels), so
// rstd has relative error d_r <= (max(C/32, 8) + 8) u32 + 2^-21 (rsqrtf).
//   out:  bf16 of x r w:           rel 2^-8, abs 2 (d_r + 3 u32) |ref|
//   rstd: fp32:                    abs 2 d_r |ref|
//   dx:   bf16 of old + r (dout w - x r^2 dot / C); with T = r |dout w| + r^3 |x| sum|dout w x| / C
//         and dot accumulated like the sum of squares: abs 2 (3 d_r + (max(C/32, 8) + 8) u32) T + u32 |old|
//   dw:   fp32 old + sum_rows dout x r: at most rows + 48 sequential adds (a chunk's rows per lane,
//         the lane groups and warps of a block, stage 2 chunks and lanes):
//         abs 2 (d_r + (rows + 48) u32) sum|dout x r|. dout may be fp32 (not rounded to bf16).
#include "ops/cuda/rmsnorm.h"

#include <gtest/gtest.h>

#include <algorithm>
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

double rstd_rel(int C) { return (std::max(C / 32.0, 8.0) + 8) * kF32U + std::ldexp(1.0, -21); }

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

// The backward's reference and bounds for dout (bf16 or fp32 values), given dx0 / dw0 accumulated
// into; checks dx and dw from the GPU.
void expect_backward_matches(int rows, int C, const std::vector<double>& x, const std::vector<double>& w,
                             const std::vector<double>& dout, const std::vector<double>& dx0,
                             const std::vector<double>& dw0, const std::vector<double>& dx,
                             const std::vector<double>& dw) {
  std::vector<double> out_ref((size_t)rows * C), rstd_ref(rows);
  tt::cpu::rmsnorm_forward<double>(out_ref.data(), rstd_ref.data(), x.data(), w.data(), rows, C, kEps);
  std::vector<double> dx_ref = dx0, dw_ref = dw0;
  tt::cpu::rmsnorm_backward<double>(dx_ref.data(), dw_ref.data(), dout.data(), x.data(), w.data(), rstd_ref.data(),
                                    rows, C);
  const double dr = rstd_rel(C);
  std::vector<double> abs_dx(dx_ref.size()), abs_dw(C, 0.0);
  for (int r = 0; r < rows; r++) {
    const double rs = rstd_ref[r];
    double sabs = 0;
    for (int c = 0; c < C; c++) sabs += std::fabs(dout[(size_t)r * C + c] * w[c] * x[(size_t)r * C + c]);
    for (int c = 0; c < C; c++) {
      const size_t i = (size_t)r * C + c;
      const double T = rs * std::fabs(dout[i] * w[c]) + rs * rs * rs * std::fabs(x[i]) * sabs / C;
      abs_dx[i] = 2 * (3 * dr + (std::max(C / 32.0, 8.0) + 8) * kF32U) * T + kF32U * std::fabs(dx0[i]);
      abs_dw[c] += std::fabs(dout[i] * x[i] * rs);
    }
  }
  for (int c = 0; c < C; c++) abs_dw[c] = 2 * (dr + (rows + 48) * kF32U) * abs_dw[c] + kF32U * std::fabs(dw0[c]);
  EXPECT_TRUE(all_within("dx", dx, dx_ref, kBf16U, abs_dx));
  EXPECT_TRUE(all_within("dw", dw, dw_ref, kF32U, abs_dw));
}

// Random backward inputs (dout as bf16 values, or as fp32 values bf16 cannot hold) and the
// forward's rstd on the GPU.
struct BackwardCase {
  std::vector<double> x, w, dout, dx0, dw0;
  DeviceBuffer<bf16> d_x, d_w;
  DeviceBuffer<float> rstd;
  BackwardCase(int rows, int C, uint64_t seed, bool fp32_dout) {
    std::mt19937_64 rng(seed + rows + C);
    x = randn_bf16(rng, (size_t)rows * C, 2.0);
    w = randn_bf16(rng, C, 1.0);
    dout = fp32_dout ? randn_f32(rng, (size_t)rows * C, 1.0) : randn_bf16(rng, (size_t)rows * C, 1.0);
    dx0 = randn_bf16(rng, (size_t)rows * C, 0.1);
    dw0 = randn_f32(rng, C, 0.1);
    d_x = to_device_bf16(x);
    d_w = to_device_bf16(w);
    rstd = DeviceBuffer<float>(rows);
    DeviceBuffer<bf16> out((size_t)rows * C);
    tt::cuda::rmsnorm_forward(out.data(), rstd.data(), d_x.data(), d_w.data(), rows, C, kEps, nullptr);
    sync_and_check();
  }
};

TEST_P(RmsnormTest, BackwardMatchesCpuAndIsDeterministic) {
  const auto [rows, C, name] = GetParam();
  BackwardCase in(rows, C, 202, /*fp32_dout=*/false);
  const auto &x = in.x, &w = in.w, &dout = in.dout, &dx0 = in.dx0, &dw0 = in.dw0;
  const auto &d_x = in.d_x, &d_w = in.d_w;
  const auto& rstd = in.rstd;
  auto d_dout = to_device_bf16(dout);
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
  expect_backward_matches(rows, C, x, w, dout, dx0, dw0, dx_first, dw_first);

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

  // Overwriting dx (a poisoned buffer, never read) is bitwise accumulating into zeros.
  DeviceBuffer<bf16> dx_zero((size_t)rows * C), dx_over((size_t)rows * C);
  dx_zero.fill_bytes(0, nullptr);
  poison(dx_over);
  tt::cuda::rmsnorm_backward(dx_zero.data(), nullptr, d_dout.data(), d_x.data(), d_w.data(), rstd.data(), rows, C, {},
                             nullptr);
  tt::cuda::rmsnorm_backward(dx_over.data(), nullptr, d_dout.data(), d_x.data(), d_w.data(), rstd.data(), rows, C, {},
                             nullptr, /*accumulate_dx=*/false);
  sync_and_check();
  EXPECT_TRUE(all_equal("dx overwritten", to_host(dx_over), to_host(dx_zero)));

  // The fp32-dout entry point on the same values is the bf16 one, bit for bit.
  auto dout32 = to_device_f32(dout);
  auto dx32 = to_device_bf16(dx0);
  auto dw32 = to_device_f32(dw0);
  tt::cuda::rmsnorm_backward(dx32.data(), dw32.data(), dout32.data(), d_x.data(), d_w.data(), rstd.data(), rows, C,
                             {ws.data(), ws.size()}, nullptr);
  sync_and_check();
  EXPECT_TRUE(all_equal("dx from fp32 dout", to_host(dx32), dx_first));
  EXPECT_TRUE(all_equal("dw from fp32 dout", to_host(dw32), dw_first));
}

// dout in fp32 with values bf16 cannot hold (a GEMM's fp32 sum): used as given, not rounded.
TEST_P(RmsnormTest, BackwardFromFp32DoutMatchesCpu) {
  const auto [rows, C, name] = GetParam();
  BackwardCase in(rows, C, 303, /*fp32_dout=*/true);
  auto d_dout = to_device_f32(in.dout);
  DeviceBuffer<char> ws(tt::cuda::rmsnorm_backward_workspace_bytes(rows, C));
  auto dx = to_device_bf16(in.dx0);
  auto dw = to_device_f32(in.dw0);
  tt::cuda::rmsnorm_backward(dx.data(), dw.data(), d_dout.data(), in.d_x.data(), in.d_w.data(), in.rstd.data(), rows,
                             C, {ws.data(), ws.size()}, nullptr);
  sync_and_check();
  expect_backward_matches(rows, C, in.x, in.w, in.dout, in.dx0, in.dw0, to_host(dx), to_host(dw));
}

// Qwen3.5's zero-centred weights: the scale is w + 1 (w_offset 1), on every kernel path. The
// reference is the CPU norm with the weights w + 1 exactly (in fp64), under the bounds above.
TEST_P(RmsnormTest, ZeroCentredWeightsScaleByOnePlusW) {
  const auto [rows, C, name] = GetParam();
  BackwardCase in(rows, C, 404, /*fp32_dout=*/false);
  std::vector<double> w1 = in.w;
  for (double& v : w1) v += 1.0;
  std::vector<double> out_ref((size_t)rows * C), rstd_ref(rows);
  tt::cpu::rmsnorm_forward<double>(out_ref.data(), rstd_ref.data(), in.x.data(), w1.data(), rows, C, kEps);
  DeviceBuffer<bf16> out((size_t)rows * C);
  DeviceBuffer<float> rstd(rows);
  poison(out);
  tt::cuda::rmsnorm_forward(out.data(), rstd.data(), in.d_x.data(), in.d_w.data(), rows, C, kEps, nullptr,
                            /*w_offset=*/1.0);
  sync_and_check();
  const double dr = rstd_rel(C);
  std::vector<double> abs_out(out_ref.size());
  for (size_t i = 0; i < out_ref.size(); i++) abs_out[i] = 2 * (dr + 3 * kF32U) * std::fabs(out_ref[i]);
  EXPECT_TRUE(all_within("out (w + 1)", to_host(out), out_ref, kBf16U, abs_out));
  auto d_dout = to_device_bf16(in.dout);
  DeviceBuffer<char> ws(tt::cuda::rmsnorm_backward_workspace_bytes(rows, C));
  auto dx = to_device_bf16(in.dx0);
  auto dw = to_device_f32(in.dw0);
  tt::cuda::rmsnorm_backward(dx.data(), dw.data(), d_dout.data(), in.d_x.data(), in.d_w.data(), in.rstd.data(), rows,
                             C, {ws.data(), ws.size()}, nullptr, /*accumulate_dx=*/true, /*w_offset=*/1.0);
  sync_and_check();
  expect_backward_matches(rows, C, in.x, w1, in.dout, in.dx0, in.dw0, to_host(dx), to_host(dw));
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsnormTest,
                         ::testing::Values(Shape{37, 2048, "hidden_2048_odd_rows"},
                                           Shape{1100, 2048, "hidden_2048_rows_over_chunks"},
                                           Shape{70, 1000, "c_1000_four_steps_per_lane"},
                                           Shape{45, 512, "c_512_two_steps_per_lane"},
                                           Shape{301, 64, "c_64_four_rows_per_warp"},
                                           Shape{17, 36, "c_36_scalar_two_steps"},
                                           Shape{1024, 128, "qk_norm_rows_n_times_heads"},
                                           Shape{5000, 128, "qk_norm_many_rows"}, Shape{13, 100, "c_not_multiple_of_8"},
                                           Shape{3, 8, "tiny"}, Shape{1, 5120, "single_row_c_5120"},
                                           Shape{50, 2560, "c_2560_wide_path"}),
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
