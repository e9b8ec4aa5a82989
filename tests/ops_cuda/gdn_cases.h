// The delta rule's test cases, shared by gdn_test (on the GPU) and gdn_emulated_test (the same
// kernels on the CPU through the emulators): DFS-packed forests, a case's inputs drawn and
// rounded to bf16 with their fp64 reference tree (ops/cpu/gdn.h) and plan, and the bf16 bound of
// gdn_test.cc's header.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ops/cpu/gdn.h"
#include "ops/cuda/gdn.h"
#include "tests/ops_cuda/test_util.h"

namespace tt::cuda_test {

// A DFS-packed forest with its per-row positions (depths) and subtree ends (data/packing.h).
struct Forest {
  std::vector<int32_t> start, len, parent, pos, subtree_end;
  int N = 0;
  int nodes() const { return (int)start.size(); }
  void add(int p, int l) {
    start.push_back(N);
    len.push_back(l);
    parent.push_back(p);
    const int d0 = p < 0 ? 0 : pos[start[p] + len[p] - 1] + 1;
    for (int j = 0; j < l; ++j) pos.push_back(d0 + j);
    N += l;
  }
  void finish() {
    std::vector<int32_t> end(nodes());
    for (int n = nodes() - 1; n >= 0; --n) {
      end[n] = std::max(end[n], start[n] + len[n]);
      if (parent[n] >= 0) end[parent[n]] = std::max(end[parent[n]], end[n]);
    }
    subtree_end.assign(N, 0);
    for (int n = 0; n < nodes(); ++n)
      for (int j = 0; j < len[n]; ++j) subtree_end[start[n] + j] = end[n];
  }
};

// Random subtree in preorder: nodes of 1 token with probability 0.4, else 2..max_len.
inline void grow(Forest& f, std::mt19937_64& rng, int parent, int depth, int max_len, int& budget) {
  std::uniform_real_distribution<double> u(0, 1);
  std::uniform_int_distribution<int> len(2, max_len), kids(0, 3);
  f.add(parent, u(rng) < 0.4 ? 1 : len(rng));
  const int me = f.nodes() - 1;
  const int k = depth < 6 ? kids(rng) : 0;
  for (int c = 0; c < k && --budget > 0; ++c) grow(f, rng, me, depth + 1, max_len, budget);
}

inline ::testing::AssertionResult close_bf16(const std::string& name, const std::vector<double>& got,
                                             const std::vector<double>& ref) {
  double mx = 0;
  for (double r : ref) mx = std::max(mx, std::fabs(r));
  ::testing::AssertionResult a = all_within(name, got, ref, kBf16U, {mx / 1024});
  if (!a) return a;
  const double e = rel_l2(got, ref);
  if (e > kBf16U) return ::testing::AssertionFailure() << name << ": normwise relative error " << e;
  return ::testing::AssertionSuccess() << name << ": normwise " << e;
}

// The bound of the delta rule's outputs with cuda::GdnProducts::kBf16, normwise relative L2 for
// each (o, end states, every gradient): each product's operands are rounded to bf16 (2^-9 each,
// so 2^-8 of the product's terms), doubled for the error the state carries from chunk to chunk
// (the delta rule's update contracts it: no chunk's error is amplified): 2^-7.
constexpr double kBf16Products = 2 * kBf16U;

// The delta rule's backward errors (normwise relative L2 against the oracle) within their bounds:
// the bf16 outputs (dq, dk, dv) 2 x 2^-8 and the fp32 ones (dg, dbeta) 1e-3 with exact products,
// each kBf16Products with bf16 products.
inline void expect_rule_grads(bool bf16_products, double dq, double dk, double dv, double dg, double dbeta,
                              const std::string& at) {
  const double out16 = bf16_products ? kBf16Products : 2 * kBf16U, out32 = bf16_products ? kBf16Products : 1e-3;
  EXPECT_LE(dq, out16) << "dq" << at;
  EXPECT_LE(dk, out16) << "dk" << at;
  EXPECT_LE(dv, out16) << "dv" << at;
  EXPECT_LE(dg, out32) << "dg" << at;
  EXPECT_LE(dbeta, out32) << "dbeta" << at;
}

// The row ops' forest (one row whose conv input gradient gathers from many branches).
inline Forest awkward_forest(uint64_t seed) {
  std::mt19937_64 rng(seed);
  Forest f;
  // A deep chain of one-token nodes ending in a fan of 9 short leaves.
  f.add(-1, 3);
  for (int i = 0; i < 12; ++i) f.add(f.nodes() - 1, 1);
  const int hub = f.nodes() - 1;
  for (int i = 0; i < 9; ++i) f.add(hub, 1 + i % 3);
  // Random trees.
  for (int t = 0; t < 3; ++t) {
    int budget = 25;
    grow(f, rng, -1, 0, 70, budget);
  }
  f.finish();
  return f;
}

// fp32 sums over rows (dw, dA_log, ddt_bias): normwise relative L2 <= 1e-4 (gdn_test.cc's header).
inline ::testing::AssertionResult close_f32_sum(const std::string& name, const std::vector<double>& got,
                                                const std::vector<double>& ref) {
  const double e = rel_l2(got, ref);
  if (e > 1e-4) return ::testing::AssertionFailure() << name << ": normwise relative error " << e;
  return ::testing::AssertionSuccess() << name << ": normwise " << e;
}

// The row ops' cases (gdn_test's and gdn_emulated_test's): inputs drawn and rounded to bf16 in a
// fixed order, then their fp64 references (ops/cpu/gdn.h); each test runs only its backend.

// path_prev and the conv1d + SiLU on awkward_forest(seed), C 40 channels, kernel widths 4
// (Qwen3.5's), 6 and 20 for seeds 1, 2 and 3 (the weight gradient's 4, 8 and 64-tap register
// variants): the forward, the input gradient added to dx0 (dx) and alone (dx_only), dw added to dw0.
struct ConvCase {
  Forest f;
  int N, C = 40, K;
  std::vector<int32_t> prev;
  std::vector<double> x, w, dout, dx0, dw0;
  std::vector<double> out, dx, dw, dx_only;  // the references

  explicit ConvCase(uint64_t seed) : f(awkward_forest(seed)), N(f.N), K(seed == 1 ? 4 : seed == 2 ? 6 : 20) {
    prev.resize(N);
    cpu::path_prev(prev.data(), f.start.data(), f.len.data(), f.parent.data(), f.nodes(), N);
    std::mt19937_64 rng(seed + 40);
    x = randn_bf16(rng, (size_t)N * C), w = randn_bf16(rng, (size_t)C * K, 0.5);
    dout = randn_bf16(rng, (size_t)N * C), dx0 = randn_bf16(rng, (size_t)N * C);
    dw0 = randn_f32(rng, (size_t)C * K);
    out.resize((size_t)N * C);
    cpu::conv1d_silu_forward<double>(out.data(), x.data(), w.data(), prev.data(), N, C, K);
    dx = dx0, dw = dw0;
    cpu::conv1d_silu_backward<double>(dx.data(), dw.data(), dout.data(), x.data(), w.data(), prev.data(), N, C, K);
    dx_only.assign((size_t)N * C, 0.0);
    cpu::conv1d_silu_backward<double>(dx_only.data(), nullptr, dout.data(), x.data(), w.data(), prev.data(), N, C,
                                      K);
  }
};

// The L2 norm and the gated RMSNorm on 300 rows of 128, eps 1e-6: forward (y, rstd) and backward
// (dx added to dx0; the gated norm's dz added to dz0 and dw to dw0).
struct NormsCase {
  static constexpr int rows = 300, D = 128;
  static constexpr double eps = 1e-6;
  std::vector<double> x, z, w, dy, dx0, dz0, dw0;
  std::vector<double> l2_y, l2_rstd, l2_dx, gated_y, gated_rstd, gated_dx, gated_dz, gated_dw;  // the references

  NormsCase() {
    std::mt19937_64 rng(7);
    x = randn_bf16(rng, (size_t)rows * D), z = randn_bf16(rng, (size_t)rows * D), w = randn_bf16(rng, D, 0.5);
    dy = randn_bf16(rng, (size_t)rows * D), dx0 = randn_bf16(rng, (size_t)rows * D);
    dz0 = randn_bf16(rng, (size_t)rows * D);
    dw0 = randn_f32(rng, D);
    l2_y.resize((size_t)rows * D), l2_rstd.resize(rows);
    cpu::l2norm_forward<double>(l2_y.data(), l2_rstd.data(), x.data(), rows, D, eps);
    l2_dx = dx0;
    cpu::l2norm_backward<double>(l2_dx.data(), dy.data(), x.data(), l2_rstd.data(), rows, D);
    gated_y.resize((size_t)rows * D), gated_rstd.resize(rows);
    cpu::gated_rmsnorm_forward<double>(gated_y.data(), gated_rstd.data(), x.data(), z.data(), w.data(), rows, D, eps);
    gated_dx = dx0, gated_dz = dz0, gated_dw = dw0;
    cpu::gated_rmsnorm_backward<double>(gated_dx.data(), gated_dz.data(), gated_dw.data(), dy.data(), x.data(),
                                        z.data(), w.data(), gated_rstd.data(), rows, D);
  }
};

// The gates on 333 rows of 12 heads: g (fp32 log decays) and beta; da, db, and dA_log and
// ddt_bias added to dA0 and ddt0.
struct GatesCase {
  static constexpr int N = 333, H = 12;
  std::vector<double> a, b, A_log, dt_bias, dg, dbeta, dA0, ddt0;
  std::vector<double> g, beta, da, db, dA, ddt;  // the references

  GatesCase() {
    std::mt19937_64 rng(9);
    a = randn_bf16(rng, (size_t)N * H, 2.0), b = randn_bf16(rng, (size_t)N * H, 2.0);
    A_log = randn_bf16(rng, H, 1.0), dt_bias = randn_bf16(rng, H, 1.0);
    dg = randn_f32(rng, (size_t)N * H), dbeta = randn_f32(rng, (size_t)N * H);
    dA0 = randn_f32(rng, H), ddt0 = randn_f32(rng, H);
    g.resize((size_t)N * H), beta.resize((size_t)N * H);
    cpu::gdn_gates_forward<double>(g.data(), beta.data(), a.data(), b.data(), A_log.data(), dt_bias.data(), N, H);
    da.resize((size_t)N * H), db.resize((size_t)N * H), dA = dA0, ddt = ddt0;
    cpu::gdn_gates_backward<double>(da.data(), db.data(), dA.data(), ddt.data(), dg.data(), dbeta.data(), a.data(),
                                    b.data(), A_log.data(), dt_bias.data(), N, H);
  }
};

// A delta-rule case: a forest of nodes of 1 to 150 rows (several chunks, a chunk ending exactly
// at 64, one-token nodes) plus a random subtree of `budget` nodes up to `max_len` rows, grouped key
// heads (nk 2, nv 4 unless the shape says otherwise), head dims 128; q and k L2-normalised per
// head, decays in [-0.62, -0.02] (or as the shape says), beta in [0.05, 0.95], all rounded to bf16
// (drawn from `rng` in that order); the fp64 reference's tree and the plan (not uploaded). A shape
// with a forest of its own replaces the forest above (seed, budget, max_len and extra_root then
// play no part).
struct RuleShape {
  int nk = 2, nv = 4, dk = 128, dv = 128;
  double decay_span = 0.6;  // decays in [decay_top - decay_span, decay_top]
  std::vector<std::pair<int, int>> forest;  // (parent, rows) of every node in packed order; empty: the above
  double decay_top = -0.02;
};

struct RuleInputs {
  int nk, nv, dk, dv;
  Forest f;
  int N = 0, roots = 0;
  double scale;
  std::vector<double> q, k, v, g, beta;
  cpu::GdnTree t;  // points into f
  cuda::GdnPlan plan;

  RuleInputs(uint64_t seed, int budget, int max_len, bool extra_root, std::mt19937_64& rng, RuleShape shape = {})
      : nk(shape.nk), nv(shape.nv), dk(shape.dk), dv(shape.dv), scale(1.0 / std::sqrt((double)shape.dk)) {
    const double decay_span = shape.decay_span, decay_top = shape.decay_top;
    if (!shape.forest.empty()) {
      for (const auto& [parent, rows] : shape.forest) f.add(parent, rows);
    } else {
      f.add(-1, 150);
      f.add(0, 64);
      f.add(1, 1);
      f.add(0, 1);
      f.add(3, 70);
      std::mt19937_64 grow_rng(seed);
      grow(f, grow_rng, -1, 0, max_len, budget);
      if (extra_root) f.add(-1, 2);
    }
    f.finish();
    N = f.N;
    roots = (int)std::count(f.parent.begin(), f.parent.end(), -1);
    auto normed = [&](int heads, int d) {  // L2-normalised per head, then rounded to bf16
      std::vector<double> x = randn_bf16(rng, (size_t)N * heads * d);
      for (size_t r = 0; r < (size_t)N * heads; ++r) {
        double ss = 0;
        for (int i = 0; i < d; ++i) ss += x[r * d + i] * x[r * d + i];
        for (int i = 0; i < d; ++i) x[r * d + i] = tt::cuda::round_to_bf16((float)(x[r * d + i] / std::sqrt(ss)));
      }
      return x;
    };
    q = normed(nk, dk);
    k = normed(nk, dk);
    v = randn_bf16(rng, (size_t)N * nv * dv);
    std::uniform_real_distribution<double> u(0, 1);
    g.resize((size_t)N * nv);
    beta.resize((size_t)N * nv);
    for (double& x : g) x = tt::cuda::round_to_bf16((float)(decay_top - decay_span * u(rng)));
    for (double& x : beta) x = tt::cuda::round_to_bf16((float)(0.05 + 0.9 * u(rng)));
    t.node_start = f.start.data();
    t.node_len = f.len.data();
    t.node_parent = f.parent.data();
    t.num_nodes = f.nodes();
    t.N = N;
    t.nk = nk, t.nv = nv, t.dk = dk, t.dv = dv;
    t.scale = scale;
    plan.make(f.start.data(), f.len.data(), f.parent.data(), f.nodes());
  }
  RuleInputs(const RuleInputs&) = delete;  // t points into f
  RuleInputs& operator=(const RuleInputs&) = delete;
  size_t state_elems() const { return (size_t)nv * dk * dv; }
};

// How many of the first n elements of a and b differ in their bits.
template <class T>
size_t bits_differ(const std::vector<T>& a, const std::vector<T>& b, size_t n) {
  size_t differ = 0;
  for (size_t i = 0; i < n; ++i) differ += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return differ;
}

// The next-node check (gdn_test's and gdn_emulated_test's NodesDoNotReadTheNextNodesRows): a
// first node of 100 rows (two chunks, so the reverse walk's leak would reach its first chunk's
// gradients) and a second root of 30, value head dim 64.
inline RuleShape next_node_shape(int dk) { return RuleShape{1, 2, dk, 64, 0.6, {{-1, 100}, {-1, 30}}}; }

// Outputs of the first `first` rows of two runs (a forward with end states, a backward; structs
// with o, dq, dk, dv, dg, db and end), the first node's end state, bit for bit.
template <class Out>
void expect_first_node_equal(const Out& a, const Out& b, int first, int nk, int nv, int dk, int dv,
                             size_t state_elems) {
  const std::string at = " of the first node, dk " + std::to_string(dk);
  EXPECT_EQ(bits_differ(a.o, b.o, (size_t)first * nv * dv), 0u) << "o" << at;
  EXPECT_EQ(bits_differ(a.dq, b.dq, (size_t)first * nk * dk), 0u) << "dq" << at;
  EXPECT_EQ(bits_differ(a.dk, b.dk, (size_t)first * nk * dk), 0u) << "dk" << at;
  EXPECT_EQ(bits_differ(a.dv, b.dv, (size_t)first * nv * dv), 0u) << "dv" << at;
  EXPECT_EQ(bits_differ(a.dg, b.dg, (size_t)first * nv), 0u) << "dg" << at;
  EXPECT_EQ(bits_differ(a.db, b.db, (size_t)first * nv), 0u) << "dbeta" << at;
  EXPECT_EQ(bits_differ(a.end, b.end, state_elems), 0u) << "end state" << at;
}

}  // namespace tt::cuda_test
