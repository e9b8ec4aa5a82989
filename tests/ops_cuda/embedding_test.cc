// Embedding forward (a copy: exact) and backward (integer-valued gradients: sums are exact in fp32
// and fp64, so exact equality) vs the CPU reference; determinism of the backward with real values.
#include "ops/cuda/embedding.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "ops/cpu/embedding.h"
#include "tests/ops_cuda/test_util.h"

namespace tt::cuda_test {
namespace {

struct Shape {
  int N, C, V;
  std::string name;
};

class EmbeddingTest : public GpuTest, public ::testing::WithParamInterface<Shape> {};

std::vector<int32_t> random_tokens(std::mt19937_64& rng, int N, int V) {
  std::uniform_int_distribution<int> dist(0, V - 1);
  std::vector<int32_t> t(N);
  for (auto& v : t) v = dist(rng);
  return t;
}

TEST_P(EmbeddingTest, ForwardIsExactCopy) {
  const auto [N, C, V, name] = GetParam();
  std::mt19937_64 rng(11 + N + C);
  const auto wte = randn_bf16(rng, (size_t)V * C);
  const auto tokens = random_tokens(rng, N, V);
  std::vector<double> ref((size_t)N * C);
  tt::cpu::embedding_forward<double>(ref.data(), tokens.data(), wte.data(), N, C);
  auto d_wte = to_device_bf16(wte);
  auto d_tok = to_device(tokens);
  DeviceBuffer<bf16> out((size_t)N * C);
  poison(out);
  tt::cuda::embedding_forward(out.data(), d_tok.data(), d_wte.data(), N, C, V, nullptr);
  sync_and_check();
  EXPECT_TRUE(all_equal("out", to_host(out), ref));
}

TEST_P(EmbeddingTest, BackwardIntegerValuedIsExact) {
  const auto [N, C, V, name] = GetParam();
  std::mt19937_64 rng(23 + N + C);
  const auto dout = randint(rng, (size_t)N * C, 8);     // exact in bf16
  const auto dwte0 = randint(rng, (size_t)V * C, 100);  // exact in fp32
  const auto tokens = random_tokens(rng, N, V);
  std::vector<double> ref = dwte0;
  tt::cpu::embedding_backward<double>(ref.data(), dout.data(), tokens.data(), N, C);
  auto d_dout = to_device_bf16(dout);
  auto d_tok = to_device(tokens);
  auto dwte = to_device_f32(dwte0);
  DeviceBuffer<char> ws(tt::cuda::embedding_backward_workspace_bytes(N));
  tt::cuda::embedding_backward(dwte.data(), d_dout.data(), d_tok.data(), N, C, V, {ws.data(), ws.size()}, nullptr);
  sync_and_check();
  EXPECT_TRUE(all_equal("dwte", to_host(dwte), ref));
}

TEST_P(EmbeddingTest, BackwardIsDeterministic) {
  const auto [N, C, V, name] = GetParam();
  std::mt19937_64 rng(37 + N + C);
  const auto dout = randn_bf16(rng, (size_t)N * C);
  const auto dwte0 = randn_f32(rng, (size_t)V * C);
  const auto tokens = random_tokens(rng, N, V);
  auto d_dout = to_device_bf16(dout);
  auto d_tok = to_device(tokens);
  DeviceBuffer<char> ws(tt::cuda::embedding_backward_workspace_bytes(N));
  std::vector<double> first;
  for (int rep = 0; rep < 3; rep++) {
    auto dwte = to_device_f32(dwte0);
    tt::cuda::embedding_backward(dwte.data(), d_dout.data(), d_tok.data(), N, C, V, {ws.data(), ws.size()},
                                 nullptr);
    sync_and_check();
    if (rep == 0) first = to_host(dwte);
    else EXPECT_TRUE(all_equal("dwte repeat", to_host(dwte), first));
  }
  // fp32 sums of bf16 values in packed order: each within (count + 1) u32 sum|terms| of fp64.
  std::vector<double> ref = dwte0, mag(dwte0.size());
  tt::cpu::embedding_backward<double>(ref.data(), dout.data(), tokens.data(), N, C);
  std::vector<int> count(V, 0);
  for (int t : tokens) count[t]++;
  for (int v = 0; v < V; v++)
    for (int c = 0; c < C; c++) mag[(size_t)v * C + c] = std::fabs(dwte0[(size_t)v * C + c]);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) mag[(size_t)tokens[n] * C + c] += std::fabs(dout[(size_t)n * C + c]);
  std::vector<double> abs(mag.size());
  for (size_t i = 0; i < abs.size(); i++) abs[i] = 2.0 * (count[i / C] + 2) * kF32U * mag[i];
  EXPECT_TRUE(all_within("dwte vs fp64", first, ref, 0.0, abs));
}

INSTANTIATE_TEST_SUITE_P(Shapes, EmbeddingTest,
                         ::testing::Values(Shape{300, 2048, 7, "hidden_2048_many_repeats"},
                                           Shape{77, 136, 50, "c_136"}, Shape{65, 100, 30, "c_not_multiple_of_8"},
                                           Shape{1, 8, 3, "single_token"}, Shape{1000, 64, 1000, "mostly_unique"}),
                         [](const ::testing::TestParamInfo<Shape>& info) { return info.param.name; });

TEST_F(GpuTest, EmbeddingOutOfRangeTokens) {
  const int N = 4, C = 16, V = 5;
  std::mt19937_64 rng(5);
  const auto wte = randn_bf16(rng, (size_t)V * C);
  const std::vector<int32_t> tokens = {1, V, -3, 4};
  auto d_wte = to_device_bf16(wte);
  auto d_tok = to_device(tokens);
  DeviceBuffer<bf16> out((size_t)N * C);
  tt::cuda::embedding_forward(out.data(), d_tok.data(), d_wte.data(), N, C, V, nullptr);
  sync_and_check();
  const auto o = to_host(out);
  for (int c = 0; c < C; c++) {
    EXPECT_EQ(o[c], wte[1 * C + c]);
    EXPECT_TRUE(std::isnan(o[1 * C + c])) << "token V must give a NaN row";
    EXPECT_TRUE(std::isnan(o[2 * C + c])) << "a negative token must give a NaN row";
    EXPECT_EQ(o[3 * C + c], wte[4 * C + c]);
  }
  // Backward: the out-of-range rows contribute nothing.
  const auto dout = randint(rng, (size_t)N * C, 4);
  std::vector<double> dw0((size_t)V * C, 1.0);
  auto d_dout = to_device_bf16(dout);
  auto dwte = to_device_f32(dw0);
  DeviceBuffer<char> ws(tt::cuda::embedding_backward_workspace_bytes(N));
  tt::cuda::embedding_backward(dwte.data(), d_dout.data(), d_tok.data(), N, C, V, {ws.data(), ws.size()}, nullptr);
  sync_and_check();
  std::vector<double> ref = dw0;
  for (int c = 0; c < C; c++) {
    ref[1 * C + c] += dout[0 * C + c];
    ref[4 * C + c] += dout[3 * C + c];
  }
  EXPECT_TRUE(all_equal("dwte", to_host(dwte), ref));
}

}  // namespace
}  // namespace tt::cuda_test
