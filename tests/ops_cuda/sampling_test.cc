// Sampling from logits rows on the GPU (ops/cuda/sampling.h) against the CPU reference
// (ops/cpu/sampling.h) on the same bf16 logits, greedy and at a temperature, vocabularies of 1000
// and 151936 (Qwen3's), rows with planted ties. Tokens must be equal: the argmax is exact on bf16
// values, and the Gumbel scores are fp64 on both sides from the same uniforms. Logprobs: the GPU's
// log-sum-exp sums V exp terms in fp32; as a random walk of V roundings that errs by about
// sqrt(V) 2^-24 <= 2.4e-5 relative on the sum, so |logprob - ref| < 1e-4.
#include "ops/cuda/sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ops/cpu/sampling.h"
#include "tests/ops_cuda/test_util.h"

namespace tt::cuda_test {
namespace {

struct Case {
  int R, V;
  double temperature;
  std::string name;
};

class SamplingTest : public GpuTest, public ::testing::WithParamInterface<Case> {};

TEST_P(SamplingTest, MatchesCpu) {
  const Case& c = GetParam();
  std::mt19937_64 rng(c.V + c.R);
  std::vector<double> x = randn_bf16(rng, (size_t)c.R * c.V, 3.0);
  if (c.V > 9) x[5] = x[9] = 40.0;  // a tie for the argmax of row 0: the lower id wins
  // Row 1: a tie across the boundary of two blocks' shares of the row (8 blocks a row).
  const int share = (c.V + 7) / 8;
  const bool cross = c.R > 1 && c.V >= 16;
  if (cross) x[(size_t)c.V + share - 1] = x[(size_t)c.V + share] = 40.0;
  std::vector<uint64_t> keys(c.R);
  for (int r = 0; r < c.R; ++r) keys[r] = rng();
  std::vector<int32_t> tok_ref(c.R);
  std::vector<double> lp_ref(c.R);
  cpu::sample_rows(tok_ref.data(), lp_ref.data(), x.data(), c.R, c.V, c.temperature, keys.data());
  const DeviceBuffer<bf16> logits = to_device_bf16(x);
  DeviceBuffer<uint64_t> k(c.R);
  k.copy_from_host(keys);
  DeviceBuffer<int32_t> tok(c.R);
  DeviceBuffer<double> lp(c.R);
  tok.fill_bytes(0xFF);
  lp.fill_bytes(0xFF);
  cuda::sample_rows(tok.data(), lp.data(), logits.data(), c.R, c.V, c.temperature, k.data(), nullptr);
  sync_and_check();
  const std::vector<int32_t> t = tok.to_host();
  const std::vector<double> l = lp.to_host();
  for (int r = 0; r < c.R; ++r) {
    EXPECT_EQ(t[r], tok_ref[r]) << c.name << " row " << r;
    EXPECT_NEAR(l[r], lp_ref[r], 1e-4) << c.name << " row " << r;
  }
  if (c.temperature == 0 && c.V > 9) EXPECT_EQ(t[0], 5) << "ties go to the lower id";
  if (c.temperature == 0 && cross) EXPECT_EQ(t[1], share - 1) << "ties across blocks go to the lower id";
}

// A row of NaN logits (a forward that overflowed) draws token 0 with a NaN logprob, as the CPU
// reference does, greedy and at a temperature: the caller refuses it (model/generate.cc), and no
// index past the row is read (compute-sanitizer's memcheck runs this suite).
TEST_F(GpuTest, ANanRowDrawsTokenZeroWithANanLogprob) {
  const int R = 2, V = 1000;
  std::vector<double> x((size_t)R * V, NAN);
  for (int v = 0; v < V; ++v) x[(size_t)V + v] = v == 7 ? 2.0 : 0.0;  // row 1: an ordinary row
  const std::vector<uint64_t> keys = {11, 12};
  for (const double temperature : {0.0, 0.8}) {
    std::vector<int32_t> tok_ref(R);
    std::vector<double> lp_ref(R);
    cpu::sample_rows(tok_ref.data(), lp_ref.data(), x.data(), R, V, temperature, keys.data());
    const DeviceBuffer<bf16> logits = to_device_bf16(x);
    DeviceBuffer<uint64_t> k(R);
    k.copy_from_host(keys);
    DeviceBuffer<int32_t> tok(R);
    DeviceBuffer<double> lp(R);
    cuda::sample_rows(tok.data(), lp.data(), logits.data(), R, V, temperature, k.data(), nullptr);
    sync_and_check();
    const std::vector<int32_t> t = tok.to_host();
    const std::vector<double> l = lp.to_host();
    EXPECT_EQ(tok_ref[0], 0);
    EXPECT_TRUE(std::isnan(lp_ref[0]));
    EXPECT_EQ(t[0], 0) << temperature;
    EXPECT_TRUE(std::isnan(l[0])) << temperature << ": " << l[0];
    EXPECT_EQ(t[1], tok_ref[1]) << temperature;
    EXPECT_NEAR(l[1], lp_ref[1], 1e-4) << temperature;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SamplingTest,
                         ::testing::Values(Case{7, 1000, 0.0, "greedy_v1000"}, Case{33, 1000, 0.7, "t07_v1000"},
                                           Case{3, 5, 0.0, "greedy_v5_blocks_without_logits"},
                                           Case{3, 5, 0.9, "t09_v5_blocks_without_logits"},
                                           Case{5, 151936, 0.0, "greedy_qwen_vocab"},
                                           Case{9, 151936, 1.3, "t13_qwen_vocab"}),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
}  // namespace tt::cuda_test
