// Weighted cross-entropy (fused and separate) vs the CPU reference (fp64): rows without targets,
// branch points (several targets per row, including a repeated token), a shuffled target list,
// row chunks, in-place gradients, a 151936-token vocabulary, V not a multiple of 8.
//
// Bounds. Per thread a row is reduced by a chain of at most Lc = V/256 + 64 fp32 adds, each
// summand carrying the error of __expf (at most 2 + 1.173 |x| ulp, 1 ulp <= 2^-23 relative) and of
// at most Lc rescalings whose exponents add up to the row's range R; __logf adds 3 ulp of log S.
//   lse:      e_r = 2 (Lc u32 + (4 Lc + 2.4 R + 3 ln V + 4) 2^-23 + u32 |lse|)
//   loss:     sum_t w_t e_{src t}                 (fp64 sums: negligible)
//   dlogits:  rel 2^-8, abs 2 dloss c_r p (e_r + (2 + 1.2 |x - lse|) 2^-23 + 3 u32)
//             + 4 dloss u32 c_r at target columns (rounding of the weights and the difference)
//             + 2^-100 (fp32 underflow)
// Rows without targets must be exactly zero.
#include "ops/cuda/cross_entropy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ops/cpu/cross_entropy.h"
#include "tests/ops_cuda/test_util.h"

namespace tt::cuda_test {
namespace {

struct Case {
  int rows, V;
  std::string name;
};

struct Problem {
  int rows = 0, V = 0;
  std::vector<double> logits;  // (rows, V), bf16 values
  std::vector<int32_t> src, tok;
  std::vector<double> w;
};

// Each row gets 0 (20%), 1 (60%) or 3 (20%, a branch point; sometimes with a repeated token)
// targets; the list is shuffled so rows are not in order.
Problem make_problem(int rows, int V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Problem p;
  p.rows = rows, p.V = V;
  p.logits = randn_bf16(rng, (size_t)rows * V, 2.0);
  std::uniform_int_distribution<int> tokd(0, V - 1);
  std::uniform_real_distribution<double> wd(0.1, 2.0), u(0, 1);
  for (int r = 0; r < rows; r++) {
    const double a = u(rng);
    const int k = rows == 1 ? 3 : a < 0.2 ? 0 : a < 0.8 ? 1 : 3;
    int last = -1;
    for (int j = 0; j < k; j++) {
      const int t = (j == 2 && u(rng) < 0.5) ? last : tokd(rng);
      p.src.push_back(r), p.tok.push_back(t), p.w.push_back(wd(rng));
      last = t;
    }
  }
  std::vector<size_t> perm(p.src.size());
  for (size_t i = 0; i < perm.size(); i++) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  Problem q = p;
  for (size_t i = 0; i < perm.size(); i++) q.src[i] = p.src[perm[i]], q.tok[i] = p.tok[perm[i]], q.w[i] = p.w[perm[i]];
  return q;
}

struct DeviceProblem {
  DeviceBuffer<bf16> logits;
  DeviceBuffer<int32_t> src, tok;
  DeviceBuffer<double> w;
  DeviceBuffer<char> ws;
  tt::cuda::CeTargets targets() const {
    return {src.data(), tok.data(), w.data(), (int)src.size()};
  }
};

DeviceProblem upload(const Problem& p) {
  DeviceProblem d;
  d.logits = to_device_bf16(p.logits);
  d.src = to_device(p.src);
  d.tok = to_device(p.tok);
  d.w = to_device(p.w);
  d.ws = DeviceBuffer<char>(tt::cuda::cross_entropy_workspace_bytes(p.rows, (int)p.src.size()));
  return d;
}

struct Result {
  double loss = 0;
  std::vector<double> lse, dlogits;
};

constexpr double kLossInit = 0.25;  // *loss is accumulated: start from a non-zero value
constexpr float kDloss = 0.37f;

Result run_fused(DeviceProblem& d, const Problem& p, bool in_place) {
  DeviceBuffer<double> loss(1);
  loss.copy_from_host(&kLossInit, 1);
  DeviceBuffer<float> lse(p.rows);
  poison(lse);
  DeviceBuffer<bf16> dl;
  bf16* dlogits = d.logits.data();
  if (!in_place) {
    dl = DeviceBuffer<bf16>((size_t)p.rows * p.V);
    poison(dl);
    dlogits = dl.data();
  }
  tt::cuda::cross_entropy_forward_backward(loss.data(), lse.data(), dlogits, d.logits.data(), d.targets(), 0, p.rows,
                                           p.V, kDloss, {d.ws.data(), d.ws.size()}, nullptr);
  sync_and_check();
  Result r;
  r.loss = loss.to_host()[0] - kLossInit;
  r.lse = to_host(lse);
  r.dlogits = in_place ? to_host(d.logits) : to_host(dl);
  return r;
}

struct Reference {
  double loss;
  std::vector<double> lse, dlogits, lse_err, dl_abs;
  double loss_err;
};

Reference reference(const Problem& p) {
  Reference ref;
  const int n_tgt = (int)p.src.size();
  ref.lse.resize(p.rows);
  ref.loss = tt::cpu::cross_entropy_forward<double>(ref.lse.data(), p.logits.data(), p.src.data(), p.tok.data(),
                                                    p.w.data(), n_tgt, p.rows, p.V);
  ref.dlogits.resize((size_t)p.rows * p.V);
  tt::cpu::cross_entropy_backward<double>(ref.dlogits.data(), p.logits.data(), ref.lse.data(), p.src.data(),
                                          p.tok.data(), p.w.data(), n_tgt, p.rows, p.V, (double)kDloss);
  const double lc = p.V / 256.0 + 64, ulp = std::ldexp(1.0, -23);
  ref.lse_err.resize(p.rows);
  std::vector<double> c(p.rows, 0.0);
  for (int t = 0; t < n_tgt; t++) c[p.src[t]] += p.w[t];
  ref.dl_abs.assign(ref.dlogits.size(), 0.0);
  for (int r = 0; r < p.rows; r++) {
    const double* x = p.logits.data() + (size_t)r * p.V;
    const auto [mn, mx] = std::minmax_element(x, x + p.V);
    const double range = *mx - *mn;
    ref.lse_err[r] = 2 * (lc * kF32U + (4 * lc + 2.4 * range + 3 * std::log((double)p.V) + 4) * ulp +
                          kF32U * std::fabs(ref.lse[r]));
    if (c[r] == 0) continue;  // rows without targets: exact zeros
    for (int v = 0; v < p.V; v++) {
      const double pv = std::exp(x[v] - ref.lse[r]);
      ref.dl_abs[(size_t)r * p.V + v] =
          2 * kDloss * c[r] * pv * (ref.lse_err[r] + (2 + 1.2 * std::fabs(x[v] - ref.lse[r])) * ulp + 3 * kF32U) +
          std::ldexp(1.0, -100);
    }
  }
  for (int t = 0; t < n_tgt; t++) ref.dl_abs[(size_t)p.src[t] * p.V + p.tok[t]] += 4 * kDloss * kF32U * c[p.src[t]];
  ref.loss_err = 0;
  for (int t = 0; t < n_tgt; t++) ref.loss_err += p.w[t] * ref.lse_err[p.src[t]];
  return ref;
}

class CrossEntropyTest : public GpuTest, public ::testing::WithParamInterface<Case> {};

TEST_P(CrossEntropyTest, FusedMatchesCpu) {
  const auto [rows, V, name] = GetParam();
  const Problem p = make_problem(rows, V, 1000 + rows + V);
  const Reference ref = reference(p);
  DeviceProblem d = upload(p);
  const Result r = run_fused(d, p, false);
  EXPECT_NEAR(r.loss, ref.loss, ref.loss_err) << "loss";
  EXPECT_TRUE(all_within("lse", r.lse, ref.lse, 0.0, ref.lse_err));
  EXPECT_TRUE(all_within("dlogits", r.dlogits, ref.dlogits, kBf16U, ref.dl_abs));
  std::printf("[ %s ] loss %.9g ref %.9g (bound %.3g); dlogits rel L2 %.3g\n", name.c_str(), r.loss, ref.loss,
              ref.loss_err, rel_l2(r.dlogits, ref.dlogits));
}

// Second weights (the trainer's path counts): *c_loss gets sum_t c_t ce_t, within the same rule as
// the loss (sum_t c_t lse_err), in the fused and the forward-only call, and the loss, lse and
// dlogits are bitwise those of the call without them.
TEST_P(CrossEntropyTest, SecondWeightsGiveTheUnweightedLoss) {
  const auto [rows, V, name] = GetParam();
  const Problem p = make_problem(rows, V, 3000 + rows + V);
  const int n_tgt = (int)p.src.size();
  std::mt19937_64 rng(rows * 7 + V);
  std::vector<double> c(n_tgt);
  for (double& x : c) x = (double)(1 + rng() % 4);
  const Reference ref = reference(p);
  std::vector<double> lse(p.rows);
  double c_ref = 0;
  tt::cpu::cross_entropy_forward<double>(lse.data(), p.logits.data(), p.src.data(), p.tok.data(), p.w.data(), n_tgt,
                                         p.rows, p.V, c.data(), &c_ref);
  double c_err = 0;
  for (int t = 0; t < n_tgt; t++) c_err += c[t] * ref.lse_err[p.src[t]];
  DeviceProblem d = upload(p);
  const Result plain = run_fused(d, p, false);
  DeviceBuffer<double> cw = to_device(c), c_loss(1), loss(1);
  tt::cuda::CeTargets tgt = d.targets();
  tgt.c = cw.data();
  tgt.c_loss = c_loss.data();
  for (int fused = 0; fused < 2; fused++) {
    c_loss.copy_from_host(&kLossInit, 1);
    loss.copy_from_host(&kLossInit, 1);
    DeviceBuffer<float> l(p.rows);
    DeviceBuffer<bf16> dl((size_t)p.rows * p.V);
    const tt::cuda::Workspace ws{d.ws.data(), d.ws.size()};
    if (fused) {
      tt::cuda::cross_entropy_forward_backward(loss.data(), l.data(), dl.data(), d.logits.data(), tgt, 0, p.rows, p.V,
                                               kDloss, ws, nullptr);
    } else {
      tt::cuda::cross_entropy_forward(loss.data(), l.data(), d.logits.data(), tgt, 0, p.rows, p.V, ws, nullptr);
    }
    sync_and_check();
    EXPECT_NEAR(c_loss.to_host()[0] - kLossInit, c_ref, c_err) << name << (fused ? " fused" : " forward");
    EXPECT_EQ(loss.to_host()[0] - kLossInit, plain.loss) << "the second weights leave the loss alone";
    EXPECT_EQ(to_host(l), plain.lse);
    if (fused) EXPECT_EQ(to_host(dl), plain.dlogits) << "and the gradient";
  }
}

TEST_P(CrossEntropyTest, SeparateEqualsFusedAndInPlaceAndRepeatable) {
  const auto [rows, V, name] = GetParam();
  const Problem p = make_problem(rows, V, 2000 + rows + V);
  DeviceProblem d = upload(p);
  const Result fused = run_fused(d, p, false);
  const Result again = run_fused(d, p, false);
  EXPECT_EQ(again.loss, fused.loss) << "the loss must be bitwise repeatable";
  EXPECT_TRUE(all_equal("dlogits repeat", again.dlogits, fused.dlogits));

  // Forward, then backward from the saved lse.
  DeviceBuffer<double> loss(1);
  loss.copy_from_host(&kLossInit, 1);
  DeviceBuffer<float> lse(rows);
  DeviceBuffer<bf16> dl((size_t)rows * V);
  poison(lse);
  poison(dl);
  const tt::cuda::Workspace ws{d.ws.data(), d.ws.size()};
  tt::cuda::cross_entropy_forward(loss.data(), lse.data(), d.logits.data(), d.targets(), 0, rows, V, ws, nullptr);
  tt::cuda::cross_entropy_backward(dl.data(), d.logits.data(), lse.data(), d.targets(), 0, rows, V, kDloss, ws,
                                   nullptr);
  sync_and_check();
  EXPECT_EQ(loss.to_host()[0] - kLossInit, fused.loss);
  EXPECT_TRUE(all_equal("lse separate", to_host(lse), fused.lse));
  EXPECT_TRUE(all_equal("dlogits separate", to_host(dl), fused.dlogits));

  // In place: dlogits overwrite the logits.
  const Result in_place = run_fused(d, p, true);
  EXPECT_EQ(in_place.loss, fused.loss);
  EXPECT_TRUE(all_equal("dlogits in place", in_place.dlogits, fused.dlogits));
}

TEST_P(CrossEntropyTest, RowChunksSumToTheBatch) {
  const auto [rows, V, name] = GetParam();
  if (rows < 3) GTEST_SKIP() << "needs three chunks";
  const Problem p = make_problem(rows, V, 3000 + rows + V);
  const Reference ref = reference(p);
  DeviceProblem d = upload(p);
  const Result full = run_fused(d, p, false);
  DeviceBuffer<double> loss(1);
  loss.copy_from_host(&kLossInit, 1);
  DeviceBuffer<float> lse(rows);
  DeviceBuffer<bf16> dl((size_t)rows * V);
  poison(lse);
  poison(dl);
  const int cuts[4] = {0, rows / 3, rows / 3 + 1, rows};  // includes a one-row chunk
  for (int i = 0; i < 3; i++) {
    const int b = cuts[i], n = cuts[i + 1] - cuts[i];
    DeviceBuffer<char> ws(tt::cuda::cross_entropy_workspace_bytes(n, (int)p.src.size()));
    tt::cuda::cross_entropy_forward_backward(loss.data(), lse.data() + b, dl.data() + (size_t)b * V,
                                             d.logits.data() + (size_t)b * V, d.targets(), b, n, V, kDloss,
                                             {ws.data(), ws.size()}, nullptr);
  }
  sync_and_check();
  EXPECT_NEAR(loss.to_host()[0] - kLossInit, ref.loss, ref.loss_err);
  EXPECT_TRUE(all_equal("lse chunks", to_host(lse), full.lse));
  EXPECT_TRUE(all_equal("dlogits chunks", to_host(dl), full.dlogits));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CrossEntropyTest,
                         ::testing::Values(Case{37, 1000, "v1000"}, Case{29, 999, "v_not_multiple_of_8"},
                                           Case{12, 151936, "qwen3_vocab_151936"}, Case{1, 50, "single_row"},
                                           Case{300, 64, "many_short_rows"}),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST_F(GpuTest, CrossEntropyNoTargets) {
  Problem p = make_problem(5, 40, 77);
  p.src.clear(), p.tok.clear(), p.w.clear();
  DeviceProblem d = upload(p);
  const Result r = run_fused(d, p, false);
  EXPECT_EQ(r.loss, 0.0);
  for (double v : r.dlogits) ASSERT_EQ(v, 0.0);
  for (double v : r.lse) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace tt::cuda_test
