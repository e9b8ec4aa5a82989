// Multi-tensor AdamW vs the CPU reference (fp64) per tensor, with decay flags, tensors whose sizes
// and offsets break 16-byte alignment, small chunks; sum of squares and the device clip scale.
//
// Bounds (fp32 on the GPU, fast-math sqrt and division of at most 2 ulp):
//   m:      abs 2 * 3 u32 (b1 |m| + (1 - b1) |g|)
//   v:      abs 2 * 4 u32 (b2 v + (1 - b2) g^2)
//   param:  abs 2 (2 u32 |param| + 16 u32 step_size |m / denom|) + step_size err(m) / denom
//           (m may cancel: its error is relative to its terms, not to m)
//   bf16 copy: exactly the round-to-nearest-even of the GPU's fp32 parameter.
//   sum of squares: fp64 sums of exact squares on both sides; the CPU's chains are the longer
//           (blocks of 16384, then n / 16384 block sums): rel 2 (16384 + n / 16384 + 200) u64.
#include "ops/cuda/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ops/cpu/adamw.h"
#include "tests/ops_cuda/test_util.h"

namespace tt::cuda_test {
namespace {

using tt::cuda::AdamWChunk;
using tt::cuda::AdamWTensor;

class AdamWTest : public GpuTest {};

std::vector<AdamWTensor> tensors_of(const std::vector<int64_t>& sizes) {
  std::vector<AdamWTensor> t;
  int64_t off = 0;
  for (size_t i = 0; i < sizes.size(); i++) {
    t.push_back(AdamWTensor{off, sizes[i], i % 2 == 0});
    off += sizes[i];
  }
  return t;
}

struct State {
  std::vector<double> param, grad, m, v;
};

State random_state(int64_t P, uint64_t seed) {
  std::mt19937_64 rng(seed);
  State s;
  s.param = randn_f32(rng, P, 0.5);
  s.grad = randn_f32(rng, P, 0.01);
  s.m = randn_f32(rng, P, 0.005);
  s.v = randn_f32(rng, P, 1e-4);
  for (auto& x : s.v) x = (float)(x * x);
  return s;
}

void check_step(const std::vector<int64_t>& sizes, int64_t chunk_elems, const tt::cuda::AdamWParams& p,
                bool device_scale) {
  const auto tensors = tensors_of(sizes);
  int64_t P = 0;
  for (auto s : sizes) P += s;
  const State s = random_state(P, 5 + P + chunk_elems);
  auto param = to_device_f32(s.param);
  auto grad = to_device_f32(s.grad);
  auto m = to_device_f32(s.m);
  auto v = to_device_f32(s.v);
  DeviceBuffer<bf16> pb(P);
  poison(pb);
  const std::vector<AdamWChunk> chunks = tt::cuda::adamw_chunks(tensors, chunk_elems);
  auto d_chunks = to_device(chunks);

  double scale = p.grad_scale;
  DeviceBuffer<float> dscale(1);
  tt::cuda::AdamWParams gp = p;
  if (device_scale) {  // clip to half the gradient norm, on the device
    DeviceBuffer<double> sumsq(1), norm(1);
    DeviceBuffer<char> ws(tt::cuda::sum_squares_workspace_bytes(P));
    tt::cuda::sum_squares(sumsq.data(), grad.data(), P, {ws.data(), ws.size()}, nullptr);
    const double ref_sumsq = tt::cpu::sum_squares<double>(s.grad.data(), P);
    const double max_norm = 0.5 * std::sqrt(ref_sumsq);
    tt::cuda::clip_scale(dscale.data(), norm.data(), sumsq.data(), max_norm, nullptr);
    sync_and_check();
    const float got = dscale.to_host()[0];
    EXPECT_NEAR(got, max_norm / (std::sqrt(ref_sumsq) + 1e-6), 2 * kF32U);
    EXPECT_NEAR(norm.to_host()[0], std::sqrt(ref_sumsq), 1e-12 * std::sqrt(ref_sumsq));
    scale = p.grad_scale * (double)got;
  }
  DeviceBuffer<int> flag(1);
  flag.fill_bytes(0);
  tt::cuda::adamw_update(param.data(), pb.data(), grad.data(), m.data(), v.data(), d_chunks.data(),
                         (int)chunks.size(), gp, device_scale ? dscale.data() : nullptr, nullptr, flag.data());
  sync_and_check();
  EXPECT_EQ(flag.to_host()[0], 0) << "a finite update raises no flag";

  State ref = s;
  for (const AdamWTensor& t : tensors) {
    tt::cpu::AdamWParams cp;
    cp.lr = p.lr, cp.beta1 = p.beta1, cp.beta2 = p.beta2, cp.eps = p.eps, cp.step = p.step;
    cp.weight_decay = t.decay ? p.weight_decay : 0.0;
    cp.grad_scale = scale;
    tt::cpu::adamw_update<double>(ref.param.data() + t.offset, ref.grad.data() + t.offset, ref.m.data() + t.offset,
                                  ref.v.data() + t.offset, t.numel, cp);
  }
  const double step_size = p.lr / (1 - std::pow(p.beta1, (double)p.step));
  const double bc2 = std::sqrt(1 - std::pow(p.beta2, (double)p.step));
  std::vector<double> am(P), av(P), ap(P);
  for (int64_t i = 0; i < P; i++) {
    const double g = s.grad[i] * scale;
    am[i] = 6 * kF32U * (p.beta1 * std::fabs(s.m[i]) + (1 - p.beta1) * std::fabs(g));
    av[i] = 8 * kF32U * (p.beta2 * s.v[i] + (1 - p.beta2) * g * g);
    const double denom = std::sqrt(ref.v[i]) / bc2 + p.eps;
    ap[i] = 2 * (2 * kF32U * std::fabs(s.param[i]) + 16 * kF32U * step_size * std::fabs(ref.m[i] / denom)) +
            step_size * am[i] / denom;
  }
  const auto got_p = to_host(param);
  EXPECT_TRUE(all_within("m", to_host(m), ref.m, 0.0, am));
  EXPECT_TRUE(all_within("v", to_host(v), ref.v, 0.0, av));
  EXPECT_TRUE(all_within("param", got_p, ref.param, 0.0, ap));
  EXPECT_TRUE(all_equal("param bf16 copy", to_host(pb), round_bf16(got_p)));
}

TEST_F(AdamWTest, MisalignedTensorsSmallChunks) {
  tt::cuda::AdamWParams p;
  p.lr = 1e-2, p.weight_decay = 0.1, p.step = 1, p.grad_scale = 0.5;
  check_step({1, 3, 1000, 65536 + 5, 7, 130000}, 1000, p, false);
}

TEST_F(AdamWTest, DefaultChunksLaterStep) {
  tt::cuda::AdamWParams p;
  p.lr = 3e-4, p.weight_decay = 0.01, p.step = 7, p.beta2 = 0.999;
  check_step({2048 * 64, 64, 5 * 65536 + 3, 2048}, tt::cuda::kAdamWChunkElems, p, false);
}

// The update flags non-finite results: an lr that overflows fp32 (1e39 -> inf), and a NaN
// gradient in one element of the last chunk (the scalar tail of a misaligned tensor).
TEST_F(AdamWTest, NonFiniteUpdatesRaiseTheFlag) {
  const std::vector<AdamWTensor> tensors = {{0, 1000, true}, {1000, 70003, true}};
  const int64_t P = 71003;
  const State s = random_state(P, 77);
  const std::vector<AdamWChunk> chunks = tt::cuda::adamw_chunks(tensors, 4096);
  for (int c = 0; c < 2; c++) {
    auto param = to_device_f32(s.param), m = to_device_f32(s.m), v = to_device_f32(s.v);
    std::vector<double> g = s.grad;
    tt::cuda::AdamWParams p;
    p.lr = 1e-3;
    if (c == 0) p.lr = 1e39;
    if (c == 1) g[P - 2] = std::nan("");
    auto grad = to_device_f32(g);
    auto d_chunks = to_device(chunks);
    DeviceBuffer<int> flag(1);
    flag.fill_bytes(0);
    tt::cuda::adamw_update(param.data(), nullptr, grad.data(), m.data(), v.data(), d_chunks.data(), (int)chunks.size(),
                           p, nullptr, nullptr, flag.data());
    sync_and_check();
    EXPECT_EQ(flag.to_host()[0], 1) << (c == 0 ? "lr 1e39" : "a NaN gradient");
  }
}

TEST_F(AdamWTest, DeviceClipScale) {
  tt::cuda::AdamWParams p;
  p.lr = 1e-3, p.weight_decay = 0.1, p.step = 3;
  check_step({4096, 13, 70000}, tt::cuda::kAdamWChunkElems, p, true);
}

TEST_F(AdamWTest, ChunkTable) {
  const auto c = tt::cuda::adamw_chunks({{0, 10, true}, {10, 0, false}, {10, 25, false}}, 8);
  ASSERT_EQ(c.size(), 2u + 4u);
  EXPECT_EQ(c[0].offset, 0);
  EXPECT_EQ(c[1].len, 2);
  EXPECT_EQ(c[2].offset, 10);
  EXPECT_EQ(c[2].decay, 0);
  EXPECT_EQ(c[5].offset, 34);
  EXPECT_EQ(c[5].len, 1);
}

TEST_F(AdamWTest, SumSquaresMatchesCpuAndIsDeterministic) {
  for (int64_t n : {int64_t(1), int64_t(5), int64_t(4096), int64_t(1000003), int64_t(40000001)}) {
    std::mt19937_64 rng(n);
    const auto x = randn_f32(rng, n + 1, 0.1);
    auto d = to_device_f32(x);
    DeviceBuffer<double> out(1);
    DeviceBuffer<char> ws(tt::cuda::sum_squares_workspace_bytes(n));
    for (int offset : {0, 1}) {  // offset 1: a pointer that is not 16-byte aligned
      const double ref = tt::cpu::sum_squares<double>(x.data() + offset, n);
      tt::cuda::sum_squares(out.data(), d.data() + offset, n, {ws.data(), ws.size()}, nullptr);
      sync_and_check();
      const double got = out.to_host()[0];
      EXPECT_NEAR(got, ref, 2 * (16384 + n / 16384 + 200) * kF64U * ref) << "n=" << n << " offset=" << offset;
      tt::cuda::sum_squares(out.data(), d.data() + offset, n, {ws.data(), ws.size()}, nullptr);
      sync_and_check();
      EXPECT_EQ(out.to_host()[0], got) << "repeatable";
    }
  }
}

TEST_F(AdamWTest, ClipScaleFormula) {
  DeviceBuffer<double> sumsq(1), norm(1);
  DeviceBuffer<float> scale(1);
  const double s = 16.0;  // norm 4
  sumsq.copy_from_host(&s, 1);
  for (double max_norm : {0.0, 1.0, 8.0}) {
    tt::cuda::clip_scale(scale.data(), norm.data(), sumsq.data(), max_norm, nullptr);
    sync_and_check();
    const double want = max_norm <= 0 ? 1.0 : std::min(1.0, max_norm / (4.0 + 1e-6));
    EXPECT_FLOAT_EQ(scale.to_host()[0], (float)want) << max_norm;
    EXPECT_EQ(norm.to_host()[0], 4.0);
  }
}

}  // namespace
}  // namespace tt::cuda_test
