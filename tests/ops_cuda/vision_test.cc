// The vision tower's CUDA ops (ops/cuda/vision.h) against the fp64 CPU reference (ops/cpu/vision.h):
// LayerNorm forward and backward, GELU (tanh and erf) forward and backward, biases, the row moves
// and patchify, on tower shapes (C = 768, 196-token frames), odd widths and one-row cases.
//
// Bounds (test_util.h's rule: |got - ref| <= rel |ref| + abs, rel = 2^-8 for a bf16 result). With
// u = 2^-24 and n_s = C / 32 + 8 the sequential adds of a warp's row sum (C / 32 per lane, 5 tree
// levels, the division):
//   LayerNorm mean: error dm <= n_s u mean|x|; rstd relative error dr <= 2 (n_s + 4) u + 2^-21
//     (the variance sums (x - mean)^2 like the mean, then rsqrtf).
//   out: abs 2 ((|x - mean| dr + dm) rstd |w| + 3 u (|xhat w| + |b|)).
//   dx:  T = rstd (|g| + mean|g| + |xhat| mean|g xhat| + (dm rstd) mean|g|), g = dout w:
//        abs 2 (3 dr + (n_s + 4) u) T + 2 u |old|.
//   dw, db: fp32 old + sum over rows, at most 64 + chunks sequential adds:
//        abs 2 ((64 + chunks + 3) u + dr) sum|dout xhat| + 2 dm rstd sum|dout| (dw), 2 (64 + chunks) u sum|dout| (db).
//   GELU: __expf's relative error (4 + 1.2 |z|) u at z = 2 sqrt(2/pi) (x + 0.044715 x^3) (tanh), erfcf's
//        4 ulp and __expf at x^2 / 2 (erf): d_f; out abs 2 (d_f + 4 u) |x|; dx abs 2 (3 d_f + 8 u)
//        (|gelu'| + |x| s (1 - s) |2 u'|) |dy| (tanh) or (|gelu'| + |x phi(x)|) |dy| (erf), + 2 u |old|.
//   bias_add: one fp32 add, then bf16 (or fp32): abs 2 u (|out| + |b|). bias_backward: as db.
//   sum_rows: k sequential fp32 adds then bf16: abs 2 k u sum|src|. copy_rows, zero_rows: exact.
//   patchify: one bf16 rounding of each pixel.
#include "ops/cuda/vision.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "base/check.h"
#include "ops/cpu/vision.h"
#include "tests/ops_cuda/test_util.h"

namespace tt::cuda_test {
namespace {

using tt::cuda::Workspace;

constexpr double kEps = 1e-6;

struct Shape {
  int rows, C;
  std::string name;
};

class LayerNormTest : public GpuTest, public ::testing::WithParamInterface<Shape> {};

TEST_P(LayerNormTest, ForwardAndBackwardMatchCpu) {
  const int rows = GetParam().rows, C = GetParam().C;
  std::mt19937_64 rng(7 + rows * 31 + C);
  std::vector<double> x = randn_bf16(rng, (size_t)rows * C, 2.0);
  for (int r = 0; r < rows; r += 3)  // rows with a large common offset: the mean matters
    for (int c = 0; c < C; ++c) x[(size_t)r * C + c] = tt::cuda::round_to_bf16((float)(x[(size_t)r * C + c] + 5.0));
  const std::vector<double> w = randn_bf16(rng, C), b = randn_bf16(rng, C), dout = randn_bf16(rng, (size_t)rows * C);
  const std::vector<double> old = randn_bf16(rng, (size_t)rows * C), dw0 = randn_f32(rng, C), db0 = randn_f32(rng, C);

  std::vector<double> out(x.size()), mean(rows), rstd(rows);
  tt::cpu::layernorm_forward<double>(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, C, kEps);
  std::vector<double> dx_acc = old, dx_new(x.size(), 0.0), dw = dw0, db = db0;
  tt::cpu::layernorm_backward<double>(dx_acc.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                                      rstd.data(), rows, C);
  tt::cpu::layernorm_backward<double>(dx_new.data(), nullptr, nullptr, dout.data(), x.data(), w.data(), mean.data(),
                                      rstd.data(), rows, C);

  auto d_x = to_device_bf16(x), d_w = to_device_bf16(w), d_b = to_device_bf16(b), d_do = to_device_bf16(dout);
  DeviceBuffer<bf16> d_out(x.size());
  DeviceBuffer<float> d_mean(rows), d_rstd(rows);
  poison(d_out);
  poison(d_mean);
  poison(d_rstd);
  tt::cuda::layernorm_forward(d_out.data(), d_mean.data(), d_rstd.data(), d_x.data(), d_w.data(), d_b.data(), rows, C,
                              kEps, nullptr);
  auto d_dx = to_device_bf16(old);
  DeviceBuffer<bf16> d_dx_new(x.size());
  poison(d_dx_new);
  auto d_dw = to_device_f32(dw0), d_db = to_device_f32(db0);
  DeviceBuffer<char> ws(tt::cuda::layernorm_backward_workspace_bytes(rows, C));
  const Workspace W{ws.data(), ws.size()};
  tt::cuda::layernorm_backward(d_dx.data(), d_dw.data(), d_db.data(), d_do.data(), d_x.data(), d_w.data(),
                               d_mean.data(), d_rstd.data(), rows, C, /*accumulate_dx=*/true, W, nullptr);
  tt::cuda::layernorm_backward(d_dx_new.data(), nullptr, nullptr, d_do.data(), d_x.data(), d_w.data(), d_mean.data(),
                               d_rstd.data(), rows, C, /*accumulate_dx=*/false, W, nullptr);
  sync_and_check();

  const double ns = C / 32.0 + 8, chunks = (rows + 63) / 64;
  const double dr = 2 * (ns + 4) * kF32U + std::ldexp(1.0, -21);
  std::vector<double> a_out(x.size()), a_mean(rows), a_rstd(rows), a_dx(x.size()), a_dxn(x.size()), a_dw(C), a_db(C);
  std::vector<double> sdx(C, 0.0), sd(C, 0.0);
  for (int r = 0; r < rows; ++r) {
    double ma = 0, mg = 0, mgx = 0;
    for (int c = 0; c < C; ++c) ma += std::fabs(x[(size_t)r * C + c]) / C;
    for (int c = 0; c < C; ++c) {
      const size_t i = (size_t)r * C + c;
      const double xh = (x[i] - mean[r]) * rstd[r], g = dout[i] * w[c];
      mg += std::fabs(g) / C;
      mgx += std::fabs(g * xh) / C;
    }
    const double dm = ns * kF32U * ma;
    a_mean[r] = 2 * dm;
    a_rstd[r] = 2 * dr * rstd[r];
    for (int c = 0; c < C; ++c) {
      const size_t i = (size_t)r * C + c;
      const double xh = (x[i] - mean[r]) * rstd[r], g = dout[i] * w[c];
      a_out[i] = 2 * ((std::fabs(x[i] - mean[r]) * dr + dm) * rstd[r] * std::fabs(w[c]) +
                      3 * kF32U * (std::fabs(xh * w[c]) + std::fabs(b[c])));
      const double T = rstd[r] * (std::fabs(g) + mg + std::fabs(xh) * mgx + dm * rstd[r] * mg);
      a_dxn[i] = 2 * (3 * dr + (ns + 4) * kF32U) * T;
      a_dx[i] = a_dxn[i] + 2 * kF32U * std::fabs(old[i]);
      sdx[c] += std::fabs(dout[i] * xh);
      sd[c] += std::fabs(dout[i]);
      a_dw[c] += 2 * dm * rstd[r] * std::fabs(dout[i]);
    }
  }
  for (int c = 0; c < C; ++c) {
    a_dw[c] += 2 * ((64 + chunks + 3) * kF32U + dr) * sdx[c] + 2 * kF32U * std::fabs(dw0[c]);
    a_db[c] = 2 * (64 + chunks) * kF32U * sd[c] + 2 * kF32U * std::fabs(db0[c]);
  }
  EXPECT_TRUE(all_within("out", to_host(d_out), out, kBf16U, a_out));
  EXPECT_TRUE(all_within("mean", to_host(d_mean), mean, kF32U, a_mean));
  EXPECT_TRUE(all_within("rstd", to_host(d_rstd), rstd, kF32U, a_rstd));
  EXPECT_TRUE(all_within("dx (accumulated)", to_host(d_dx), dx_acc, kBf16U, a_dx));
  EXPECT_TRUE(all_within("dx (overwritten)", to_host(d_dx_new), dx_new, kBf16U, a_dxn));
  EXPECT_TRUE(all_within("dw", to_host(d_dw), dw, kF32U, a_dw));
  EXPECT_TRUE(all_within("db", to_host(d_db), db, kF32U, a_db));

  // The parameter gradients are reduced in a fixed order: a second run adds bitwise the same.
  const std::vector<double> dw1 = to_host(d_dw), db1 = to_host(d_db);
  auto e_dw = to_device_f32(dw0), e_db = to_device_f32(db0);
  tt::cuda::layernorm_backward(nullptr, e_dw.data(), e_db.data(), d_do.data(), d_x.data(), d_w.data(), d_mean.data(),
                               d_rstd.data(), rows, C, true, W, nullptr);
  sync_and_check();
  EXPECT_TRUE(all_equal("dw (second run)", to_host(e_dw), dw1));
  EXPECT_TRUE(all_equal("db (second run)", to_host(e_db), db1));
}

INSTANTIATE_TEST_SUITE_P(Shapes, LayerNormTest,
                         ::testing::Values(Shape{1, 768, "one_row"}, Shape{196 * 3, 768, "tower"},
                                           Shape{77, 37, "odd"}, Shape{130, 3072, "wide"},
                                           Shape{5, 8, "narrow"}),
                         [](const ::testing::TestParamInfo<Shape>& i) { return i.param.name; });

class GeluTest : public GpuTest, public ::testing::WithParamInterface<bool> {};

TEST_P(GeluTest, ForwardAndBackwardMatchCpu) {
  const bool tanh = GetParam();
  const int64_t n = 20011;
  std::mt19937_64 rng(tanh ? 3 : 4);
  std::vector<double> x = randn_bf16(rng, n, 3.0);
  const double tails[] = {0, -0.0, 12, -12, 40, -40, 100, -100, 1e-3, -1e-3};
  for (int i = 0; i < 10; ++i) x[i] = tails[i];
  const std::vector<double> dy = randn_bf16(rng, n), old = randn_bf16(rng, n);
  std::vector<double> y(n), dx = old;
  if (tanh) {
    tt::cpu::gelu_tanh_forward<double>(y.data(), x.data(), n);
    tt::cpu::gelu_tanh_backward<double>(dx.data(), dy.data(), x.data(), n);
  } else {
    tt::cpu::gelu_erf_forward<double>(y.data(), x.data(), n);
    tt::cpu::gelu_erf_backward<double>(dx.data(), dy.data(), x.data(), n);
  }
  auto d_x = to_device_bf16(x), d_dy = to_device_bf16(dy), d_dx = to_device_bf16(old);
  DeviceBuffer<bf16> d_y(n);
  poison(d_y);
  tt::cuda::gelu_forward(d_y.data(), d_x.data(), n, tanh, nullptr);
  tt::cuda::gelu_backward(d_dx.data(), d_dy.data(), d_x.data(), n, tanh, /*accumulate=*/true, nullptr);
  sync_and_check();
  std::vector<double> a_y(n), a_dx(n);
  const double k = std::sqrt(2.0 / M_PI);
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    double df, terms;
    if (tanh) {
      const double z = 2 * k * (v + 0.044715 * v * v * v), s = 1 / (1 + std::exp(-z));
      df = (4 + 1.2 * std::fabs(z)) * kF32U;
      terms = s + std::fabs(v) * s * (1 - s) * 2 * k * (1 + 3 * 0.044715 * v * v);
    } else {
      df = 4 * kF32U + (4 + 1.2 * 0.5 * v * v) * kF32U;
      terms = 0.5 * std::erfc(-v / std::sqrt(2.0)) + std::fabs(v) * std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI);
    }
    a_y[i] = 2 * (df + 4 * kF32U) * std::fabs(v) + 1e-37;  // fp32 flushes results below 2^-126
    a_dx[i] = 2 * (3 * df + 8 * kF32U) * terms * std::fabs(dy[i]) + 2 * kF32U * std::fabs(old[i]) + 1e-37;
  }
  EXPECT_TRUE(all_within("gelu", to_host(d_y), y, kBf16U, a_y));
  EXPECT_TRUE(all_within("gelu dx", to_host(d_dx), dx, kBf16U, a_dx));
}

INSTANTIATE_TEST_SUITE_P(Forms, GeluTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "tanh" : "erf"; });

class BiasTest : public GpuTest, public ::testing::WithParamInterface<Shape> {};

// A Linear's bias (rows = tokens, C = width) and the position embedding as one (rows = frames,
// C = tokens per frame x width).
TEST_P(BiasTest, AddAndBackwardMatchCpu) {
  const int rows = GetParam().rows, C = GetParam().C;
  std::mt19937_64 rng(11 + rows + C);
  const std::vector<double> out0 = randn_bf16(rng, (size_t)rows * C), b = randn_bf16(rng, C);
  const std::vector<double> db0 = randn_f32(rng, C);
  std::vector<double> out = out0, db = db0;
  tt::cpu::bias_add<double>(out.data(), b.data(), rows, C);
  tt::cpu::bias_backward<double>(db.data(), out0.data(), rows, C);
  auto d_out = to_device_bf16(out0), d_b = to_device_bf16(b);
  auto d_f32 = to_device_f32(out0), d_db = to_device_f32(db0), d_db2 = to_device_f32(db0), d_db3 = to_device_f32(db0);
  tt::cuda::bias_add(d_out.data(), d_b.data(), rows, C, nullptr);
  tt::cuda::bias_add(d_f32.data(), d_b.data(), rows, C, nullptr);
  DeviceBuffer<char> ws(tt::cuda::bias_backward_workspace_bytes(rows, C));
  const Workspace W{ws.data(), ws.size()};
  auto d_src = to_device_bf16(out0);
  tt::cuda::bias_backward(d_db.data(), d_src.data(), rows, C, W, nullptr);
  tt::cuda::bias_backward(d_db2.data(), d_src.data(), rows, C, W, nullptr);
  tt::cuda::bias_backward(d_db2.data(), d_src.data(), rows, C, W, nullptr);
  tt::cuda::bias_backward(d_db3.data(), d_src.data(), rows, C, W, nullptr);
  sync_and_check();
  std::vector<double> a_out((size_t)rows * C), a_db(C), db_twice(C);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < C; ++c) a_out[(size_t)r * C + c] = 2 * kF32U * (std::fabs(out0[(size_t)r * C + c]) + std::fabs(b[c]));
  const double chunks = (rows + 63) / 64;
  for (int c = 0; c < C; ++c) {
    double s = 0;
    for (int r = 0; r < rows; ++r) s += std::fabs(out0[(size_t)r * C + c]);
    a_db[c] = 2 * (64 + chunks) * kF32U * s + 2 * kF32U * std::fabs(db0[c]);
    db_twice[c] = db0[c] + 2 * (db[c] - db0[c]);
  }
  EXPECT_TRUE(all_within("bias_add bf16", to_host(d_out), out, kBf16U, a_out));
  EXPECT_TRUE(all_within("bias_add fp32", to_host(d_f32), out, kF32U, a_out));
  EXPECT_TRUE(all_within("bias_backward", to_host(d_db), db, kF32U, a_db));
  for (double& a : a_db) a *= 2;
  EXPECT_TRUE(all_within("bias_backward (accumulated twice)", to_host(d_db2), db_twice, kF32U, a_db));
  EXPECT_TRUE(all_equal("bias_backward determinism", to_host(d_db3), to_host(d_db)));
}

INSTANTIATE_TEST_SUITE_P(Shapes, BiasTest,
                         ::testing::Values(Shape{1, 768, "one_row"}, Shape{1000, 768, "linear"},
                                           Shape{3, 196 * 768, "positions"}, Shape{70, 13, "odd"}),
                         [](const ::testing::TestParamInfo<Shape>& i) { return i.param.name; });

TEST_F(GpuTest, RowMovesMatchCpu) {
  const int C = 77, src_rows_n = 40, dst_n = 30;
  std::mt19937_64 rng(5);
  const std::vector<double> src = randn_bf16(rng, (size_t)src_rows_n * C), dst0 = randn_bf16(rng, (size_t)dst_n * C);
  std::vector<int32_t> to = {3, 17, 0, 29}, from = {39, 0, 5, 5}, zero = {1, 17};
  // CSR: row d sums d % 4 sources (row 0 and every fourth: none), repeated sources allowed.
  std::vector<int32_t> off = {0}, list;
  for (int d = 0; d < dst_n; ++d) {
    for (int k = 0; k < d % 4; ++k) list.push_back((d * 7 + k * 13) % src_rows_n);
    if (d == 5) list.push_back(list.back());
    off.push_back((int32_t)list.size());
  }
  std::vector<double> copied = dst0, summed(dst0.size()), zeroed = dst0;
  tt::cpu::copy_rows<double>(copied.data(), to.data(), src.data(), from.data(), (int)to.size(), C);
  tt::cpu::sum_rows<double>(summed.data(), src.data(), off.data(), list.data(), dst_n, C);
  tt::cpu::zero_rows<double>(zeroed.data(), zero.data(), (int)zero.size(), C);
  auto d_src = to_device_bf16(src), d_copy = to_device_bf16(dst0), d_zero = to_device_bf16(dst0);
  DeviceBuffer<bf16> d_sum(dst0.size());
  poison(d_sum);
  DeviceBuffer<int32_t> d_to(to.size()), d_from(from.size()), d_z(zero.size()), d_off(off.size()), d_list(list.size());
  d_to.copy_from_host(to);
  d_from.copy_from_host(from);
  d_z.copy_from_host(zero);
  d_off.copy_from_host(off);
  d_list.copy_from_host(list);
  tt::cuda::copy_rows(d_copy.data(), d_to.data(), d_src.data(), d_from.data(), (int)to.size(), C, nullptr);
  tt::cuda::sum_rows(d_sum.data(), d_src.data(), d_off.data(), d_list.data(), dst_n, C, nullptr);
  tt::cuda::zero_rows(d_zero.data(), d_z.data(), (int)zero.size(), C, nullptr);
  sync_and_check();
  std::vector<double> a_sum(summed.size());
  for (int d = 0; d < dst_n; ++d)
    for (int c = 0; c < C; ++c) {
      double s = 0;
      for (int k = off[d]; k < off[d + 1]; ++k) s += std::fabs(src[(size_t)list[k] * C + c]);
      a_sum[(size_t)d * C + c] = 2 * (off[d + 1] - off[d]) * kF32U * s;
    }
  EXPECT_TRUE(all_equal("copy_rows", to_host(d_copy), copied));
  EXPECT_TRUE(all_within("sum_rows", to_host(d_sum), summed, kBf16U, a_sum));
  EXPECT_TRUE(all_equal("zero_rows", to_host(d_zero), zeroed));
}

TEST_F(GpuTest, PatchifyMatchesCpu) {
  const int F = 3, S = 32, p = 8, K = 3 * p * p, P = (S / p) * (S / p);
  std::mt19937_64 rng(6);
  const std::vector<double> px = randn_f32(rng, (size_t)F * 3 * S * S);
  std::vector<double> ref((size_t)F * P * K);
  for (int f = 0; f < F; ++f)
    tt::cpu::patchify<double>(ref.data() + (size_t)f * P * K, px.data() + (size_t)f * 3 * S * S, S, S, p);
  auto d_px = to_device_f32(px);
  DeviceBuffer<bf16> out(ref.size());
  poison(out);
  tt::cuda::patchify(out.data(), d_px.data(), F, S, p, nullptr);
  sync_and_check();
  EXPECT_TRUE(all_within("patchify", to_host(out), ref, kBf16U, {}));
}

// Bad arguments are refused before anything is enqueued, naming the op.
TEST(VisionOpsChecks, RejectBadArguments) {
  auto throws_naming = [](auto&& fn, const std::string& op) {
    try {
      fn();
    } catch (const tt::Error& e) {
      return std::string(e.what()).find(op) != std::string::npos;
    }
    return false;
  };
  alignas(16) static bf16 buf[64];
  static float f[64];
  EXPECT_TRUE(throws_naming([] { tt::cuda::patchify(buf, f, 1, 30, 8, nullptr); }, "patchify"));
  EXPECT_TRUE(throws_naming([] { tt::cuda::patchify(buf, nullptr, 1, 32, 8, nullptr); }, "patchify"));
  EXPECT_TRUE(throws_naming([] { tt::cuda::layernorm_forward(buf, f, f, buf, buf, buf, -1, 8, 1e-6, nullptr); },
                            "layernorm_forward"));
  EXPECT_TRUE(throws_naming([] { tt::cuda::layernorm_forward(buf, f, f, nullptr, buf, buf, 2, 8, 1e-6, nullptr); },
                            "layernorm_forward"));
  EXPECT_TRUE(throws_naming([] { tt::cuda::bias_backward(f, buf, 4, 8, Workspace{}, nullptr); }, "bias_backward"));
  EXPECT_TRUE(throws_naming([] { tt::cuda::gelu_forward(buf, nullptr, 8, true, nullptr); }, "gelu_forward"));
  EXPECT_TRUE(throws_naming([] { tt::cuda::sum_rows(buf, buf, nullptr, nullptr, 3, 8, nullptr); }, "sum_rows"));
  EXPECT_NO_THROW(tt::cuda::copy_rows(nullptr, nullptr, nullptr, nullptr, 0, 8, nullptr));  // empty: nothing to do
}

}  // namespace
}  // namespace tt::cuda_test
