// SwiGLU forward/backward vs the CPU reference (fp64), vector and scalar paths, wide gate range.
//
// Bound: __expf(x) (fast math) has at most 2 + 1.173 |x| ulp of error, so s = sigmoid(g) has
// relative error d_s <= (4 + 1.2 |g|) 2^-23 (exp, add, reciprocal); each further fp32 op adds u32.
//   out:   abs 2 (d_s + 3 u32) |ref|
//   dgate: abs 2 (3 d_s + 6 u32) |dout u| (s + |g| s (1 - s))   (the terms before cancellation)
//          + 4 u32 |g| s |dout u|    (1 - s cancels for large g: its error is u32-absolute)
//   dup:   abs 2 (d_s + 3 u32) |ref|
// then rel 2^-8 for the bf16 rounding, plus 2^-100 for fp32 underflow: fast math flushes values
// below 2^-126, and __expf(-g) overflows for g < -88.7, where the true s is below 2^-127.
#include "ops/cuda/swiglu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ops/cpu/swiglu.h"
#include "tests/ops_cuda/test_util.h"

namespace tt::cuda_test {
namespace {

struct Case {
  int64_t n;
  std::string name;
};

class SwigluTest : public GpuTest, public ::testing::WithParamInterface<Case> {};

TEST_P(SwigluTest, ForwardAndBackwardMatchCpu) {
  const int64_t n = GetParam().n;
  std::mt19937_64 rng(99 + n);
  auto gate = randn_bf16(rng, n, 3.0);
  if (n > 8) {  // the tails of the sigmoid
    gate[0] = 20, gate[1] = -20, gate[2] = 90, gate[3] = -90, gate[4] = 0;
  }
  const auto up = randn_bf16(rng, n);
  const auto dout = randn_bf16(rng, n);
  std::vector<double> out_ref(n), dg_ref(n), du_ref(n);
  tt::cpu::swiglu_forward<double>(out_ref.data(), gate.data(), up.data(), n);
  tt::cpu::swiglu_backward<double>(dg_ref.data(), du_ref.data(), dout.data(), gate.data(), up.data(), n);

  auto d_g = to_device_bf16(gate);
  auto d_u = to_device_bf16(up);
  auto d_d = to_device_bf16(dout);
  DeviceBuffer<bf16> out(n), dg(n), du(n);
  poison(out);
  poison(dg);
  poison(du);
  tt::cuda::swiglu_forward(out.data(), d_g.data(), d_u.data(), n, nullptr);
  tt::cuda::swiglu_backward(dg.data(), du.data(), d_d.data(), d_g.data(), d_u.data(), n, nullptr);
  sync_and_check();

  std::vector<double> a_out(n), a_dg(n), a_du(n);
  for (int64_t i = 0; i < n; i++) {
    const double g = gate[i], s = 1.0 / (1.0 + std::exp(-g));
    const double ds = (4 + 1.2 * std::fabs(g)) * std::ldexp(1.0, -23);
    const double tiny = std::ldexp(1.0, -100);
    a_out[i] = 2 * (ds + 3 * kF32U) * std::fabs(out_ref[i]) + tiny;
    a_du[i] = 2 * (ds + 3 * kF32U) * std::fabs(du_ref[i]) + tiny;
    a_dg[i] = 2 * (3 * ds + 6 * kF32U) * std::fabs(dout[i] * up[i]) * (s + std::fabs(g) * s * (1 - s)) +
              4 * kF32U * std::fabs(g) * s * std::fabs(dout[i] * up[i]) + tiny;
  }
  EXPECT_TRUE(all_within("out", to_host(out), out_ref, kBf16U, a_out));
  EXPECT_TRUE(all_within("dgate", to_host(dg), dg_ref, kBf16U, a_dg));
  EXPECT_TRUE(all_within("dup", to_host(du), du_ref, kBf16U, a_du));

  // In place: the gradients overwrite gate and up.
  tt::cuda::swiglu_backward(d_g.data(), d_u.data(), d_d.data(), d_g.data(), d_u.data(), n, nullptr);
  sync_and_check();
  EXPECT_TRUE(all_equal("dgate in place", to_host(d_g), to_host(dg)));
  EXPECT_TRUE(all_equal("dup in place", to_host(d_u), to_host(du)));
}

INSTANTIATE_TEST_SUITE_P(Sizes, SwigluTest,
                         ::testing::Values(Case{4096 * 8, "vector_path"}, Case{1000003, "odd_n_scalar_path"},
                                           Case{5, "tiny"}, Case{24576 * 3 + 8, "multiple_of_8_not_of_block"}),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace tt::cuda_test
