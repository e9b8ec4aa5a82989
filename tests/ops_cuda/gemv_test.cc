// The fused GEMV forms of a decode step (gemv.h) vs the fp64 CPU reference: the norm + q/k/v
// split, the norm + gate/up + SwiGLU, the residual and the plain forms (one-row shapes of whole
// steps take the streaming kernel, each warp several groups); bad arguments; and the launch order
// under programmatic dependent launch (a chain of dependent kernels enqueued back to back equals
// the same chain with the device synchronized between launches, bit for bit).
//
// Bounds (test_util.h's rule: rel 2^-8 for one final bf16 rounding, abs twice a first-order fp32
// bound). The products are checked against the GPU's own stored norm output n (block 0's copy;
// every block computes it the same way), so they carry only their fp32 accumulation:
//   out: |got - n w^T| <= 2^-8 |ref| + 2 (IC + 2) u32 sum_k |n_k w_k|  (+ |res| with a residual).
// The norm: ss sums C terms (C u32), rsqrtf and the division a few ulp, two products: rstd within
// 2 (C / 2 + 8) u32 relative, n within 2^-8 |ref| + 2 (C / 2 + 8) u32 |ref|.
// SwiGLU from the GPU's own gate and up: h = g sigmoid(g) u with the fast exp (at most 2 + 1.16 |g|
// ulp) and the fast division (2 ulp): h within 2^-8 |ref| + 2 (8 + 1.16 |g|) u32 |ref|.
#include "ops/cuda/gemv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "base/check.h"
#include "ops/cpu/matmul.h"
#include "ops/cpu/rmsnorm.h"
#include "tests/ops_cuda/test_util.h"

namespace tt::cuda_test {
namespace {

using tt::cuda::GemvNorm;
using tt::cuda::GemvSegment;

class GemvTest : public GpuTest {};

// ref (N, OC) = n w^T and mag = sum_k |n_k w_k| (the fp64 CPU matmul on the values and on their
// magnitudes).
void products(const std::vector<double>& n, const std::vector<double>& w, int N, int IC, int OC,
              std::vector<double>& ref, std::vector<double>& mag) {
  auto abs_of = [](std::vector<double> v) {
    for (double& e : v) e = std::fabs(e);
    return v;
  };
  ref.assign((size_t)N * OC, 0.0);
  mag.assign((size_t)N * OC, 0.0);
  tt::cpu::matmul_forward<double>(ref.data(), n.data(), w.data(), N, IC, OC);
  tt::cpu::matmul_forward<double>(mag.data(), abs_of(n).data(), abs_of(w).data(), N, IC, OC);
}

std::vector<double> scaled(const std::vector<double>& v, double f) {
  std::vector<double> y(v.size());
  for (size_t i = 0; i < v.size(); ++i) y[i] = f * std::fabs(v[i]);
  return y;
}

void check_norm(const std::vector<double>& x, const std::vector<double>& nw, const DeviceBuffer<bf16>& d_n,
                const DeviceBuffer<float>& d_rstd, int N, int C, double eps, double offset) {
  std::vector<double> n((size_t)N * C), rstd(N);
  tt::cpu::rmsnorm_forward<double>(n.data(), rstd.data(), x.data(), nw.data(), N, C, eps, offset);
  const double f = 2.0 * (C / 2.0 + 8) * kF32U;
  EXPECT_TRUE(all_within("rstd", to_host(d_rstd), rstd, 0.0, scaled(rstd, f)));
  EXPECT_TRUE(all_within("n", to_host(d_n), n, kBf16U, scaled(n, f)));
}

struct SplitCase {
  int N, IC;
  std::vector<int> oc;
  double offset;
  std::string name;
};

void run_split(const SplitCase& t) {
  SCOPED_TRACE(t.name);
  const int N = t.N, C = t.IC, S = (int)t.oc.size();
  const double eps = 1e-6;
  std::mt19937_64 rng(77 + N * 3 + C);
  const auto x = randn_bf16(rng, (size_t)N * C);
  const auto nw = randn_bf16(rng, C, 0.5);
  std::vector<std::vector<double>> w(S);
  std::vector<DeviceBuffer<bf16>> d_w, d_out;
  std::vector<GemvSegment> seg;
  for (int s = 0; s < S; ++s) {
    w[s] = randn_bf16(rng, (size_t)t.oc[s] * C, 0.05);
    d_w.push_back(to_device_bf16(w[s]));
    d_out.emplace_back((size_t)N * t.oc[s]);
    poison(d_out.back());
  }
  for (int s = 0; s < S; ++s) seg.push_back(GemvSegment{d_out[s].data(), d_w[s].data(), t.oc[s]});
  auto d_x = to_device_bf16(x);
  auto d_nw = to_device_bf16(nw);
  DeviceBuffer<bf16> d_n((size_t)N * C);
  DeviceBuffer<float> d_rstd(N);
  poison(d_n);
  poison(d_rstd);
  tt::cuda::gemv_split(seg.data(), S, d_x.data(), GemvNorm{d_nw.data(), (float)eps, (float)t.offset, d_n.data(),
                                                           d_rstd.data()},
                       N, C, nullptr);
  sync_and_check();
  check_norm(x, nw, d_n, d_rstd, N, C, eps, t.offset);
  const std::vector<double> n = to_host(d_n);
  for (int s = 0; s < S; ++s) {
    std::vector<double> ref, mag;
    products(n, w[s], N, C, t.oc[s], ref, mag);
    EXPECT_TRUE(all_within("segment " + std::to_string(s), to_host(d_out[s]), ref, kBf16U,
                           scaled(mag, 2.0 * (C + 2) * kF32U)));
  }
}

TEST_F(GemvTest, NormSplitMatchesCpu) {
  for (const SplitCase& t : {SplitCase{1, 2048, {2048, 1024, 1024}, 0.0, "qwen3_1p7b_qkv"},
                             SplitCase{3, 512, {520, 72, 8}, 1.0, "three_rows_offset"},
                             SplitCase{8, 4096, {1001, 7, 129}, 0.0, "eight_rows_odd_segments_64k_smem"},
                             SplitCase{2, 1024, {33}, 0.0, "one_odd_segment"},
                             // a lane reads more vectors than it loads before the wait (main loop)
                             SplitCase{3, 4096, {4096, 512, 512}, 0.0, "three_rows_long_lanes"},
                             // rows of exactly 48 KB: with the static shared memory, past the default
                             SplitCase{6, 4096, {64}, 0.0, "48k_rows_six"},
                             SplitCase{8, 3072, {24, 8}, 1.0, "48k_rows_eight"},
                             // one row, rows of whole steps: the streaming kernel, ~5 groups a warp
                             // (its grid is the blocks the GPU holds), the last column pair split
                             SplitCase{1, 1024, {20001, 3, 1024}, 1.0, "one_row_streamed_groups"}})
    run_split(t);
}

TEST_F(GemvTest, NormSwigluMatchesCpu) {
  struct Case {
    int N, IC, I;
    bool store;
    double offset;
  };
  for (const Case& t : {Case{1, 2048, 6144, false, 0.0}, Case{5, 1024, 1001, true, 1.0}, Case{8, 256, 40, true, 0.0}}) {
    SCOPED_TRACE(std::to_string(t.N) + "x" + std::to_string(t.IC) + " I " + std::to_string(t.I));
    const int N = t.N, C = t.IC, I = t.I;
    const double eps = 1e-5;
    std::mt19937_64 rng(5 + N + C + I);
    const auto x = randn_bf16(rng, (size_t)N * C);
    const auto nw = randn_bf16(rng, C, 0.5);
    const auto wg = randn_bf16(rng, (size_t)I * C, 0.05), wu = randn_bf16(rng, (size_t)I * C, 0.05);
    auto d_x = to_device_bf16(x);
    auto d_nw = to_device_bf16(nw);
    auto d_wg = to_device_bf16(wg);
    auto d_wu = to_device_bf16(wu);
    DeviceBuffer<bf16> d_n((size_t)N * C), d_gate((size_t)N * I), d_up((size_t)N * I), d_h((size_t)N * I);
    DeviceBuffer<float> d_rstd(N);
    for (auto* b : {&d_n, &d_gate, &d_up, &d_h}) poison(*b);
    poison(d_rstd);
    tt::cuda::gemv_swiglu(d_h.data(), d_gate.data(), d_up.data(), d_x.data(),
                          GemvNorm{d_nw.data(), (float)eps, (float)t.offset, d_n.data(), d_rstd.data()}, d_wg.data(),
                          d_wu.data(), N, C, I, nullptr);
    sync_and_check();
    check_norm(x, nw, d_n, d_rstd, N, C, eps, t.offset);
    const std::vector<double> n = to_host(d_n), gate = to_host(d_gate), up = to_host(d_up), h = to_host(d_h);
    std::vector<double> ref, mag;
    products(n, wg, N, C, I, ref, mag);
    EXPECT_TRUE(all_within("gate", gate, ref, kBf16U, scaled(mag, 2.0 * (C + 2) * kF32U)));
    products(n, wu, N, C, I, ref, mag);
    EXPECT_TRUE(all_within("up", up, ref, kBf16U, scaled(mag, 2.0 * (C + 2) * kF32U)));
    std::vector<double> h_ref(h.size()), h_abs(h.size());
    for (size_t i = 0; i < h.size(); ++i) {
      h_ref[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
      h_abs[i] = 2.0 * (8 + 1.16 * std::fabs(gate[i])) * kF32U * std::fabs(h_ref[i]);
    }
    EXPECT_TRUE(all_within("h", h, h_ref, kBf16U, h_abs));
    if (!t.store) {  // gate and up not stored: h is the same
      DeviceBuffer<bf16> d_h2((size_t)N * I);
      poison(d_h2);
      tt::cuda::gemv_swiglu(d_h2.data(), nullptr, nullptr, d_x.data(),
                            GemvNorm{d_nw.data(), (float)eps, (float)t.offset, nullptr, nullptr}, d_wg.data(),
                            d_wu.data(), N, C, I, nullptr);
      sync_and_check();
      EXPECT_TRUE(all_equal("h without gate/up", to_host(d_h2), h));
    }
  }
}

TEST_F(GemvTest, ResidualMatchesCpu) {
  struct Case {
    int N, IC, OC;
  };
  // 1 x 2816 x 4100: one warp a column pair, 11 vectors a lane (8 before the wait, 3 in the tail)
  // 1 x 1024 x 8193: the streaming kernel (one slice, whole steps), an odd last column; 1 x 2048 x
  // 2048 (o_proj): streamed with fewer groups than warps
  for (const Case& t : {Case{1, 6144, 2048}, Case{7, 2048, 1003}, Case{4, 40, 1}, Case{1, 2816, 4100},
                        Case{1, 1024, 8193}, Case{1, 2048, 2048}}) {
    SCOPED_TRACE(std::to_string(t.N) + "x" + std::to_string(t.IC) + " OC " + std::to_string(t.OC));
    const int N = t.N, IC = t.IC, OC = t.OC;
    std::mt19937_64 rng(11 + N + IC + OC);
    const auto x = randn_bf16(rng, (size_t)N * IC);
    const auto w = randn_bf16(rng, (size_t)OC * IC, 0.05);
    const auto res = randn_bf16(rng, (size_t)N * OC, 2.0);
    auto d_x = to_device_bf16(x);
    auto d_w = to_device_bf16(w);
    auto d_res = to_device_bf16(res);
    DeviceBuffer<bf16> d_out((size_t)N * OC);
    poison(d_out);
    tt::cuda::gemv_residual(d_out.data(), d_res.data(), d_x.data(), d_w.data(), N, IC, OC, nullptr);
    sync_and_check();
    std::vector<double> ref, mag;
    products(x, w, N, IC, OC, ref, mag);
    std::vector<double> abs(ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      ref[i] += res[i];
      abs[i] = 2.0 * (IC + 2) * kF32U * (mag[i] + std::fabs(res[i]));
    }
    EXPECT_TRUE(all_within("out", to_host(d_out), ref, kBf16U, abs));
  }
}

// The plain forms (the LM head's): bf16 and fp32 out, one row of whole steps (the streaming
// kernel, ~2 groups a warp, an odd last column) and three rows (gemv_kernel).
TEST_F(GemvTest, PlainMatchesCpu) {
  struct Case {
    int N, IC, OC;
  };
  for (const Case& t : {Case{1, 1024, 8191}, Case{3, 1024, 1001}}) {
    SCOPED_TRACE(std::to_string(t.N) + "x" + std::to_string(t.IC) + " OC " + std::to_string(t.OC));
    const int N = t.N, IC = t.IC, OC = t.OC;
    std::mt19937_64 rng(5 + N + IC + OC);
    const auto x = randn_bf16(rng, (size_t)N * IC);
    const auto w = randn_bf16(rng, (size_t)OC * IC, 0.05);
    auto d_x = to_device_bf16(x);
    auto d_w = to_device_bf16(w);
    DeviceBuffer<bf16> d_out((size_t)N * OC);
    DeviceBuffer<float> d_out32((size_t)N * OC);
    poison(d_out);
    poison(d_out32);
    tt::cuda::gemv_forward(d_out.data(), d_x.data(), d_w.data(), N, IC, OC, nullptr);
    tt::cuda::gemv_forward(d_out32.data(), d_x.data(), d_w.data(), N, IC, OC, nullptr);
    sync_and_check();
    std::vector<double> ref, mag;
    products(x, w, N, IC, OC, ref, mag);
    const std::vector<double> abs = scaled(mag, 2.0 * (IC + 2) * kF32U);
    EXPECT_TRUE(all_within("bf16 out", to_host(d_out), ref, kBf16U, abs));
    EXPECT_TRUE(all_within("fp32 out", to_host(d_out32), ref, 0.0, abs));
  }
}

// A chain of dependent launches (each reads the previous one's output) enqueued back to back
// equals the same chain with the device synchronized after every launch: the programmatic
// dependent launch waits for what it reads.
TEST_F(GemvTest, DependentLaunchesReadTheirInputs) {
  const int N = 2, C = 1024, I = 2816, steps = 12;
  std::mt19937_64 rng(99);
  const auto x0 = randn_bf16(rng, (size_t)N * C);
  const auto nw = randn_bf16(rng, C, 0.5);
  const auto wg = randn_bf16(rng, (size_t)I * C, 0.05), wu = randn_bf16(rng, (size_t)I * C, 0.05);
  const auto wd = randn_bf16(rng, (size_t)C * I, 0.05), wq = randn_bf16(rng, (size_t)C * C, 0.05);
  auto d_nw = to_device_bf16(nw);
  auto d_wg = to_device_bf16(wg), d_wu = to_device_bf16(wu), d_wd = to_device_bf16(wd), d_wq = to_device_bf16(wq);
  auto run = [&](bool sync_each) {
    auto a = to_device_bf16(x0);
    DeviceBuffer<bf16> b((size_t)N * C), q((size_t)N * C), h((size_t)N * I);
    for (int s = 0; s < steps; ++s) {
      // a -> h (norm, gate/up, swiglu) -> b = a + h wd^T -> q = norm(b) wq^T -> a = b + q wq^T
      tt::cuda::gemv_swiglu(h.data(), nullptr, nullptr, a.data(), GemvNorm{d_nw.data(), 1e-6f, 0.f, nullptr, nullptr},
                            d_wg.data(), d_wu.data(), N, C, I, nullptr);
      if (sync_each) sync_and_check();
      tt::cuda::gemv_residual(b.data(), a.data(), h.data(), d_wd.data(), N, I, C, nullptr);
      if (sync_each) sync_and_check();
      const GemvSegment seg{q.data(), d_wq.data(), C};
      tt::cuda::gemv_split(&seg, 1, b.data(), GemvNorm{d_nw.data(), 1e-6f, 0.f, nullptr, nullptr}, N, C, nullptr);
      if (sync_each) sync_and_check();
      tt::cuda::gemv_residual(a.data(), b.data(), q.data(), d_wq.data(), N, C, C, nullptr);
      if (sync_each) sync_and_check();
    }
    sync_and_check();
    return to_host(a);
  };
  const std::vector<double> serial = run(true), chained = run(false);
  double norm = 0;
  for (double v : serial) norm += v * v;
  EXPECT_GT(norm, 0.0);
  EXPECT_TRUE(all_equal("back-to-back vs synchronized", chained, serial));
}

TEST_F(GemvTest, BadArgumentsAreErrors) {
  DeviceBuffer<bf16> x(8 * 8192), w(64 * 8192), out(8 * 64), nw(8192);
  const GemvSegment seg{out.data(), w.data(), 64};
  const GemvSegment four[4] = {seg, seg, seg, seg};
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const tt::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { tt::cuda::gemv_split(four, 4, x.data(), GemvNorm{}, 1, 1024, nullptr); })
                .find("4 segments, expected 1 to 3"),
            std::string::npos);
  EXPECT_NE(message([&] {
              tt::cuda::gemv_split(&seg, 1, x.data(), GemvNorm{nw.data(), 1e-6f, 0.f, nullptr, nullptr}, 8, 8192,
                                   nullptr);
            }).find("a fused norm of 8 rows of 8192"),
            std::string::npos);
  EXPECT_NE(message([&] { tt::cuda::gemv_residual(out.data(), out.data(), x.data(), w.data(), 9, 64, 64, nullptr); })
                .find("N=9"),
            std::string::npos);
  EXPECT_NE(message([&] { tt::cuda::gemv_residual(out.data(), out.data(), x.data(), w.data(), 1, 60, 64, nullptr); })
                .find("IC=60"),
            std::string::npos);
}

}  // namespace
}  // namespace tt::cuda_test
