// cuBLASLt Linear GEMMs vs the CPU matmul (fp64) for the three products, with overwrite and
// accumulate, bf16 and fp32 outputs, and shapes whose leading dimensions are not multiples of 8;
// with the heuristic's algorithm and with autotuning; forwards of up to 8 rows (gemv.h), with a
// column count that is odd, one column, and an IC that gemv does not take (cuBLASLt's path).
//
// Bound per element: products of bf16 values are exact in fp32, so the only errors are the fp32
// accumulation (at most k u32 sum_k |a b| for a sum of k terms; doubled for tensor-core
// accumulation order and split-k) and, for accumulating outputs, one fp32 add; then one rounding to
// bf16 for bf16 outputs:  |got - ref| <= rel |ref| + 2 (k + 2) u32 S,  S = sum_k |a b| (+ |old|).
// Accumulating into bf16 (beta 1) rounds twice on Hopper (gemm.h): the product P is rounded to
// bf16 before old is added, so that bound gets a second bf16 rounding, 2^-8 |P|. The test prints
// how many elements equal that model exactly: bf16(bf16(P) + old), with bf16(P) the GPU's own
// beta = 0 result of the same algorithm.
#include "ops/cuda/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "ops/cpu/matmul.h"
#include "tests/ops_cuda/test_util.h"

namespace tt::cuda_test {
namespace {

struct Shape {
  int N, IC, OC;
  std::string name;
  bool autotune = false;  // GemmHandle::set_autotune: the same bounds hold for whichever algorithm wins
};

class GemmTest : public GpuTest, public ::testing::WithParamInterface<Shape> {};

std::vector<double> absv(const std::vector<double>& x) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); i++) y[i] = std::fabs(x[i]);
  return y;
}

std::vector<double> bound(const std::vector<double>& s, const std::vector<double>& old, int k) {
  std::vector<double> b(s.size());
  for (size_t i = 0; i < s.size(); i++) b[i] = 2.0 * (k + 2) * kF32U * (s[i] + (old.empty() ? 0.0 : std::fabs(old[i])));
  return b;
}

// A second bf16 rounding of the product p: adds 2^-8 |p| (and its first-order cross term).
std::vector<double> two_roundings(std::vector<double> b, const std::vector<double>& p) {
  for (size_t i = 0; i < b.size(); i++) b[i] += kBf16U * (1 + kBf16U) * std::fabs(p[i]);
  return b;
}

TEST_P(GemmTest, ThreeProductsMatchCpu) {
  const Shape sh = GetParam();
  const int N = sh.N, IC = sh.IC, OC = sh.OC;
  std::mt19937_64 rng(1234 + N * 7 + IC * 13 + OC);
  const auto x = randn_bf16(rng, (size_t)N * IC);
  const auto w = randn_bf16(rng, (size_t)OC * IC, 0.05);
  const auto dout = randn_bf16(rng, (size_t)N * OC, 0.5);
  const auto dx_old = randn_bf16(rng, (size_t)N * IC, 0.1);
  const auto dw_old = randn_f32(rng, (size_t)OC * IC, 0.1);
  auto d_x = to_device_bf16(x);
  auto d_w = to_device_bf16(w);
  auto d_dout = to_device_bf16(dout);

  // References: values and sums of magnitudes.
  std::vector<double> out_ref((size_t)N * OC), out_abs((size_t)N * OC);
  tt::cpu::matmul_forward<double>(out_ref.data(), x.data(), w.data(), N, IC, OC);
  tt::cpu::matmul_forward<double>(out_abs.data(), absv(x).data(), absv(w).data(), N, IC, OC);
  std::vector<double> dx_ref((size_t)N * IC, 0.0), dw_ref((size_t)OC * IC, 0.0);
  std::vector<double> dx_abs((size_t)N * IC, 0.0), dw_abs((size_t)OC * IC, 0.0);
  tt::cpu::matmul_backward<double>(dx_ref.data(), dw_ref.data(), dout.data(), x.data(), w.data(), N, IC, OC);
  tt::cpu::matmul_backward<double>(dx_abs.data(), dw_abs.data(), absv(dout).data(), absv(x).data(),
                                   absv(w).data(), N, IC, OC);

  tt::cuda::GemmHandle h;
  h.set_autotune(sh.autotune);
  if (sh.autotune) {  // a tuned plan's first call accumulates: timing must not touch its output
    tt::cuda::GemmHandle first;
    first.set_autotune(true);
    auto dw_acc = to_device_f32(dw_old);
    tt::cuda::matmul_backward_dw(first, dw_acc.data(), d_dout.data(), d_x.data(), N, IC, OC, 1.f);
    sync_and_check();
    std::vector<double> ref(dw_ref.size());
    for (size_t i = 0; i < ref.size(); i++) ref[i] = dw_old[i] + dw_ref[i];
    EXPECT_TRUE(all_within("dw accumulate, first call tuned", to_host(dw_acc), ref, kF32U, bound(dw_abs, dw_old, N)));
    const tt::cuda::GemmTuneStats st = first.tune_stats();
    EXPECT_LE(st.tuned_plans, 1);
    EXPECT_LE(st.tuned_ms, st.heuristic_ms);
    std::printf("[ %s ] autotune: %d plan(s) timed, %d changed, heuristic %.4f ms -> %.4f ms\n", sh.name.c_str(),
                st.tuned_plans, st.changed_plans, st.heuristic_ms, st.tuned_ms);
  }
  {  // forward, bf16 and fp32 out, overwritten over NaN poison
    DeviceBuffer<bf16> out((size_t)N * OC);
    poison(out);
    tt::cuda::matmul_forward(h, out.data(), d_x.data(), d_w.data(), N, IC, OC);
    sync_and_check();
    EXPECT_TRUE(all_within("out bf16", to_host(out), out_ref, kBf16U, bound(out_abs, {}, IC)));
    DeviceBuffer<float> out32((size_t)N * OC);
    poison(out32);
    tt::cuda::matmul_forward(h, out32.data(), d_x.data(), d_w.data(), N, IC, OC);
    sync_and_check();
    EXPECT_TRUE(all_within("out fp32", to_host(out32), out_ref, kF32U, bound(out_abs, {}, IC)));
  }
  {  // dx = dout @ w (beta 0 over poison), then dx += dout @ w (beta 1 over dx_old)
    DeviceBuffer<bf16> dx((size_t)N * IC);
    poison(dx);
    tt::cuda::matmul_backward_dx(h, dx.data(), d_dout.data(), d_w.data(), N, IC, OC, 0.f);
    sync_and_check();
    EXPECT_TRUE(all_within("dx overwrite", to_host(dx), dx_ref, kBf16U, bound(dx_abs, {}, OC)));
    auto dx_acc = to_device_bf16(dx_old);
    tt::cuda::matmul_backward_dx(h, dx_acc.data(), d_dout.data(), d_w.data(), N, IC, OC, 1.f);
    sync_and_check();
    std::vector<double> ref(dx_ref.size());
    for (size_t i = 0; i < ref.size(); i++) ref[i] = dx_old[i] + dx_ref[i];
    const auto got = to_host(dx_acc), prod = to_host(dx);
    EXPECT_TRUE(all_within("dx accumulate", got, ref, kBf16U, two_roundings(bound(dx_abs, dx_old, OC), dx_ref)));
    size_t model = 0, single = 0;
    const auto b1 = bound(dx_abs, dx_old, OC);
    for (size_t i = 0; i < got.size(); i++) {
      model += got[i] == tt::cuda::round_to_bf16((float)(prod[i] + dx_old[i]));
      single += std::fabs(got[i] - ref[i]) <= kBf16U * std::fabs(ref[i]) + b1[i];
    }
    std::printf("[ %s ] bf16 dx accumulate: %zu of %zu equal bf16(bf16(P) + old); %zu within one rounding\n",
                sh.name.c_str(), model, got.size(), single);

    // fp32 dx: one fp32 rounding, overwrite and accumulate.
    DeviceBuffer<float> dx32((size_t)N * IC);
    poison(dx32);
    tt::cuda::matmul_backward_dx(h, dx32.data(), d_dout.data(), d_w.data(), N, IC, OC, 0.f);
    sync_and_check();
    EXPECT_TRUE(all_within("dx fp32 overwrite", to_host(dx32), dx_ref, kF32U, bound(dx_abs, {}, OC)));
    auto dx32_acc = to_device_f32(dx_old);
    tt::cuda::matmul_backward_dx(h, dx32_acc.data(), d_dout.data(), d_w.data(), N, IC, OC, 1.f);
    sync_and_check();
    EXPECT_TRUE(all_within("dx fp32 accumulate", to_host(dx32_acc), ref, kF32U, bound(dx_abs, dx_old, OC)));
  }
  {  // dW (fp32) = dout^T x (beta 0 over poison), then += (beta 1 over dw_old)
    DeviceBuffer<float> dw((size_t)OC * IC);
    poison(dw);
    tt::cuda::matmul_backward_dw(h, dw.data(), d_dout.data(), d_x.data(), N, IC, OC, 0.f);
    sync_and_check();
    EXPECT_TRUE(all_within("dw overwrite", to_host(dw), dw_ref, kF32U, bound(dw_abs, {}, N)));
    auto dw_acc = to_device_f32(dw_old);
    tt::cuda::matmul_backward_dw(h, dw_acc.data(), d_dout.data(), d_x.data(), N, IC, OC, 1.f);
    sync_and_check();
    std::vector<double> ref(dw_ref.size());
    for (size_t i = 0; i < ref.size(); i++) ref[i] = dw_old[i] + dw_ref[i];
    EXPECT_TRUE(all_within("dw accumulate", to_host(dw_acc), ref, kF32U, bound(dw_abs, dw_old, N)));
  }
  {  // matmul_backward: the CPU contract (both +=)
    auto dx_acc = to_device_bf16(dx_old);
    auto dw_acc = to_device_f32(dw_old);
    tt::cuda::matmul_backward(h, dx_acc.data(), dw_acc.data(), d_dout.data(), d_x.data(), d_w.data(), N, IC, OC);
    sync_and_check();
    std::vector<double> rx(dx_ref.size()), rw(dw_ref.size());
    for (size_t i = 0; i < rx.size(); i++) rx[i] = dx_old[i] + dx_ref[i];
    for (size_t i = 0; i < rw.size(); i++) rw[i] = dw_old[i] + dw_ref[i];
    EXPECT_TRUE(all_within("backward dx +=", to_host(dx_acc), rx, kBf16U,
                           two_roundings(bound(dx_abs, dx_old, OC), dx_ref)));
    EXPECT_TRUE(all_within("backward dw +=", to_host(dw_acc), rw, kF32U, bound(dw_abs, dw_old, N)));
  }
  // Plans are cached: repeating a product adds none (and tunes none).
  const int plans = h.num_plans();
  const int tuned = h.tune_stats().tuned_plans;
  DeviceBuffer<bf16> out((size_t)N * OC);
  tt::cuda::matmul_forward(h, out.data(), d_x.data(), d_w.data(), N, IC, OC);
  sync_and_check();
  EXPECT_EQ(h.num_plans(), plans);
  EXPECT_EQ(h.tune_stats().tuned_plans, tuned);
  if (!sh.autotune) {
    EXPECT_EQ(tuned, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemmTest,
    ::testing::Values(Shape{64, 128, 256, "aligned"}, Shape{37, 72, 96, "rows_not_multiple_of_tile"},
                      Shape{33, 40, 100, "ld_not_multiple_of_8"}, Shape{256, 2048, 512, "hidden_2048"},
                      Shape{1, 256, 64, "single_row"}, Shape{256, 2048, 512, "hidden_2048_autotuned", true},
                      Shape{37, 72, 96, "rows_not_multiple_of_tile_autotuned", true},
                      Shape{33, 40, 100, "ld_not_multiple_of_8_autotuned", true},
                      // Up to 8 rows: the forward goes to gemv (gemv.h); the backward stays cuBLASLt's.
                      Shape{1, 2048, 4096, "gemv_one_row"}, Shape{3, 6144, 2048, "gemv_three_rows"},
                      Shape{8, 2048, 1001, "gemv_eight_rows_odd_oc"}, Shape{5, 40, 1, "gemv_one_column"},
                      Shape{2, 4096, 64, "gemv_few_columns_long_rows"}, Shape{4, 512, 3000, "gemv_two_slices"},
                      Shape{2, 36, 50, "few_rows_ic_not_multiple_of_8"}),
    [](const ::testing::TestParamInfo<Shape>& info) { return info.param.name; });

TEST_F(GpuTest, GemmRejectsBadShapes) {
  tt::cuda::GemmHandle h;
  DeviceBuffer<bf16> a(64), b(64), c(64);
  EXPECT_THROW(tt::cuda::matmul_forward(h, c.data(), a.data(), b.data(), 4, 0, 4), tt::Error);
  EXPECT_THROW(tt::cuda::matmul_forward(h, c.data(), a.data(), b.data(), -1, 4, 4), tt::Error);
  EXPECT_THROW(tt::cuda::matmul_forward(h, (bf16*)nullptr, a.data(), b.data(), 4, 4, 4), tt::Error);
}

// The tuning table: a timed winner stays pending (the calls run the heuristic's algorithm: the
// same bytes as without autotuning) until adopted; a shape of an adopted bucket takes its
// algorithm without timing; a second handle given the table (a resumed run) times nothing and
// computes bitwise the same; a hint stands in for timing; replacing the table drops the cached
// plans; without autotuning neither table nor hints are used.
TEST_F(GpuTest, GemmTuningTableCarriesOverBucketsAndHandles) {
  const int IC = 2048, OC = 2048;
  std::mt19937_64 rng(99);
  const auto x = randn_bf16(rng, (size_t)1010 * IC);
  const auto w = randn_bf16(rng, (size_t)OC * IC, 0.05);
  auto d_x = to_device_bf16(x);
  auto d_w = to_device_bf16(w);
  DeviceBuffer<bf16> out1((size_t)1010 * OC), out2((size_t)1010 * OC), ref((size_t)1010 * OC);
  tt::cuda::GemmHandle heuristic;
  tt::cuda::matmul_forward(heuristic, ref.data(), d_x.data(), d_w.data(), 1000, IC, OC);

  tt::cuda::GemmHandle h1;
  h1.set_autotune(true);
  tt::cuda::matmul_forward(h1, out1.data(), d_x.data(), d_w.data(), 1000, IC, OC);
  sync_and_check();
  EXPECT_EQ(h1.tune_stats().tuned_plans, 1);
  EXPECT_EQ(to_host(out1), to_host(ref)) << "a pending winner does not run yet";
  EXPECT_TRUE(h1.tuned().empty());
  tt::cuda::matmul_forward(h1, out1.data(), d_x.data(), d_w.data(), 1010, IC, OC);
  EXPECT_EQ(h1.tune_stats().tuned_plans, 1) << "1010 rows share the pending bucket of 1000: not timed again";
  const std::vector<tt::cuda::GemmTuned> won = h1.take_pending();
  ASSERT_EQ(won.size(), 1u);
  EXPECT_EQ(won[0].key[0], 2048);  // m = OC
  EXPECT_EQ(won[0].key[1], 1024);  // n = N: 1000 in the bucket (896, 1024]
  EXPECT_EQ(won[0].key[2], 2048);  // k = IC
  EXPECT_EQ(won[0].key[9], 0);     // a bucket entry, not an exact one
  EXPECT_TRUE(h1.take_pending().empty());
  h1.set_tuned(won);
  tt::cuda::matmul_forward(h1, out1.data(), d_x.data(), d_w.data(), 1010, IC, OC);
  sync_and_check();
  EXPECT_EQ(h1.tune_stats().tuned_plans, 1);
  EXPECT_EQ(h1.tune_stats().reused_plans, 1) << "the adopted winner, without timing";

  tt::cuda::GemmHandle h2;
  h2.set_autotune(true);
  h2.set_tuned(won);
  poison(out2);
  tt::cuda::matmul_forward(h2, out2.data(), d_x.data(), d_w.data(), 1010, IC, OC);
  sync_and_check();
  EXPECT_EQ(h2.tune_stats().tuned_plans, 0);
  EXPECT_EQ(h2.tune_stats().reused_plans, 1);
  EXPECT_EQ(to_host(out2), to_host(out1)) << "the same algorithm: bitwise the same output";

  tt::cuda::GemmHandle h3;  // a resumed run reaching the step that timed the bucket
  h3.set_autotune(true);
  h3.set_hints(won);
  tt::cuda::matmul_forward(h3, out2.data(), d_x.data(), d_w.data(), 1000, IC, OC);
  sync_and_check();
  EXPECT_EQ(h3.tune_stats().tuned_plans, 0);
  EXPECT_EQ(h3.tune_stats().hinted_plans, 1);
  const std::vector<tt::cuda::GemmTuned> replay = h3.take_pending();
  ASSERT_EQ(replay.size(), 1u);
  EXPECT_EQ(replay[0].key, won[0].key);
  EXPECT_EQ(replay[0].algo, won[0].algo);

  h1.set_tuned({});
  EXPECT_EQ(h1.num_plans(), 0);
  tt::cuda::matmul_forward(h1, out1.data(), d_x.data(), d_w.data(), 1010, IC, OC);
  sync_and_check();
  EXPECT_EQ(h1.tune_stats().tuned_plans, 2) << "an emptied table: the bucket is timed again";

  tt::cuda::GemmHandle off;
  off.set_tuned(won);
  off.set_hints(won);
  tt::cuda::matmul_forward(off, out2.data(), d_x.data(), d_w.data(), 1010, IC, OC);
  sync_and_check();
  EXPECT_EQ(off.tune_stats().reused_plans, 0);
  EXPECT_EQ(off.tune_stats().tuned_plans, 0);
  EXPECT_TRUE(off.take_pending().empty());

  const std::string sig = tt::cuda::gemm_tuning_signature();
  EXPECT_NE(sig.find("cublasLt "), std::string::npos) << sig;
  EXPECT_NE(sig.find(", sm_90, "), std::string::npos) << sig;
  std::printf("[ tuning ] signature: %s\n", sig.c_str());
}

}  // namespace
}  // namespace tt::cuda_test
