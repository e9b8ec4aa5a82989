// The Gated DeltaNet's row ops on the GPU (ops/cuda/gdn.h) against the CPU reference
// (ops/cpu/gdn.h, fp64 on the same bf16 inputs), on awkward DFS-packed trees: one-token nodes,
// nodes shorter than the conv window (so a window crosses several ancestors), a deep chain of
// one-token nodes ending in a wide fan (one row whose input gradient gathers from many branches),
// several roots, node lengths that are not multiples of anything.
//
// Bounds. bf16 outputs: elementwise |got - ref| <= 2^-8 |ref| + 2^-10 max|ref| (one
// round-to-nearest bf16 rounding is 2^-9 relative, doubled; the floor covers fp32 sums of at most
// 64 terms, 64 2^-24 of their magnitude, where they cancel; the delta rule's outputs sum 64 + 128
// fp32 terms per chunk on top of an fp32 state), and normwise relative L2 <= 2^-8.
// fp32 sums over rows (dw, dA_log, ddt_bias): normwise relative L2 <= 1e-4 (at most a few hundred
// fp32 terms: n 2^-24 < 2e-5 of their magnitude, with room for cancellation). path_prev: exact.
#include "ops/cuda/gdn.h"

#include <gtest/gtest.h>

#include <cstdio>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ops/cpu/gdn.h"
#include "tests/ops_cuda/gdn_cases.h"
#include "tests/ops_cuda/test_util.h"

namespace tt::cuda_test {
namespace {

template <class T>
DeviceBuffer<T> dev(const std::vector<T>& x) {
  return to_device(x);
}

class GdnOps : public GpuTest {};

TEST_F(GdnOps, PathPrevAndConvMatchTheCpuOnAwkwardTrees) {
  for (uint64_t seed : {1, 2, 3}) {
    const ConvCase c(seed);
    const Forest& f = c.f;
    const int N = c.N, C = c.C, K = c.K;
    auto d_start = dev(f.start), d_len = dev(f.len), d_parent = dev(f.parent), d_pos = dev(f.pos),
         d_end = dev(f.subtree_end);
    DeviceBuffer<int32_t> d_prev(N);
    cuda::gdn_path_prev(d_prev.data(), d_start.data(), d_len.data(), d_parent.data(), f.nodes(), nullptr);
    sync_and_check();
    ASSERT_EQ(d_prev.to_host(), c.prev) << "seed " << seed;

    auto d_x = to_device_bf16(c.x), d_w = to_device_bf16(c.w);
    DeviceBuffer<bf16> d_out((size_t)N * C);
    cuda::conv1d_silu_forward(d_out.data(), d_x.data(), d_w.data(), d_prev.data(), N, C, K, nullptr);
    sync_and_check();
    EXPECT_TRUE(close_bf16("conv forward", to_host(d_out), c.out));

    auto d_dout = to_device_bf16(c.dout), d_dx = to_device_bf16(c.dx0);
    auto d_dw = to_device_f32(c.dw0);
    DeviceBuffer<char> ws(cuda::conv1d_silu_backward_workspace_bytes(N, C, K));
    cuda::conv1d_silu_backward(d_dx.data(), d_dw.data(), d_dout.data(), d_x.data(), d_w.data(), d_prev.data(),
                               d_pos.data(), d_end.data(), N, C, K, cuda::Workspace{ws.data(), ws.size()}, nullptr);
    sync_and_check();
    EXPECT_TRUE(close_bf16("conv dx (accumulated)", to_host(d_dx), c.dx));
    EXPECT_TRUE(close_f32_sum("conv dw", to_host(d_dw), c.dw));

    // Overwriting dx: the gradient alone.
    poison(d_dx);
    cuda::conv1d_silu_backward(d_dx.data(), nullptr, d_dout.data(), d_x.data(), d_w.data(), d_prev.data(), d_pos.data(),
                               d_end.data(), N, C, K, cuda::Workspace{ws.data(), ws.size()}, nullptr,
                               /*accumulate=*/false);
    sync_and_check();
    EXPECT_TRUE(close_bf16("conv dx (overwritten)", to_host(d_dx), c.dx_only));
  }
}

TEST_F(GdnOps, NormsMatchTheCpu) {
  const NormsCase c;
  const int rows = c.rows, D = c.D;
  auto d_x = to_device_bf16(c.x), d_z = to_device_bf16(c.z), d_w = to_device_bf16(c.w), d_dy = to_device_bf16(c.dy);
  DeviceBuffer<bf16> d_y((size_t)rows * D);
  DeviceBuffer<float> d_rstd(rows);

  // L2 norm.
  cuda::l2norm_forward(d_y.data(), d_rstd.data(), d_x.data(), rows, D, c.eps, nullptr);
  sync_and_check();
  EXPECT_TRUE(close_bf16("l2norm forward", to_host(d_y), c.l2_y));
  EXPECT_TRUE(all_within("l2norm rstd", to_host(d_rstd), c.l2_rstd, 1e-6, {}));
  auto d_dx = to_device_bf16(c.dx0);
  cuda::l2norm_backward(d_dx.data(), d_dy.data(), d_x.data(), d_rstd.data(), rows, D, nullptr);
  sync_and_check();
  EXPECT_TRUE(close_bf16("l2norm dx", to_host(d_dx), c.l2_dx));

  // Gated RMSNorm.
  cuda::gated_rmsnorm_forward(d_y.data(), d_rstd.data(), d_x.data(), d_z.data(), d_w.data(), rows, D, c.eps, nullptr);
  sync_and_check();
  EXPECT_TRUE(close_bf16("gated rmsnorm forward", to_host(d_y), c.gated_y));
  EXPECT_TRUE(all_within("gated rmsnorm rstd", to_host(d_rstd), c.gated_rstd, 1e-6, {}));
  d_dx = to_device_bf16(c.dx0);
  auto d_dz = to_device_bf16(c.dz0);
  auto d_dw = to_device_f32(c.dw0);
  DeviceBuffer<char> ws(cuda::gated_rmsnorm_backward_workspace_bytes(rows, D));
  cuda::gated_rmsnorm_backward(d_dx.data(), d_dz.data(), d_dw.data(), d_dy.data(), d_x.data(), d_z.data(), d_w.data(),
                               d_rstd.data(), rows, D, cuda::Workspace{ws.data(), ws.size()}, nullptr);
  sync_and_check();
  EXPECT_TRUE(close_bf16("gated rmsnorm dx", to_host(d_dx), c.gated_dx));
  EXPECT_TRUE(close_bf16("gated rmsnorm dz", to_host(d_dz), c.gated_dz));
  EXPECT_TRUE(close_f32_sum("gated rmsnorm dw", to_host(d_dw), c.gated_dw));
}

TEST_F(GdnOps, GatesMatchTheCpu) {
  const GatesCase c;
  const int N = c.N, H = c.H;
  auto d_a = to_device_bf16(c.a), d_b = to_device_bf16(c.b), d_A = to_device_bf16(c.A_log),
       d_dt = to_device_bf16(c.dt_bias);
  DeviceBuffer<float> d_g((size_t)N * H);  // fp32 log decays
  DeviceBuffer<bf16> d_beta((size_t)N * H);
  cuda::gdn_gates_forward(d_g.data(), d_beta.data(), d_a.data(), d_b.data(), d_A.data(), d_dt.data(), N, H, nullptr);
  sync_and_check();
  // g in fp32: __expf (at most 2 + 1.16 |x| ulp, |x| <= 8 here), log1pf and two products: 64 u32.
  EXPECT_TRUE(all_within("gates g", to_host(d_g), c.g, 64 * kF32U, {}));
  EXPECT_TRUE(close_bf16("gates beta", to_host(d_beta), c.beta));

  auto d_dg = to_device_f32(c.dg), d_dbeta = to_device_f32(c.dbeta);
  DeviceBuffer<bf16> d_da((size_t)N * H), d_db((size_t)N * H);
  auto d_dA = to_device_f32(c.dA0), d_ddt = to_device_f32(c.ddt0);
  DeviceBuffer<char> ws(cuda::gdn_gates_backward_workspace_bytes(N, H));
  cuda::gdn_gates_backward(d_da.data(), d_db.data(), d_dA.data(), d_ddt.data(), d_dg.data(), d_dbeta.data(), d_a.data(),
                           d_b.data(), d_A.data(), d_dt.data(), N, H, cuda::Workspace{ws.data(), ws.size()}, nullptr);
  sync_and_check();
  EXPECT_TRUE(close_bf16("gates da", to_host(d_da), c.da));
  EXPECT_TRUE(close_bf16("gates db", to_host(d_db), c.db));
  EXPECT_TRUE(close_f32_sum("gates dA_log", to_host(d_dA), c.dA));
  EXPECT_TRUE(close_f32_sum("gates ddt_bias", to_host(d_ddt), c.ddt));
}

// RuleInputs (gdn_cases.h) on the device, the plan's tables uploaded.
struct RuleCase : RuleInputs {
  DeviceBuffer<char> tables;
  DeviceBuffer<bf16> d_q, d_k, d_v, d_b;
  DeviceBuffer<float> d_g;  // fp32 log decays (here bf16 values, as drawn)

  RuleCase(uint64_t seed, int budget, int max_len, bool extra_root, std::mt19937_64& rng, RuleShape shape = {})
      : RuleInputs(seed, budget, max_len, extra_root, rng, shape) {
    tables = DeviceBuffer<char>(std::max<size_t>(plan.table_bytes(), 1));
    plan.upload(tables.data(), nullptr);
    d_q = to_device_bf16(q), d_k = to_device_bf16(k), d_v = to_device_bf16(v), d_g = to_device_f32(g),
    d_b = to_device_bf16(beta);
  }
};


// The chunked delta rule against the fp64 recurrent oracle on RuleCase's trees (with a second
// root), with the roots' own initial states. Outputs: the bf16 rule above; end states (fp32,
// carried through at most ~300 rows of fp32 updates with __expf decays of relative error 2^-21):
// normwise relative L2 <= 1e-4.
TEST_F(GdnOps, DeltaRuleForwardMatchesTheRecurrentOracle) {
  // Seed 6: narrower heads (dk 64 of 128 rows of the walk's tiles, dv 96: a half-empty output block).
  // Seed 7: dk 72, not a multiple of the tensor-core products' depth 16 (the Gram products on CUDA
  // cores, q and the state zero-padded to 80 for q S).
  // Seed 8: dk 128 (the walk's TMA stages) with dv 64 (their U boxes narrower than the head), on a
  // batch of 36 rows: every stage's box runs past the tensors' end (zeros there).
  for (uint64_t seed : {4, 5, 6, 7, 8}) {
    std::mt19937_64 rng(seed * 31);
    const RuleShape shape = seed == 6   ? RuleShape{1, 3, 64, 96}
                            : seed == 7 ? RuleShape{1, 2, 72, 64}
                            : seed == 8 ? RuleShape{1, 2, 128, 64, 0.6, {{-1, 20}, {0, 7}, {-1, 9}}}
                                        : RuleShape{};
    RuleCase rc(seed, 20, 70, /*extra_root=*/true, rng, shape);
    const int nk = rc.nk, nv = rc.nv, dk = rc.dk, dv = rc.dv;
    const int N = rc.N;
    const std::vector<double> init = randn_f32(rng, (size_t)rc.roots * rc.state_elems(), 0.1);
    std::vector<double> o((size_t)N * nv * dv), end((size_t)rc.f.nodes() * rc.state_elems());
    cpu::gdn_tree_forward<double>(o.data(), end.data(), rc.q.data(), rc.k.data(), rc.v.data(), rc.g.data(),
                                  rc.beta.data(), init.data(), rc.t);
    DeviceBuffer<char> ws(cuda::gdn_forward_workspace_bytes(rc.plan, nv, dk, dv, /*end_given=*/true));
    auto d_init = to_device_f32(init);
    DeviceBuffer<bf16> d_o((size_t)N * nv * dv);
    DeviceBuffer<float> d_end(end.size());
    cuda::gdn_forward(d_o.data(), d_end.data(), rc.d_q.data(), rc.d_k.data(), rc.d_v.data(), rc.d_g.data(),
                      rc.d_b.data(), d_init.data(), rc.plan, nk, nv, dk, dv, rc.scale,
                      cuda::Workspace{ws.data(), ws.size()}, nullptr);
    sync_and_check();
    EXPECT_EQ(rc.plan.num_chunks(), [&] {
      int c = 0;
      for (int32_t l : rc.f.len) c += (l + 63) / 64;
      return c;
    }());
    EXPECT_TRUE(close_bf16("delta rule o, seed " + std::to_string(seed), to_host(d_o), o));
    const double e = rel_l2(to_host(d_end), end);
    EXPECT_LE(e, 1e-4) << "end states, seed " << seed;
    std::printf("[ errors   ] delta rule forward, seed %d: end states rel L2 %.2e\n", (int)seed, e);
    // Without init and end: roots start from zero, the ends stay in the workspace.
    std::vector<double> o0((size_t)N * nv * dv);
    cpu::gdn_tree_forward<double>(o0.data(), nullptr, rc.q.data(), rc.k.data(), rc.v.data(), rc.g.data(),
                                  rc.beta.data(), nullptr, rc.t);
    DeviceBuffer<char> ws0(cuda::gdn_forward_workspace_bytes(rc.plan, nv, dk, dv, /*end_given=*/false));
    cuda::gdn_forward(d_o.data(), nullptr, rc.d_q.data(), rc.d_k.data(), rc.d_v.data(), rc.d_g.data(), rc.d_b.data(),
                      nullptr, rc.plan, nk, nv, dk, dv, rc.scale, cuda::Workspace{ws0.data(), ws0.size()}, nullptr);
    sync_and_check();
    EXPECT_TRUE(close_bf16("delta rule o from zero states, seed " + std::to_string(seed), to_host(d_o), o0));
  }
}

// The fp64 oracle's outputs of a RuleCase for dO, with the roots' initial states `init` and the
// nodes' end-state gradients dE (either empty: none; d_init then empty too).
struct RuleRef {
  std::vector<double> init, dE;  // the inputs
  std::vector<double> o, end, dq, dk, dv, dg, db, di;
};
RuleRef rule_oracle(const RuleCase& rc, const std::vector<double>& dO, std::vector<double> init = {},
                    std::vector<double> dE = {}) {
  RuleRef r;
  r.init = std::move(init), r.dE = std::move(dE);
  auto or_null = [](std::vector<double>& x) { return x.empty() ? nullptr : x.data(); };
  r.o.resize((size_t)rc.N * rc.nv * rc.dv), r.end.resize((size_t)rc.f.nodes() * rc.state_elems());
  cpu::gdn_tree_forward<double>(r.o.data(), r.end.data(), rc.q.data(), rc.k.data(), rc.v.data(), rc.g.data(),
                                rc.beta.data(), or_null(r.init), rc.t);
  r.dq.assign(rc.q.size(), 0.0), r.dk.assign(rc.k.size(), 0.0), r.dv.assign(rc.v.size(), 0.0);
  r.dg.assign(rc.g.size(), 0.0), r.db.assign(rc.beta.size(), 0.0), r.di.assign(r.init.size(), 0.0);
  cpu::gdn_tree_backward<double>(r.dq.data(), r.dk.data(), r.dv.data(), r.dg.data(), r.db.data(), or_null(r.di),
                                 dO.data(), or_null(r.dE), rc.q.data(), rc.k.data(), rc.v.data(), rc.g.data(),
                                 rc.beta.data(), or_null(r.init), rc.t);
  return r;
}

// A forward (end states kept) and a backward (not accumulating) of rc on the GPU with `products`
// (and ref's initial states and end-state gradients, if any), against the oracle's: o and the end
// states within kBf16Products (bf16 products) or bf16's rounding and 1e-4 (exact), the gradients by
// expect_rule_grads, d_init within kBf16Products or 1e-3 (fp32); the errors printed as `what`.
// Returns o, dq and dg (the modes' outputs compared by the caller).
struct RuleGot {
  std::vector<bf16> o, dq;
  std::vector<float> dg;
};
RuleGot check_rule(const RuleCase& rc, const RuleRef& ref, const DeviceBuffer<bf16>& d_dO, cuda::GdnProducts products,
                   const std::string& what) {
  const int nk = rc.nk, nv = rc.nv, dk = rc.dk, dv = rc.dv, N = rc.N;
  const bool b16 = products == cuda::GdnProducts::kBf16;
  const std::string at = b16 ? " (bf16 products)" : " (exact products)";
  DeviceBuffer<char> ws(cuda::gdn_forward_workspace_bytes(rc.plan, nv, dk, dv, /*end_given=*/true));
  DeviceBuffer<bf16> d_o((size_t)N * nv * dv);
  DeviceBuffer<float> d_end(ref.end.size());
  poison(d_o);
  const bool with_init = !ref.init.empty(), with_dE = !ref.dE.empty();
  DeviceBuffer<float> d_init = to_device_f32(ref.init), d_dE = to_device_f32(ref.dE),
                      d_di = to_device_f32(std::vector<double>(ref.init.size()));
  cuda::gdn_forward(d_o.data(), d_end.data(), rc.d_q.data(), rc.d_k.data(), rc.d_v.data(), rc.d_g.data(),
                    rc.d_b.data(), with_init ? d_init.data() : nullptr, rc.plan, nk, nv, dk, dv, rc.scale,
                    cuda::Workspace{ws.data(), ws.size()}, nullptr, products);
  DeviceBuffer<char> wsb(cuda::gdn_backward_workspace_bytes(rc.plan, nv, dk, dv));
  DeviceBuffer<bf16> g_q(rc.q.size()), g_k(rc.k.size()), g_v(rc.v.size());
  DeviceBuffer<float> g_g(rc.g.size()), g_b(rc.beta.size());
  cuda::gdn_backward(g_q.data(), g_k.data(), g_v.data(), g_g.data(), g_b.data(), with_init ? d_di.data() : nullptr,
                     d_dO.data(), with_dE ? d_dE.data() : nullptr, rc.d_q.data(), rc.d_k.data(), rc.d_v.data(),
                     rc.d_g.data(), rc.d_b.data(), with_init ? d_init.data() : nullptr, rc.plan, nk, nv, dk, dv,
                     rc.scale, cuda::Workspace{wsb.data(), wsb.size()}, nullptr, /*accumulate=*/false, products);
  sync_and_check();
  const double e_o = rel_l2(to_host(d_o), ref.o), e_end = rel_l2(to_host(d_end), ref.end),
               e_dq = rel_l2(to_host(g_q), ref.dq), e_dk = rel_l2(to_host(g_k), ref.dk),
               e_dv = rel_l2(to_host(g_v), ref.dv), e_dg = rel_l2(to_host(g_g), ref.dg),
               e_db = rel_l2(to_host(g_b), ref.db), e_di = with_init ? rel_l2(to_host(d_di), ref.di) : 0.0;
  EXPECT_LE(e_o, b16 ? kBf16Products : kBf16U) << "o" << at;
  EXPECT_LE(e_end, b16 ? kBf16Products : 1e-4) << "end states" << at;
  expect_rule_grads(b16, e_dq, e_dk, e_dv, e_dg, e_db, at);
  EXPECT_LE(e_di, b16 ? kBf16Products : 1e-3) << "d_init" << at;
  char di[32] = "none";  // no initial states: no d_init
  if (with_init) std::snprintf(di, sizeof di, "%.2e", e_di);
  std::printf("[ errors   ] delta rule, %s%s: rel L2 o %.2e end %.2e dq %.2e dk %.2e dv %.2e dg %.2e dbeta %.2e "
              "d_init %s\n",
              what.c_str(), at.c_str(), e_o, e_end, e_dq, e_dk, e_dv, e_dg, e_db, di);
  return {d_o.to_host(), g_q.to_host(), g_g.to_host()};
}

// GdnProducts::kBf16 (one mma of bf16 operands a product in the walks) against the fp64 oracle
// within kBf16Products (gdn_cases.h), forward and backward, where its error has the longest to
// build up: a 4,096-row sequence (64 chunks) with slow decays (e^-0.001 to e^-0.021 a row: the
// state remembers ~100 to 1,000 rows) and a branch after it; kExact on the same input within its
// own bounds (end states 1e-4) for comparison, and the two modes' o, dq and dg differ (the option
// reaches the forward's and the backward's kernels).
TEST_F(GdnOps, DeltaRuleWithBf16ProductsOnALongSequence) {
  std::mt19937_64 rng(4242);
  RuleCase rc(0, 0, 0, false, rng, RuleShape{1, 2, 128, 128, 0.02, {{-1, 4096}, {0, 300}, {0, 77}}, -0.001});
  const std::vector<double> dO = randn_bf16(rng, (size_t)rc.N * rc.nv * rc.dv);
  const RuleRef ref = rule_oracle(rc, dO);
  const DeviceBuffer<bf16> d_dO = to_device_bf16(dO);
  const RuleGot exact = check_rule(rc, ref, d_dO, cuda::GdnProducts::kExact, "4,096 rows"),
                b16 = check_rule(rc, ref, d_dO, cuda::GdnProducts::kBf16, "4,096 rows");
  EXPECT_GT(bits_differ(exact.o, b16.o, exact.o.size()), 0u) << "o: the products option changes nothing";
  EXPECT_GT(bits_differ(exact.dq, b16.dq, exact.dq.size()), 0u) << "dq: the option misses the backward";
  EXPECT_GT(bits_differ(exact.dg, b16.dg, exact.dg.size()), 0u) << "dg: the option misses the backward";
}

// A pack of separate sequences and a GRPO-like group (a prompt and five answers, one of them
// branching): the bf16 walks' paths (GdnPlan::levels) side by side, the sequences' and the
// group's heaviest in the first level, the other answers in the second and third, at 64 state
// columns a lane (bf16_walk_grid), at dv 128 and 64; within the same bounds, with the same slow
// decays, from initial states at the four roots and with end-state gradients at every node (the
// reverse walk's d_init, and its node rows summed into their parents', on the GPU).
TEST_F(GdnOps, DeltaRuleWithBf16ProductsOnSeparateSequences) {
  for (const int dv : {128, 64}) {
    std::mt19937_64 rng(4343 + dv);
    RuleCase rc(0, 0, 0, false, rng,
                RuleShape{2, 4, 128, dv, 0.02,
                          {{-1, 1000}, {-1, 700}, {1, 300}, {1, 45}, {-1, 1100}, {-1, 500}, {5, 640}, {5, 600},
                           {5, 300}, {5, 640}, {9, 200}, {9, 250}, {5, 100}, {7, 200}, {7, 100}},
                          -0.001});
    ASSERT_EQ(rc.plan.num_chunks(), 110);
    ASSERT_EQ(rc.plan.levels().size(), 3u);
    ASSERT_EQ(rc.plan.levels()[0].paths, 4);
    ASSERT_EQ(rc.plan.levels()[0].max_path_chunks, 22);  // the group's prompt, answer 9 and its first branch
    ASSERT_EQ(rc.plan.levels()[1].paths, 6);
    ASSERT_EQ(rc.plan.levels()[2].paths, 1);
    ASSERT_EQ(rc.roots, 4);
    const std::vector<double> dO = randn_bf16(rng, (size_t)rc.N * rc.nv * rc.dv),
                              init = randn_f32(rng, (size_t)rc.roots * rc.state_elems(), 0.1),
                              dE = randn_f32(rng, (size_t)rc.f.nodes() * rc.state_elems(), 0.05);
    check_rule(rc, rule_oracle(rc, dO, init, dE), to_device_bf16(dO), cuda::GdnProducts::kBf16,
               "three sequences and a group side by side, dv " + std::to_string(dv));
  }
}

// The delta rule's backward against the fp64 recurrent backward on RuleCase's trees, with
// initial states and end-state gradients. Bounds, normwise relative L2: bf16 outputs 2^-7 (the
// output's rounding, 2^-9, plus the fp32 error of chunk sums of 64 to 128 terms carried through
// the state over ~300 rows and the two triangular solves, whose unit-diagonal factors stay O(1)
// for beta < 1 and unit keys: 4x headroom); d_init (fp32) 1e-3.
TEST_F(GdnOps, DeltaRuleBackwardMatchesTheRecurrentOracle) {
  // seed 9: dk 72 (see the forward test); seed 10: decays down to -6 a row, so a chunk's summed
  // decay passes -88 (e^88 overflows fp32): the kernels' decay factors must stay inside their
  // masks (a product 0 x inf would be a NaN).
  for (uint64_t seed : {6, 7, 8, 9, 10}) {
    std::mt19937_64 rng(seed * 37);
    const RuleShape shape = seed == 8    ? RuleShape{1, 3, 64, 96}
                            : seed == 9  ? RuleShape{1, 2, 72, 64}
                            : seed == 10 ? RuleShape{2, 4, 128, 128, 6.0}
                                         : RuleShape{};
    RuleCase rc(seed, 12, 40, /*extra_root=*/false, rng, shape);
    const int nk = rc.nk, nv = rc.nv, dk = rc.dk, dv = rc.dv;
    const int N = rc.N;
    const std::vector<double> dO = randn_bf16(rng, (size_t)N * nv * dv),
                              init = randn_f32(rng, (size_t)rc.roots * rc.state_elems(), 0.1),
                              dE = randn_f32(rng, (size_t)rc.f.nodes() * rc.state_elems(), 0.05);
    std::vector<double> dq(rc.q.size(), 0.0), dk_(rc.k.size(), 0.0), dv_(rc.v.size(), 0.0), dg(rc.g.size(), 0.0),
        db(rc.beta.size(), 0.0), di(init.size(), 0.0);
    cpu::gdn_tree_backward<double>(dq.data(), dk_.data(), dv_.data(), dg.data(), db.data(), di.data(), dO.data(),
                                   dE.data(), rc.q.data(), rc.k.data(), rc.v.data(), rc.g.data(), rc.beta.data(),
                                   init.data(), rc.t);
    DeviceBuffer<char> ws(cuda::gdn_backward_workspace_bytes(rc.plan, nv, dk, dv));
    auto d_dO = to_device_bf16(dO);
    auto d_init = to_device_f32(init), d_dE = to_device_f32(dE), d_di = to_device_f32(std::vector<double>(init.size()));
    DeviceBuffer<bf16> g_q(rc.q.size()), g_k(rc.k.size()), g_v(rc.v.size());
    DeviceBuffer<float> g_g(rc.g.size()), g_b(rc.beta.size());  // fp32
    for (auto* buf : {&g_q, &g_k, &g_v}) poison(*buf);
    for (auto* buf : {&g_g, &g_b}) poison(*buf);
    cuda::gdn_backward(g_q.data(), g_k.data(), g_v.data(), g_g.data(), g_b.data(), d_di.data(), d_dO.data(),
                       d_dE.data(), rc.d_q.data(), rc.d_k.data(), rc.d_v.data(), rc.d_g.data(), rc.d_b.data(),
                       d_init.data(), rc.plan, nk, nv, dk, dv, rc.scale, cuda::Workspace{ws.data(), ws.size()},
                       nullptr, /*accumulate=*/false);
    sync_and_check();
    const std::string at = ", seed " + std::to_string(seed);
    EXPECT_LE(rel_l2(to_host(g_q), dq), 2 * kBf16U) << "dq" << at;
    EXPECT_LE(rel_l2(to_host(g_k), dk_), 2 * kBf16U) << "dk" << at;
    EXPECT_LE(rel_l2(to_host(g_v), dv_), 2 * kBf16U) << "dv" << at;
    EXPECT_LE(rel_l2(to_host(g_g), dg), 1e-3) << "dg" << at;  // fp32 results, as d_init
    EXPECT_LE(rel_l2(to_host(g_b), db), 1e-3) << "dbeta" << at;
    EXPECT_LE(rel_l2(to_host(d_di), di), 1e-3) << "d_init" << at;
    const std::vector<bf16> q_first = g_q.to_host(), k_first = g_k.to_host(), v_first = g_v.to_host();
    std::printf("[ errors   ] delta rule backward%s: rel L2 dq %.2e dk %.2e dv %.2e dg %.2e dbeta %.2e d_init %.2e\n",
                at.c_str(), rel_l2(to_host(g_q), dq), rel_l2(to_host(g_k), dk_), rel_l2(to_host(g_v), dv_),
                rel_l2(to_host(g_g), dg), rel_l2(to_host(g_b), db), rel_l2(to_host(d_di), di));
    // Accumulating (the model's call): a second backward adds to every output, so each now holds
    // twice the oracle's gradient, within the same bounds.
    cuda::gdn_backward(g_q.data(), g_k.data(), g_v.data(), g_g.data(), g_b.data(), d_di.data(), d_dO.data(),
                       d_dE.data(), rc.d_q.data(), rc.d_k.data(), rc.d_v.data(), rc.d_g.data(), rc.d_b.data(),
                       d_init.data(), rc.plan, nk, nv, dk, dv, rc.scale, cuda::Workspace{ws.data(), ws.size()},
                       nullptr, /*accumulate=*/true);
    sync_and_check();
    auto twice = [](std::vector<double> x) {
      for (double& e : x) e *= 2;
      return x;
    };
    EXPECT_LE(rel_l2(to_host(g_q), twice(dq)), 2 * kBf16U) << "dq accumulated" << at;
    EXPECT_LE(rel_l2(to_host(g_k), twice(dk_)), 2 * kBf16U) << "dk accumulated" << at;
    EXPECT_LE(rel_l2(to_host(g_v), twice(dv_)), 2 * kBf16U) << "dv accumulated" << at;
    EXPECT_LE(rel_l2(to_host(g_g), twice(dg)), 1e-3) << "dg accumulated" << at;
    EXPECT_LE(rel_l2(to_host(g_b), twice(db)), 1e-3) << "dbeta accumulated" << at;
    EXPECT_LE(rel_l2(to_host(d_di), twice(di)), 1e-3) << "d_init accumulated" << at;
    // dq, dk and dv two bytes past a 16-byte boundary: the grad kernel's dq, dk and dv stores take
    // their one-element paths (the pair and eight-element ones store 4 and 16 bytes), with the same
    // sums in the same order, so the same bits as the first call's.
    DeviceBuffer<bf16> m_q(rc.q.size() + 1), m_k(rc.k.size() + 1), m_v(rc.v.size() + 1);
    cuda::gdn_backward(m_q.data() + 1, m_k.data() + 1, m_v.data() + 1, g_g.data(), g_b.data(), d_di.data(), d_dO.data(),
                       d_dE.data(), rc.d_q.data(), rc.d_k.data(), rc.d_v.data(), rc.d_g.data(), rc.d_b.data(),
                       d_init.data(), rc.plan, nk, nv, dk, dv, rc.scale, cuda::Workspace{ws.data(), ws.size()},
                       nullptr, /*accumulate=*/false);
    sync_and_check();
    const std::vector<bf16> q_odd = m_q.to_host(), k_odd = m_k.to_host(), v_odd = m_v.to_host();
    const std::vector<bf16> q_shifted(q_odd.begin() + 1, q_odd.end()), k_shifted(k_odd.begin() + 1, k_odd.end()),
        v_shifted(v_odd.begin() + 1, v_odd.end());
    EXPECT_EQ(bits_differ(q_first, q_shifted, q_first.size()) + bits_differ(k_first, k_shifted, k_first.size()) +
                  bits_differ(v_first, v_shifted, v_first.size()),
              0u)
        << "dq, dk, dv at a 2-byte offset differ from the aligned call's" << at;
  }
}

// A node's results must not depend on the rows packed after it: with the next node's q, k and v
// NaN, the first node's outputs, end state and input gradients are bit for bit those of an all-finite
// batch (the walks' TMA stages hold the next rows past a chunk's end; the products must not
// multiply them, not even by zero). dk 128 (TMA stages) and dk 64 (cp.async, zero-filled rows).
// gdn_emulated_test runs the same check on the CPU.
TEST_F(GdnOps, DeltaRuleNodesDoNotReadTheNextNodesRows) {
  for (const int dk : {128, 64}) {
    std::mt19937_64 rng(dk);
    RuleCase rc(0, 0, 0, false, rng, next_node_shape(dk));
    const int nk = rc.nk, nv = rc.nv, dv = rc.dv, N = rc.N, first = rc.f.len[0];
    ASSERT_EQ(rc.f.start[1], first);
    const auto d_dO = to_device_bf16(randn_bf16(rng, (size_t)N * nv * dv));
    struct Out {
      std::vector<bf16> o, dq, dk, dv;
      std::vector<float> end, dg, db;
    };
    auto run = [&] {
      Out r;
      DeviceBuffer<char> ws(cuda::gdn_forward_workspace_bytes(rc.plan, nv, dk, dv, /*end_given=*/true));
      DeviceBuffer<bf16> o((size_t)N * nv * dv);
      DeviceBuffer<float> end((size_t)rc.f.nodes() * rc.state_elems());
      cuda::gdn_forward(o.data(), end.data(), rc.d_q.data(), rc.d_k.data(), rc.d_v.data(), rc.d_g.data(),
                        rc.d_b.data(), nullptr, rc.plan, nk, nv, dk, dv, rc.scale,
                        cuda::Workspace{ws.data(), ws.size()}, nullptr);
      DeviceBuffer<char> wsb(cuda::gdn_backward_workspace_bytes(rc.plan, nv, dk, dv));
      DeviceBuffer<bf16> g_q(rc.q.size()), g_k(rc.k.size()), g_v(rc.v.size());
      DeviceBuffer<float> g_g(rc.g.size()), g_b(rc.beta.size());
      cuda::gdn_backward(g_q.data(), g_k.data(), g_v.data(), g_g.data(), g_b.data(), nullptr, d_dO.data(), nullptr,
                         rc.d_q.data(), rc.d_k.data(), rc.d_v.data(), rc.d_g.data(), rc.d_b.data(), nullptr, rc.plan,
                         nk, nv, dk, dv, rc.scale, cuda::Workspace{wsb.data(), wsb.size()}, nullptr,
                         /*accumulate=*/false);
      sync_and_check();
      r.o = o.to_host(), r.dq = g_q.to_host(), r.dk = g_k.to_host(), r.dv = g_v.to_host();
      r.end = end.to_host(), r.dg = g_g.to_host(), r.db = g_b.to_host();
      return r;
    };
    const Out finite = run();
    std::vector<double> q = rc.q, k = rc.k, v = rc.v;  // the second node's rows NaN
    std::fill(q.begin() + (size_t)first * nk * dk, q.end(), std::nan(""));
    std::fill(k.begin() + (size_t)first * nk * dk, k.end(), std::nan(""));
    std::fill(v.begin() + (size_t)first * nv * dv, v.end(), std::nan(""));
    rc.d_q = to_device_bf16(q), rc.d_k = to_device_bf16(k), rc.d_v = to_device_bf16(v);
    const Out poisoned = run();
    expect_first_node_equal(finite, poisoned, first, nk, nv, dk, dv, rc.state_elems());
  }
}

TEST_F(GdnOps, BadShapesAreErrors) {
  DeviceBuffer<bf16> x(64);
  DeviceBuffer<float> xf(64);
  DeviceBuffer<int32_t> prev(8);
  EXPECT_THROW(cuda::conv1d_silu_forward(x.data(), x.data(), x.data(), prev.data(), 8, 8, 65, nullptr), tt::Error);
  EXPECT_THROW(cuda::l2norm_forward(x.data(), nullptr, x.data(), 2, 0, 1e-6, nullptr), tt::Error);
  // The delta rule's head shapes: dk a multiple of 8 up to 128, dv a multiple of 32 up to 128, nk | nv.
  cuda::GdnPlan empty;
  auto forward = [&](int nk, int nv, int dk, int dv) {
    cuda::gdn_forward(x.data(), nullptr, x.data(), x.data(), x.data(), xf.data(), x.data(), nullptr, empty, nk, nv, dk,
                      dv, 1.0, cuda::Workspace{}, nullptr);
  };
  EXPECT_NO_THROW(forward(2, 4, 64, 96));
  EXPECT_THROW(forward(2, 4, 100, 128), tt::Error);
  EXPECT_THROW(forward(2, 4, 136, 128), tt::Error);
  EXPECT_THROW(forward(2, 4, 128, 48), tt::Error);
  EXPECT_THROW(forward(3, 4, 128, 128), tt::Error);
  // Row tensors are read 16 bytes at a time: a misaligned one is an error naming the rule, never a
  // misaligned-address fault (checked before the plan's tables are needed).
  cuda::GdnPlan one;
  const int32_t start = 0, len = 8, parent = -1;
  one.make(&start, &len, &parent, 1);
  try {
    cuda::gdn_forward(x.data(), nullptr, x.data() + 1, x.data(), x.data(), xf.data(), x.data(), nullptr, one, 2, 4,
                      64, 96, 1.0, cuda::Workspace{}, nullptr);
    ADD_FAILURE() << "a misaligned q was accepted";
  } catch (const tt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("gdn_forward: q must be 16-byte aligned"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tt::cuda_test
