// The vision tower's CUDA ops (ops/cuda/vision.h) against the fp64 CPU reference (ops/cpu/vision.h):
// LayerNorm forward and backward (bf16 and fp32 dout), GELU (tanh and erf), biases, the row moves
// and patchify, on tower shapes (C = 768, 1152, 196-token frames as one bias row), odd widths, rows
// too long for registers (3072, 8192), one-row cases and buffers offset by one element (not
// 16-byte aligned: the scalar paths of C % 8 == 0 shapes); determinism of the parameter gradients
// (a rerun, and a rerun from unaligned copies, add bitwise the same); argument checks.
//
// Bounds (test_util.h's rule: |got - ref| <= rel |ref| + abs, rel = 2^-8 for a bf16 result, 2^-24
// for fp32; abs twice a first-order bound of the fp32 arithmetic; u = 2^-24).
//   Row statistics: a lane adds at most C/32 + 8 values in sequence (VEC 8 rounds its share up to
//     whole groups; a block per row: C/256), then 5 warp levels (+ 5 block levels), then the
//     division (2 ulp under --use_fast_math): n_s = C/32 + 16 rounding steps.
//   mean: dm = n_s u mean|x|. rstd: the deviations' squares (3u), their sum (n_s u), the division,
//     + eps (3u) and half of that through the square root, plus rsqrtf's 2 ulp:
//     dr = (n_s + 7) u / 2 + 2^-22 relative (the mean's error cancels to first order: the
//     deviations sum to zero).
//   out = (x - mean) rstd w + b:  abs 2 ((|x - mean| dr + dm) rstd |w| + 3u (|xhat w| + |b|)).
//   dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dout w (exact for bf16 dout, u for fp32):
//     T = rstd (|g| + mean|g| + |xhat| mean|g xhat|), D = rstd^2 dm (|xhat| mean|g| + mean|g xhat|)
//     (the mean's error through xhat): abs 2 ((3 dr + (n_s + 7) u) T + D), + 2u |old| accumulated.
//   dw, db: at most n_add = rows + 256 + G + 9 sequential adds per column (a chunk's rows per
//     thread, up to 256 row strides of a stage-1 block, G / 8 chunks per stage-2 lane, 8 lanes,
//     the add into the gradient; G = the row chunks, <= 1024):
//     dw abs 2 ((n_add + 3) u + dr) sum|dout xhat| + 2 sum_rows dm rstd |dout| + 2u |old|;
//     db abs 2 n_add u sum|dout| + 2u |old|. bias_backward as db.
//   GELU: the sigmoid (tanh form) from __expf at z = 2 sqrt(2/pi) (x + 0.044715 x^3) carries
//     d_f = (4 + 1.2 |z|) u relative (z's roundings grow with |z| through exp), erfcf 4 ulp plus
//     __expf at x^2 / 2 (erf form): d_f = (8 + 0.6 x^2) u; y abs 2 (d_f + 4u) |x|; dx abs
//     2 (3 d_f + 8u) (|gelu'| + |x| s (1 - s) |2 u'|) |dy| (tanh) or (|Phi| + |x phi|) |dy| (erf),
//     + 2u |old|; --use_fast_math flushes fp32 values below 2^-126 to zero, the sigmoid (or
//     Phi, phi) of a tail included, so each term may also lose 2^-126 times its factor:
//     y: + 2^-125 |x|; dx: + 2^-125 (1 + |x| |2 u'|) |dy| (erf: (1 + |x|) |dy|).
//   bias_add: one fp32 add, then bf16 (or fp32): abs 2u (|out| + |b|).
//   sum_rows: k sequential fp32 adds then bf16: abs 2 k u sum|src|. copy_rows, zero_rows: exact.
//   patchify: one bf16 rounding of each fp32 pixel (rel 2^-8, abs 0).
#include "ops/cuda/vision.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
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

// rows x C; device rows start `offset` elements into their buffers (1: not 16-byte aligned).
struct Shape {
  int rows, C, offset;
  std::string name;
};

std::string shape_name(const ::testing::TestParamInfo<Shape>& i) { return i.param.name; }

// Device copies `offset` elements into their buffer (the leading elements are padding).
std::vector<double> pad(const std::vector<double>& x, int offset) {
  std::vector<double> y((size_t)offset, 0.0);
  y.insert(y.end(), x.begin(), x.end());
  return y;
}

std::vector<double> unpad(std::vector<double> y, int offset) {
  y.erase(y.begin(), y.begin() + offset);
  return y;
}

// Sequential adds of one column sum (see the file comment).
double column_adds(int rows) {
  const double chunks = std::max(1, std::min(1024, (rows + 31) / 32));
  return rows + 256 + chunks + 9;
}

Workspace workspace_of(DeviceBuffer<char>& ws) { return Workspace{ws.data(), ws.size()}; }

class LayerNormTest : public GpuTest, public ::testing::WithParamInterface<Shape> {};

TEST_P(LayerNormTest, ForwardAndBackwardMatchCpu) {
  const int rows = GetParam().rows, C = GetParam().C, off = GetParam().offset;
  const size_t n = (size_t)rows * C;
  std::mt19937_64 rng(7 + rows * 31 + C + off);
  std::vector<double> x = randn_bf16(rng, n, 2.0);
  for (int r = 0; r < rows; r += 3)  // rows with a large common offset: the mean matters
    for (int c = 0; c < C; ++c) x[(size_t)r * C + c] = tt::cuda::round_to_bf16((float)(x[(size_t)r * C + c] + 5.0));
  const std::vector<double> w = randn_bf16(rng, C), b = randn_bf16(rng, C), dout = randn_bf16(rng, n);
  const std::vector<double> dout32 = randn_f32(rng, n), old = randn_bf16(rng, n);
  const std::vector<double> dw0 = randn_f32(rng, C), db0 = randn_f32(rng, C);

  // Reference: forward with and without b; backward from the bf16 dout (dx accumulated into old)
  // and from the fp32 dout (dx from zero).
  std::vector<double> out(n), out_nb(n), mean(rows), rstd(rows);
  tt::cpu::layernorm_forward<double>(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, C, kEps);
  tt::cpu::layernorm_forward<double>(out_nb.data(), mean.data(), rstd.data(), x.data(), w.data(), nullptr, rows, C,
                                     kEps);
  std::vector<double> dx = old, dw = dw0, db = db0, dx32(n, 0.0), dw32 = dw0, db32 = db0;
  tt::cpu::layernorm_backward<double>(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                                      rstd.data(), rows, C);
  tt::cpu::layernorm_backward<double>(dx32.data(), dw32.data(), db32.data(), dout32.data(), x.data(), w.data(),
                                      mean.data(), rstd.data(), rows, C);

  auto d_x = to_device_bf16(pad(x, off)), d_w = to_device_bf16(pad(w, off)), d_b = to_device_bf16(pad(b, off));
  auto d_do = to_device_bf16(pad(dout, off));
  auto d_do32 = to_device_f32(pad(dout32, off));
  DeviceBuffer<bf16> d_out(n + off), d_out_nb(n + off), d_dx32(n + off);
  DeviceBuffer<float> d_mean(rows), d_rstd(rows);
  poison(d_out);
  poison(d_out_nb);
  poison(d_dx32);
  poison(d_mean);
  poison(d_rstd);
  auto d_dx = to_device_bf16(pad(old, off));
  auto d_dw = to_device_f32(dw0), d_db = to_device_f32(db0), d_dw32 = to_device_f32(dw0), d_db32 = to_device_f32(db0);
  DeviceBuffer<char> ws(tt::cuda::layernorm_backward_workspace_bytes(rows, C));
  const Workspace W = workspace_of(ws);
  tt::cuda::layernorm_forward(d_out.data() + off, d_mean.data(), d_rstd.data(), d_x.data() + off, d_w.data() + off,
                              d_b.data() + off, rows, C, kEps, nullptr);
  tt::cuda::layernorm_forward(d_out_nb.data() + off, d_mean.data(), d_rstd.data(), d_x.data() + off,
                              d_w.data() + off, nullptr, rows, C, kEps, nullptr);
  tt::cuda::layernorm_backward(d_dx.data() + off, d_dw.data(), d_db.data(), d_do.data() + off, d_x.data() + off,
                               d_w.data() + off, d_mean.data(), d_rstd.data(), rows, C, /*accumulate_dx=*/true, W,
                               nullptr);
  tt::cuda::layernorm_backward(d_dx32.data() + off, d_dw32.data(), d_db32.data(), d_do32.data() + off,
                               d_x.data() + off, d_w.data() + off, d_mean.data(), d_rstd.data(), rows, C,
                               /*accumulate_dx=*/false, W, nullptr);
  sync_and_check();

  const double ns = C / 32.0 + 16, adds = column_adds(rows);
  const double dr = (ns + 7) / 2 * kF32U + std::ldexp(1.0, -22);
  std::vector<double> a_out(n), a_out_nb(n), a_mean(rows), a_rstd(rows), a_dx(n), a_dx32(n);
  std::vector<double> a_dw(C, 0.0), a_db(C, 0.0), a_dw32(C, 0.0), a_db32(C, 0.0);
  std::vector<double> sdx(C, 0.0), sd(C, 0.0), sdx32(C, 0.0), sd32(C, 0.0);
  for (int r = 0; r < rows; ++r) {
    double ma = 0, mg = 0, mgx = 0, mg32 = 0, mgx32 = 0;
    for (int c = 0; c < C; ++c) {
      const size_t i = (size_t)r * C + c;
      const double xh = (x[i] - mean[r]) * rstd[r];
      ma += std::fabs(x[i]) / C;
      mg += std::fabs(dout[i] * w[c]) / C;
      mgx += std::fabs(dout[i] * w[c] * xh) / C;
      mg32 += std::fabs(dout32[i] * w[c]) / C;
      mgx32 += std::fabs(dout32[i] * w[c] * xh) / C;
    }
    const double dm = ns * kF32U * ma, rs = rstd[r];
    a_mean[r] = 2 * dm;
    a_rstd[r] = 2 * dr * rs;
    for (int c = 0; c < C; ++c) {
      const size_t i = (size_t)r * C + c;
      const double xh = (x[i] - mean[r]) * rs, g = dout[i] * w[c], g32 = dout32[i] * w[c];
      const double lin = (std::fabs(x[i] - mean[r]) * dr + dm) * rs * std::fabs(w[c]);
      a_out[i] = 2 * (lin + 3 * kF32U * (std::fabs(xh * w[c]) + std::fabs(b[c])));
      a_out_nb[i] = 2 * (lin + 3 * kF32U * std::fabs(xh * w[c]));
      const double k = 3 * dr + (ns + 7) * kF32U;
      const double T = rs * (std::fabs(g) + mg + std::fabs(xh) * mgx), D = rs * rs * dm * (std::fabs(xh) * mg + mgx);
      const double T32 = rs * (std::fabs(g32) + mg32 + std::fabs(xh) * mgx32);
      const double D32 = rs * rs * dm * (std::fabs(xh) * mg32 + mgx32);
      a_dx[i] = 2 * (k * T + D) + 2 * kF32U * std::fabs(old[i]);
      a_dx32[i] = 2 * (k * T32 + D32);
      sdx[c] += std::fabs(dout[i] * xh);
      sd[c] += std::fabs(dout[i]);
      sdx32[c] += std::fabs(dout32[i] * xh);
      sd32[c] += std::fabs(dout32[i]);
      a_dw[c] += 2 * dm * rs * std::fabs(dout[i]);
      a_dw32[c] += 2 * dm * rs * std::fabs(dout32[i]);
    }
  }
  for (int c = 0; c < C; ++c) {
    a_dw[c] += 2 * ((adds + 3) * kF32U + dr) * sdx[c] + 2 * kF32U * std::fabs(dw0[c]);
    a_dw32[c] += 2 * ((adds + 3) * kF32U + dr) * sdx32[c] + 2 * kF32U * std::fabs(dw0[c]);
    a_db[c] = 2 * adds * kF32U * sd[c] + 2 * kF32U * std::fabs(db0[c]);
    a_db32[c] = 2 * adds * kF32U * sd32[c] + 2 * kF32U * std::fabs(db0[c]);
  }
  EXPECT_TRUE(all_within("out", unpad(to_host(d_out), off), out, kBf16U, a_out));
  EXPECT_TRUE(all_within("out (no bias)", unpad(to_host(d_out_nb), off), out_nb, kBf16U, a_out_nb));
  EXPECT_TRUE(all_within("mean", to_host(d_mean), mean, kF32U, a_mean));
  EXPECT_TRUE(all_within("rstd", to_host(d_rstd), rstd, kF32U, a_rstd));
  EXPECT_TRUE(all_within("dx (accumulated)", unpad(to_host(d_dx), off), dx, kBf16U, a_dx));
  EXPECT_TRUE(all_within("dw", to_host(d_dw), dw, kF32U, a_dw));
  EXPECT_TRUE(all_within("db", to_host(d_db), db, kF32U, a_db));
  EXPECT_TRUE(all_within("dx (fp32 dout, overwritten)", unpad(to_host(d_dx32), off), dx32, kBf16U, a_dx32));
  EXPECT_TRUE(all_within("dw (fp32 dout)", to_host(d_dw32), dw32, kF32U, a_dw32));
  EXPECT_TRUE(all_within("db (fp32 dout)", to_host(d_db32), db32, kF32U, a_db32));

  // dw, db alone, rerun from the same buffers and from copies one element further on (another
  // vector width where the shape is aligned): the fixed order adds bitwise the same.
  const std::vector<double> dw1 = to_host(d_dw), db1 = to_host(d_db);
  auto e_dw = to_device_f32(dw0), e_db = to_device_f32(db0), f_dw = to_device_f32(dw0), f_db = to_device_f32(db0);
  auto s_x = to_device_bf16(pad(x, off + 1)), s_do = to_device_bf16(pad(dout, off + 1));
  tt::cuda::layernorm_backward(nullptr, e_dw.data(), e_db.data(), d_do.data() + off, d_x.data() + off,
                               d_w.data() + off, d_mean.data(), d_rstd.data(), rows, C, true, W, nullptr);
  tt::cuda::layernorm_backward(nullptr, f_dw.data(), f_db.data(), s_do.data() + off + 1, s_x.data() + off + 1,
                               d_w.data() + off, d_mean.data(), d_rstd.data(), rows, C, true, W, nullptr);
  sync_and_check();
  EXPECT_TRUE(all_equal("dw (second run)", to_host(e_dw), dw1));
  EXPECT_TRUE(all_equal("db (second run)", to_host(e_db), db1));
  EXPECT_TRUE(all_equal("dw (shifted copies)", to_host(f_dw), dw1));
  EXPECT_TRUE(all_equal("db (shifted copies)", to_host(f_db), db1));
}

INSTANTIATE_TEST_SUITE_P(Shapes, LayerNormTest,
                         ::testing::Values(Shape{1, 768, 0, "one_row"}, Shape{196 * 3, 768, 0, "tower"},
                                           Shape{64, 768, 1, "tower_unaligned"}, Shape{40, 1152, 0, "so400m"},
                                           Shape{77, 37, 0, "odd"}, Shape{9, 1001, 0, "odd_long"},
                                           Shape{130, 3072, 0, "long"}, Shape{3, 8192, 0, "long_8192"},
                                           Shape{5, 8, 0, "narrow"}),
                         shape_name);

struct GeluCase {
  bool tanh;
  int64_t n;
  std::string name;
};

class GeluTest : public GpuTest, public ::testing::WithParamInterface<GeluCase> {};

TEST_P(GeluTest, ForwardAndBackwardMatchCpu) {
  const bool tanh = GetParam().tanh;
  const int64_t n = GetParam().n;
  std::mt19937_64 rng(tanh ? 3 : 4);
  std::vector<double> x = randn_bf16(rng, n, 3.0);
  const double tails[] = {0, -0.0, 12, -12, 40, -40, 100, -100, 1e-3, -1e-3};
  for (int i = 0; i < 10; ++i) x[i] = tails[i];
  const std::vector<double> dy = randn_bf16(rng, n), old = randn_bf16(rng, n);
  std::vector<double> y(n), dx = old, dx_new(n, 0.0);
  if (tanh) {
    tt::cpu::gelu_tanh_forward<double>(y.data(), x.data(), n);
    tt::cpu::gelu_tanh_backward<double>(dx.data(), dy.data(), x.data(), n);
    tt::cpu::gelu_tanh_backward<double>(dx_new.data(), dy.data(), x.data(), n);
  } else {
    tt::cpu::gelu_erf_forward<double>(y.data(), x.data(), n);
    tt::cpu::gelu_erf_backward<double>(dx.data(), dy.data(), x.data(), n);
    tt::cpu::gelu_erf_backward<double>(dx_new.data(), dy.data(), x.data(), n);
  }
  auto d_x = to_device_bf16(x), d_dy = to_device_bf16(dy), d_dx = to_device_bf16(old);
  DeviceBuffer<bf16> d_y(n), d_dx_new(n);
  poison(d_y);
  poison(d_dx_new);
  tt::cuda::gelu_forward(d_y.data(), d_x.data(), n, tanh, nullptr);
  tt::cuda::gelu_backward(d_dx.data(), d_dy.data(), d_x.data(), n, tanh, /*accumulate=*/true, nullptr);
  tt::cuda::gelu_backward(d_dx_new.data(), d_dy.data(), d_x.data(), n, tanh, /*accumulate=*/false, nullptr);
  sync_and_check();
  std::vector<double> a_y(n), a_dx(n), a_dx_new(n);
  const double k = std::sqrt(2.0 / M_PI);
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    double df, terms;
    if (tanh) {
      const double z = 2 * k * (v + 0.044715 * v * v * v), s = 1 / (1 + std::exp(-z));
      df = (4 + 1.2 * std::fabs(z)) * kF32U;
      terms = s + std::fabs(v) * s * (1 - s) * 2 * k * (1 + 3 * 0.044715 * v * v);
    } else {
      df = (8 + 0.6 * v * v) * kF32U;
      terms = 0.5 * std::erfc(-v / std::sqrt(2.0)) + std::fabs(v) * std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI);
    }
    const double ftz = std::ldexp(1.0, -125);
    const double du = tanh ? 2 * k * (1 + 3 * 0.044715 * v * v) : 1.0;
    a_y[i] = 2 * (df + 4 * kF32U) * std::fabs(v) + ftz * std::fabs(v);
    a_dx_new[i] = 2 * (3 * df + 8 * kF32U) * terms * std::fabs(dy[i]) + ftz * (1 + std::fabs(v) * du) * std::fabs(dy[i]);
    a_dx[i] = a_dx_new[i] + 2 * kF32U * std::fabs(old[i]);
  }
  EXPECT_TRUE(all_within("gelu", to_host(d_y), y, kBf16U, a_y));
  EXPECT_TRUE(all_within("gelu dx (accumulated)", to_host(d_dx), dx, kBf16U, a_dx));
  EXPECT_TRUE(all_within("gelu dx (overwritten)", to_host(d_dx_new), dx_new, kBf16U, a_dx_new));
}

INSTANTIATE_TEST_SUITE_P(Forms, GeluTest,
                         ::testing::Values(GeluCase{true, 20011, "tanh_odd"}, GeluCase{true, 4096 * 5, "tanh_vec"},
                                           GeluCase{false, 20011, "erf_odd"}, GeluCase{false, 4096 * 5, "erf_vec"}),
                         [](const ::testing::TestParamInfo<GeluCase>& i) { return i.param.name; });

class BiasTest : public GpuTest, public ::testing::WithParamInterface<Shape> {};

// A Linear's bias (rows = tokens, C = width) and the position embedding as one (rows = frames,
// C = tokens per frame x width).
TEST_P(BiasTest, AddAndBackwardMatchCpu) {
  const int rows = GetParam().rows, C = GetParam().C, off = GetParam().offset;
  std::mt19937_64 rng(11 + rows + C + off);
  const std::vector<double> out0 = randn_bf16(rng, (size_t)rows * C), b = randn_bf16(rng, C);
  const std::vector<double> db0 = randn_f32(rng, C);
  std::vector<double> out = out0, db = db0;
  tt::cpu::bias_add<double>(out.data(), b.data(), rows, C);
  tt::cpu::bias_backward<double>(db.data(), out0.data(), rows, C);
  auto d_out = to_device_bf16(pad(out0, off)), d_b = to_device_bf16(pad(b, off));
  auto d_f32 = to_device_f32(pad(out0, off));
  auto d_db = to_device_f32(db0), d_db2 = to_device_f32(db0), d_db3 = to_device_f32(db0), d_db4 = to_device_f32(db0);
  tt::cuda::bias_add(d_out.data() + off, d_b.data() + off, rows, C, nullptr);
  tt::cuda::bias_add(d_f32.data() + off, d_b.data() + off, rows, C, nullptr);
  DeviceBuffer<char> ws(tt::cuda::bias_backward_workspace_bytes(rows, C));
  const Workspace W = workspace_of(ws);
  auto d_src = to_device_bf16(pad(out0, off)), s_src = to_device_bf16(pad(out0, off + 1));
  tt::cuda::bias_backward(d_db.data(), d_src.data() + off, rows, C, W, nullptr);
  tt::cuda::bias_backward(d_db2.data(), d_src.data() + off, rows, C, W, nullptr);
  tt::cuda::bias_backward(d_db2.data(), d_src.data() + off, rows, C, W, nullptr);
  tt::cuda::bias_backward(d_db3.data(), d_src.data() + off, rows, C, W, nullptr);
  tt::cuda::bias_backward(d_db4.data(), s_src.data() + off + 1, rows, C, W, nullptr);
  sync_and_check();
  std::vector<double> a_out((size_t)rows * C), a_db(C), db_twice(C);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < C; ++c)
      a_out[(size_t)r * C + c] = 2 * kF32U * (std::fabs(out0[(size_t)r * C + c]) + std::fabs(b[c]));
  const double adds = column_adds(rows);
  for (int c = 0; c < C; ++c) {
    double s = 0;
    for (int r = 0; r < rows; ++r) s += std::fabs(out0[(size_t)r * C + c]);
    a_db[c] = 2 * adds * kF32U * s + 2 * kF32U * std::fabs(db0[c]);
    db_twice[c] = db0[c] + 2 * (db[c] - db0[c]);
  }
  EXPECT_TRUE(all_within("bias_add bf16", unpad(to_host(d_out), off), out, kBf16U, a_out));
  EXPECT_TRUE(all_within("bias_add fp32", unpad(to_host(d_f32), off), out, kF32U, a_out));
  EXPECT_TRUE(all_within("bias_backward", to_host(d_db), db, kF32U, a_db));
  for (double& a : a_db) a *= 2;  // two sums and two adds into db
  EXPECT_TRUE(all_within("bias_backward (accumulated twice)", to_host(d_db2), db_twice, kF32U, a_db));
  EXPECT_TRUE(all_equal("bias_backward (second run)", to_host(d_db3), to_host(d_db)));
  EXPECT_TRUE(all_equal("bias_backward (shifted copy)", to_host(d_db4), to_host(d_db)));
}

INSTANTIATE_TEST_SUITE_P(Shapes, BiasTest,
                         ::testing::Values(Shape{1, 768, 0, "one_row"}, Shape{1000, 768, 0, "linear"},
                                           Shape{64, 768, 1, "linear_unaligned"},
                                           Shape{40, 196 * 768, 0, "positions"}, Shape{70, 13, 0, "odd"},
                                           Shape{2000, 8, 0, "many_rows_narrow"}),
                         shape_name);

class RowMovesTest : public GpuTest, public ::testing::WithParamInterface<Shape> {};

TEST_P(RowMovesTest, MatchCpu) {
  const int C = GetParam().C, off = GetParam().offset, src_n = 40, dst_n = 30;
  std::mt19937_64 rng(5 + C + off);
  const std::vector<double> src = randn_bf16(rng, (size_t)src_n * C), dst0 = randn_bf16(rng, (size_t)dst_n * C);
  const std::vector<int32_t> to = {3, 17, 0, 29}, from = {39, 0, 5, 5}, zero = {1, 17};
  // CSR: row d sums d % 4 sources (every fourth row, row 0 among them: none), sources repeat
  // across rows, and row 5 lists its last source twice.
  std::vector<int32_t> offsets = {0}, list;
  for (int d = 0; d < dst_n; ++d) {
    for (int k = 0; k < d % 4; ++k) list.push_back((d * 7 + k * 13) % src_n);
    if (d == 5) list.push_back(list.back());
    offsets.push_back((int32_t)list.size());
  }
  std::vector<double> copied = dst0, summed(dst0.size()), zeroed = dst0;
  tt::cpu::copy_rows<double>(copied.data(), to.data(), src.data(), from.data(), (int)to.size(), C);
  tt::cpu::sum_rows<double>(summed.data(), src.data(), offsets.data(), list.data(), dst_n, C);
  tt::cpu::zero_rows<double>(zeroed.data(), zero.data(), (int)zero.size(), C);
  auto d_src = to_device_bf16(pad(src, off)), d_copy = to_device_bf16(pad(dst0, off));
  auto d_zero = to_device_bf16(pad(dst0, off));
  DeviceBuffer<bf16> d_sum(dst0.size() + off);
  poison(d_sum);
  auto d_to = to_device(to), d_from = to_device(from), d_z = to_device(zero);
  auto d_off = to_device(offsets), d_list = to_device(list);
  tt::cuda::copy_rows(d_copy.data() + off, d_to.data(), d_src.data() + off, d_from.data(), (int)to.size(), C, nullptr);
  tt::cuda::sum_rows(d_sum.data() + off, d_src.data() + off, d_off.data(), d_list.data(), dst_n, C, nullptr);
  tt::cuda::zero_rows(d_zero.data() + off, d_z.data(), (int)zero.size(), C, nullptr);
  sync_and_check();
  std::vector<double> a_sum(summed.size());
  for (int d = 0; d < dst_n; ++d)
    for (int c = 0; c < C; ++c) {
      double s = 0;
      for (int k = offsets[d]; k < offsets[d + 1]; ++k) s += std::fabs(src[(size_t)list[k] * C + c]);
      a_sum[(size_t)d * C + c] = 2 * (offsets[d + 1] - offsets[d]) * kF32U * s;
    }
  EXPECT_TRUE(all_equal("copy_rows", unpad(to_host(d_copy), off), copied));
  EXPECT_TRUE(all_within("sum_rows", unpad(to_host(d_sum), off), summed, kBf16U, a_sum));
  EXPECT_TRUE(all_equal("zero_rows", unpad(to_host(d_zero), off), zeroed));
}

INSTANTIATE_TEST_SUITE_P(Widths, RowMovesTest,
                         ::testing::Values(Shape{0, 77, 0, "odd"}, Shape{0, 768, 0, "tower"},
                                           Shape{0, 768, 1, "tower_unaligned"}, Shape{0, 1, 0, "one_column"}),
                         shape_name);

struct PatchCase {
  int F, S, patch;
  std::string name;
};

class PatchifyTest : public GpuTest, public ::testing::WithParamInterface<PatchCase> {};

TEST_P(PatchifyTest, MatchesCpu) {
  const int F = GetParam().F, S = GetParam().S, p = GetParam().patch, K = 3 * p * p, P = (S / p) * (S / p);
  std::mt19937_64 rng(6 + S + p);
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

INSTANTIATE_TEST_SUITE_P(Frames, PatchifyTest,
                         ::testing::Values(PatchCase{3, 32, 8, "three_frames"}, PatchCase{1, 28, 14, "patch14"},
                                           PatchCase{2, 6, 1, "pixel_patches"}, PatchCase{1, 16, 16, "one_patch"}),
                         [](const ::testing::TestParamInfo<PatchCase>& i) { return i.param.name; });

// True when fn throws tt::Error whose message names op.
bool throws_naming(const std::function<void()>& fn, const std::string& op) {
  try {
    fn();
  } catch (const tt::Error& e) {
    return std::string(e.what()).find(op) != std::string::npos;
  }
  return false;
}

// Bad arguments are refused on the host before anything is enqueued, naming the op; empty sizes
// return before touching a pointer. No device needed: host pointers stand in, never dereferenced.
TEST(VisionOpsChecks, RejectBadArguments) {
  alignas(16) static bf16 h[64];
  alignas(16) static float f[64];
  alignas(16) static int32_t idx[64];
  const Workspace none{};
  EXPECT_TRUE(throws_naming([] { tt::cuda::patchify(h, f, 1, 30, 8, nullptr); }, "patchify"));
  EXPECT_TRUE(throws_naming([] { tt::cuda::patchify(h, f, 1, 32, 0, nullptr); }, "patchify"));
  EXPECT_TRUE(throws_naming([] { tt::cuda::patchify(h, f, -1, 32, 8, nullptr); }, "patchify"));
  EXPECT_TRUE(throws_naming([] { tt::cuda::patchify(h, nullptr, 1, 32, 8, nullptr); }, "patchify"));
  EXPECT_TRUE(throws_naming([] { tt::cuda::layernorm_forward(h, f, f, h, h, h, -1, 8, kEps, nullptr); },
                            "layernorm_forward"));
  EXPECT_TRUE(throws_naming([] { tt::cuda::layernorm_forward(h, f, f, h, h, h, 2, 0, kEps, nullptr); },
                            "layernorm_forward"));
  EXPECT_TRUE(throws_naming([] { tt::cuda::layernorm_forward(h, f, f, h, h, h, 2, 8, -1.0, nullptr); },
                            "layernorm_forward"));
  EXPECT_TRUE(throws_naming([] { tt::cuda::layernorm_forward(h, f, f, nullptr, h, h, 2, 8, kEps, nullptr); },
                            "layernorm_forward"));
  EXPECT_TRUE(throws_naming([] { tt::cuda::layernorm_forward(h, nullptr, f, h, h, h, 2, 8, kEps, nullptr); },
                            "layernorm_forward"));
  EXPECT_TRUE(throws_naming(
      [&] { tt::cuda::layernorm_backward(h, f, f, h, h, h, f, f, -2, 8, true, none, nullptr); },
      "layernorm_backward"));
  EXPECT_TRUE(throws_naming(
      [&] { tt::cuda::layernorm_backward(h, f, f, (const bf16*)nullptr, h, h, f, f, 2, 8, true, none, nullptr); },
      "layernorm_backward"));
  EXPECT_TRUE(throws_naming(
      [&] { tt::cuda::layernorm_backward(h, f, nullptr, f, h, h, nullptr, f, 2, 8, true, none, nullptr); },
      "layernorm_backward"));
  EXPECT_TRUE(throws_naming(  // dw wanted: the workspace is checked
      [&] { tt::cuda::layernorm_backward(nullptr, f, nullptr, h, h, h, f, f, 2, 8, true, none, nullptr); },
      "layernorm_backward"));
  EXPECT_TRUE(throws_naming([] { tt::cuda::gelu_forward(h, nullptr, 8, true, nullptr); }, "gelu_forward"));
  EXPECT_TRUE(throws_naming([] { tt::cuda::gelu_forward(h, h, -8, false, nullptr); }, "gelu_forward"));
  EXPECT_TRUE(throws_naming([] { tt::cuda::gelu_backward(nullptr, h, h, 8, true, true, nullptr); }, "gelu_backward"));
  EXPECT_TRUE(throws_naming([] { tt::cuda::bias_add(h, h, -1, 8, nullptr); }, "bias_add"));
  EXPECT_TRUE(throws_naming([] { tt::cuda::bias_add(f, nullptr, 4, 8, nullptr); }, "bias_add"));
  EXPECT_TRUE(throws_naming([&] { tt::cuda::bias_backward(f, h, 4, 8, none, nullptr); }, "bias_backward"));
  EXPECT_TRUE(throws_naming([&] { tt::cuda::bias_backward(f, h, 4, -8, none, nullptr); }, "bias_backward"));
  EXPECT_TRUE(throws_naming([&] { tt::cuda::bias_backward(nullptr, h, 4, 8, none, nullptr); }, "bias_backward"));
  EXPECT_TRUE(throws_naming([] { tt::cuda::copy_rows(h, idx, h, nullptr, 3, 8, nullptr); }, "copy_rows"));
  EXPECT_TRUE(throws_naming([] { tt::cuda::copy_rows(h, idx, h, idx, -3, 8, nullptr); }, "copy_rows"));
  EXPECT_TRUE(throws_naming([] { tt::cuda::sum_rows(h, h, nullptr, idx, 3, 8, nullptr); }, "sum_rows"));
  EXPECT_TRUE(throws_naming([] { tt::cuda::sum_rows(nullptr, h, idx, idx, 3, 8, nullptr); }, "sum_rows"));
  EXPECT_TRUE(throws_naming([] { tt::cuda::zero_rows(h, nullptr, 3, 8, nullptr); }, "zero_rows"));
  EXPECT_TRUE(throws_naming([] { tt::cuda::zero_rows(h, idx, 3, -1, nullptr); }, "zero_rows"));
}

TEST(VisionOpsChecks, EmptySizesDoNothing) {
  const Workspace none{};
  EXPECT_NO_THROW(tt::cuda::layernorm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 768, kEps,
                                              nullptr));
  EXPECT_NO_THROW(tt::cuda::layernorm_backward(nullptr, nullptr, nullptr, (const float*)nullptr, nullptr, nullptr,
                                               nullptr, nullptr, 0, 768, true, none, nullptr));
  EXPECT_NO_THROW(tt::cuda::gelu_forward(nullptr, nullptr, 0, true, nullptr));
  EXPECT_NO_THROW(tt::cuda::gelu_backward(nullptr, nullptr, nullptr, 0, false, true, nullptr));
  EXPECT_NO_THROW(tt::cuda::bias_add((bf16*)nullptr, nullptr, 0, 768, nullptr));
  EXPECT_NO_THROW(tt::cuda::bias_add((float*)nullptr, nullptr, 40, 0, nullptr));
  EXPECT_NO_THROW(tt::cuda::bias_backward(nullptr, nullptr, 0, 768, none, nullptr));
  EXPECT_NO_THROW(tt::cuda::copy_rows(nullptr, nullptr, nullptr, nullptr, 0, 8, nullptr));
  EXPECT_NO_THROW(tt::cuda::sum_rows(nullptr, nullptr, nullptr, nullptr, 0, 8, nullptr));
  EXPECT_NO_THROW(tt::cuda::zero_rows(nullptr, nullptr, 0, 8, nullptr));
  EXPECT_NO_THROW(tt::cuda::patchify(nullptr, nullptr, 0, 224, 14, nullptr));
  EXPECT_EQ(tt::cuda::layernorm_backward_workspace_bytes(0, 768), 0u);
  EXPECT_EQ(tt::cuda::bias_backward_workspace_bytes(40, 0), 0u);
}

}  // namespace
}  // namespace tt::cuda_test
