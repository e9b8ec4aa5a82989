// RoPE forward/backward vs the CPU reference (fp64) at deep positions, head dims 128, 64 and an
// odd half (HS = 6: the scalar path), on bf16 and on fp32 rows; partial RoPE (Qwen3.5: the first
// rotary_dim dims of a head rotate, the rest pass through unchanged) on the vector and scalar paths.
//
// Bound: cos and sin are fp64 rounded once to fp32 (relative u32 each), then x1 c - x2 s is two
// fp32 products and a difference: |err| <= 3 u32 (|x1| + |x2|) before the bf16 rounding; doubled:
// rel 2^-8, abs 6 u32 (|x_d| + |x_{d+HS/2}|).
#include "ops/cuda/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ops/cpu/rope.h"
#include "tests/ops_cuda/test_util.h"

namespace tt::cuda_test {
namespace {

struct Shape {
  int N, H, HS;
  double theta;
  std::string name;
  int R = 0;  // rotary_dim (0: all of HS)
};

class RopeTest : public GpuTest, public ::testing::WithParamInterface<Shape> {};

// Dims past the rotary ones are copied (bound 0: exact).
std::vector<double> pair_bound(const std::vector<double>& x, int N, int H, int HS, int R = 0) {
  std::vector<double> b(x.size(), 0.0);
  const int half = (R > 0 ? R : HS) / 2;
  for (int64_t r = 0; r < (int64_t)N * H; r++)
    for (int d = 0; d < half; d++) {
      const double m = std::fabs(x[r * HS + d]) + std::fabs(x[r * HS + d + half]);
      b[r * HS + d] = b[r * HS + d + half] = 6 * kF32U * m;
    }
  return b;
}

TEST_P(RopeTest, ForwardAndBackwardMatchCpu) {
  const auto [N, H, HS, theta, name, R] = GetParam();
  std::mt19937_64 rng(7 + N + HS);
  const auto x = randn_bf16(rng, (size_t)N * H * HS);
  std::vector<int32_t> pos(N);
  std::uniform_int_distribution<int> pd(0, 40000);
  for (int n = 0; n < N; n++) pos[n] = n < 3 ? n : pd(rng);  // 0, 1, 2, then deep positions
  auto d_pos = to_device(pos);

  std::vector<double> ref = x;
  tt::cpu::rope_forward<double>(ref.data(), pos.data(), N, H, HS, theta, R);
  auto d_x = to_device_bf16(x);
  tt::cuda::rope_forward(d_x.data(), d_pos.data(), N, H, HS, theta, nullptr, R);
  sync_and_check();
  EXPECT_TRUE(all_within("forward", to_host(d_x), ref, kBf16U, pair_bound(x, N, H, HS, R)));

  const auto g = randn_bf16(rng, (size_t)N * H * HS);
  std::vector<double> gref = g;
  tt::cpu::rope_backward<double>(gref.data(), pos.data(), N, H, HS, theta, R);
  auto d_g = to_device_bf16(g);
  tt::cuda::rope_backward(d_g.data(), d_pos.data(), N, H, HS, theta, nullptr, R);
  sync_and_check();
  EXPECT_TRUE(all_within("backward", to_host(d_g), gref, kBf16U, pair_bound(g, N, H, HS, R)));

  // On fp32 rows (a segment's tail-key gradients in their fp32 accumulators): no bf16 rounding,
  // the same 6 u32 (|x_d| + |x_{d+HS/2}|) bound.
  std::vector<double> g32(g.size());
  std::normal_distribution<double> nd;
  for (double& v : g32) v = (double)(float)nd(rng);
  for (bool fwd : {true, false}) {
    std::vector<double> want = g32;
    if (fwd) tt::cpu::rope_forward<double>(want.data(), pos.data(), N, H, HS, theta, R);
    else tt::cpu::rope_backward<double>(want.data(), pos.data(), N, H, HS, theta, R);
    auto d32 = to_device_f32(g32);
    if (fwd) tt::cuda::rope_forward(d32.data(), d_pos.data(), N, H, HS, theta, nullptr, R);
    else tt::cuda::rope_backward(d32.data(), d_pos.data(), N, H, HS, theta, nullptr, R);
    sync_and_check();
    EXPECT_TRUE(all_within(fwd ? "fp32 forward" : "fp32 backward", to_host(d32), want, 0.0, pair_bound(g32, N, H, HS, R)));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RopeTest,
                         ::testing::Values(Shape{45, 3, 128, 1e6, "hs128_qwen3_theta"},
                                           Shape{33, 4, 64, 1e4, "hs64_llama_theta"},
                                           Shape{17, 2, 6, 1e4, "hs6_scalar_path"},
                                           Shape{1, 16, 128, 1e6, "single_token_16_heads"},
                                           Shape{29, 2, 64, 1e7, "hs64_partial32", 32},
                                           Shape{11, 2, 256, 1e7, "hs256_partial64_qwen35", 64},
                                           Shape{9, 3, 24, 1e4, "hs24_partial12_scalar_path", 12}),
                         [](const ::testing::TestParamInfo<Shape>& info) { return info.param.name; });

TEST_F(GpuTest, RopeRejectsOddHeadDim) {
  DeviceBuffer<bf16> x(64);
  DeviceBuffer<int32_t> pos(4);
  EXPECT_THROW(tt::cuda::rope_forward(x.data(), pos.data(), 4, 2, 7, 1e4, nullptr), tt::Error);
  EXPECT_THROW(tt::cuda::rope_forward(x.data(), pos.data(), 4, 2, 8, 0.0, nullptr), tt::Error);
  EXPECT_THROW(tt::cuda::rope_forward(x.data(), pos.data(), 4, 2, 8, 1e4, nullptr, 6 + 1), tt::Error);  // odd
  EXPECT_THROW(tt::cuda::rope_forward(x.data(), pos.data(), 4, 2, 8, 1e4, nullptr, 10), tt::Error);     // > HS
}

}  // namespace
}  // namespace tt::cuda_test
