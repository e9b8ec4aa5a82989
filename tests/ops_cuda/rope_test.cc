// RoPE forward/backward vs the CPU reference (fp64) at deep positions, head dims 128, 64 and an
// odd half (HS = 6: the scalar path), on bf16 and on fp32 rows.
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
};

class RopeTest : public GpuTest, public ::testing::WithParamInterface<Shape> {};

std::vector<double> pair_bound(const std::vector<double>& x, int N, int H, int HS) {
  std::vector<double> b(x.size());
  const int half = HS / 2;
  for (int64_t r = 0; r < (int64_t)N * H; r++)
    for (int d = 0; d < half; d++) {
      const double m = std::fabs(x[r * HS + d]) + std::fabs(x[r * HS + d + half]);
      b[r * HS + d] = b[r * HS + d + half] = 6 * kF32U * m;
    }
  return b;
}

TEST_P(RopeTest, ForwardAndBackwardMatchCpu) {
  const auto [N, H, HS, theta, name] = GetParam();
  std::mt19937_64 rng(7 + N + HS);
  const auto x = randn_bf16(rng, (size_t)N * H * HS);
  std::vector<int32_t> pos(N);
  std::uniform_int_distribution<int> pd(0, 40000);
  for (int n = 0; n < N; n++) pos[n] = n < 3 ? n : pd(rng);  // 0, 1, 2, then deep positions
  auto d_pos = to_device(pos);

  std::vector<double> ref = x;
  tt::cpu::rope_forward<double>(ref.data(), pos.data(), N, H, HS, theta);
  auto d_x = to_device_bf16(x);
  tt::cuda::rope_forward(d_x.data(), d_pos.data(), N, H, HS, theta, nullptr);
  sync_and_check();
  EXPECT_TRUE(all_within("forward", to_host(d_x), ref, kBf16U, pair_bound(x, N, H, HS)));

  const auto g = randn_bf16(rng, (size_t)N * H * HS);
  std::vector<double> gref = g;
  tt::cpu::rope_backward<double>(gref.data(), pos.data(), N, H, HS, theta);
  auto d_g = to_device_bf16(g);
  tt::cuda::rope_backward(d_g.data(), d_pos.data(), N, H, HS, theta, nullptr);
  sync_and_check();
  EXPECT_TRUE(all_within("backward", to_host(d_g), gref, kBf16U, pair_bound(g, N, H, HS)));

  // On fp32 rows (a segment's tail-key gradients in their fp32 accumulators): no bf16 rounding,
  // the same 6 u32 (|x_d| + |x_{d+HS/2}|) bound.
  std::vector<double> g32(g.size());
  std::normal_distribution<double> nd;
  for (double& v : g32) v = (double)(float)nd(rng);
  for (bool fwd : {true, false}) {
    std::vector<double> want = g32;
    if (fwd) tt::cpu::rope_forward<double>(want.data(), pos.data(), N, H, HS, theta);
    else tt::cpu::rope_backward<double>(want.data(), pos.data(), N, H, HS, theta);
    auto d32 = to_device_f32(g32);
    if (fwd) tt::cuda::rope_forward(d32.data(), d_pos.data(), N, H, HS, theta, nullptr);
    else tt::cuda::rope_backward(d32.data(), d_pos.data(), N, H, HS, theta, nullptr);
    sync_and_check();
    EXPECT_TRUE(all_within(fwd ? "fp32 forward" : "fp32 backward", to_host(d32), want, 0.0, pair_bound(g32, N, H, HS)));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RopeTest,
                         ::testing::Values(Shape{45, 3, 128, 1e6, "hs128_qwen3_theta"},
                                           Shape{33, 4, 64, 1e4, "hs64_llama_theta"},
                                           Shape{17, 2, 6, 1e4, "hs6_scalar_path"},
                                           Shape{1, 16, 128, 1e6, "single_token_16_heads"}),
                         [](const ::testing::TestParamInfo<Shape>& info) { return info.param.name; });

TEST_F(GpuTest, RopeRejectsOddHeadDim) {
  DeviceBuffer<bf16> x(64);
  DeviceBuffer<int32_t> pos(4);
  EXPECT_THROW(tt::cuda::rope_forward(x.data(), pos.data(), 4, 2, 7, 1e4, nullptr), tt::Error);
  EXPECT_THROW(tt::cuda::rope_forward(x.data(), pos.data(), 4, 2, 8, 0.0, nullptr), tt::Error);
}

}  // namespace
}  // namespace tt::cuda_test
