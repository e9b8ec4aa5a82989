// Qwen3.5's gated attention ops on the GPU (ops/cuda/gated_attention.h) against the CPU reference
// (ops/cpu/gated_attention.h, fp64 on the same bf16 inputs). The head split and merge are copies:
// bitwise equal. The gate: one bf16 rounding of an fp32 product (2^-9 relative, doubled) plus the
// fp32 sigmoid's error (a few 2^-24): elementwise 2^-8 relative plus 2^-20 of the largest output.
#include "ops/cuda/gated_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "ops/cpu/gated_attention.h"
#include "tests/ops_cuda/test_util.h"

namespace tt::cuda_test {
namespace {

class GatedAttention : public GpuTest {};

TEST_F(GatedAttention, SplitAndMergeAreTheCpuCopies) {
  const int N = 37, H = 5, D = 24;
  std::mt19937_64 rng(3);
  const auto ab = randn_bf16(rng, (size_t)N * H * 2 * D);
  std::vector<double> a((size_t)N * H * D), b(a.size()), back(ab.size());
  cpu::split_heads<double>(a.data(), b.data(), ab.data(), N, H, D);
  auto d_ab = to_device_bf16(ab);
  DeviceBuffer<bf16> d_a(a.size()), d_b(b.size()), d_back(ab.size());
  cuda::split_heads(d_a.data(), d_b.data(), d_ab.data(), N, H, D, nullptr);
  cuda::merge_heads(d_back.data(), d_a.data(), d_b.data(), N, H, D, nullptr);
  sync_and_check();
  EXPECT_TRUE(all_equal("split a", to_host(d_a), a));
  EXPECT_TRUE(all_equal("split b", to_host(d_b), b));
  cpu::merge_heads<double>(back.data(), a.data(), b.data(), N, H, D);
  EXPECT_TRUE(all_equal("merge", to_host(d_back), back));
  EXPECT_TRUE(all_equal("merge of the split", to_host(d_back), ab));
}

TEST_F(GatedAttention, SigmoidGateMatchesTheCpu) {
  const int64_t n = 5000;
  std::mt19937_64 rng(4);
  const auto x = randn_bf16(rng, n), gate = randn_bf16(rng, n, 3.0), dy = randn_bf16(rng, n);
  auto bound = [](const std::vector<double>& ref) {
    double mx = 0;
    for (double r : ref) mx = std::max(mx, std::fabs(r));
    return std::vector<double>{mx / 1048576};
  };
  std::vector<double> y(n), dx(n), dg(n);
  cpu::sigmoid_gate_forward<double>(y.data(), x.data(), gate.data(), n);
  cpu::sigmoid_gate_backward<double>(dx.data(), dg.data(), dy.data(), x.data(), gate.data(), n);
  auto d_x = to_device_bf16(x), d_g = to_device_bf16(gate), d_dy = to_device_bf16(dy);
  DeviceBuffer<bf16> d_y(n), d_dg(n);
  cuda::sigmoid_gate_forward(d_y.data(), d_x.data(), d_g.data(), n, nullptr);
  // dx aliasing dy, as the layer calls it.
  cuda::sigmoid_gate_backward(d_dy.data(), d_dg.data(), d_dy.data(), d_x.data(), d_g.data(), n, nullptr);
  sync_and_check();
  EXPECT_TRUE(all_within("gate forward", to_host(d_y), y, kBf16U, bound(y)));
  EXPECT_TRUE(all_within("gate dx (in place of dy)", to_host(d_dy), dx, kBf16U, bound(dx)));
  EXPECT_TRUE(all_within("gate dgate", to_host(d_dg), dg, kBf16U, bound(dg)));
}

}  // namespace
}  // namespace tt::cuda_test
